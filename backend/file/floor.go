//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package file

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.TokenFloorer = (*Backend)(nil)

// maxFloor bounds RaiseFloor: tokens are kept below 2^63-1 so that they
// fit a signed 64-bit column (and the largest PostgreSQL bigint), with
// room for the next token above the floor.
const maxFloor = math.MaxInt64

// HighWater implements driver.TokenFloorer: Keys holds every key under
// prefix whose state file is in the directory, with its "last" counter (the
// highest token issued for it, or the floor RaiseFloor set, if higher),
// held or not. Files are read under a shared flock, like List. Global is
// zero: the counters are per key (tokens of a key whose file was removed
// continue from the wall-clock floor, which no mark here can cover).
func (b *Backend) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if err := b.check(ctx); err != nil {
		return driver.HighWater{}, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return driver.HighWater{}, err
	}
	entries, err := os.ReadDir(b.dir)
	if err != nil {
		return driver.HighWater{}, fmt.Errorf("file: %w", err)
	}
	hw := driver.HighWater{Keys: make(map[string]driver.Token)}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || len(name) != 2*sha256.Size || !e.Type().IsRegular() {
			continue
		}
		if err := ctx.Err(); err != nil {
			return driver.HighWater{}, err
		}
		s, err := b.loadAny(ctx, name)
		if err != nil {
			return driver.HighWater{}, err
		}
		if s.Last != 0 && strings.HasPrefix(s.Key, prefix) {
			hw.Keys[s.Key] = driver.Token(s.Last)
		}
	}
	return hw, nil
}

// RaiseFloor implements driver.TokenFloorer for one key: under the key's
// exclusive flock, its "last" counter is set to floor if it is below (never
// lowered), and synced to disk like any issued token (unless NoSync). The
// next token is then max(floor+1, wall-clock µs). A key never used gets
// its file, holding only the counter. A held lock keeps its token. There
// is no global floor (key "" returns driver.ErrUnsupported): raise the
// keys one by one, as fencelock/migrate.CopyTokens does.
func (b *Backend) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if key == "" {
		return driver.ErrUnsupported
	}
	if err := driver.ValidateKey(key); err != nil {
		return err
	}
	if floor >= maxFloor {
		return &driver.InvalidOptionError{Option: "token floor", Value: strconv.FormatUint(uint64(floor), 10), Reason: "must be below 2^63-1, the largest signed 64-bit integer"}
	}
	if floor == 0 {
		return nil
	}
	return b.update(ctx, key, true, func(s *state, _ reading) (bool, error) {
		if s.Last >= uint64(floor) {
			return false, nil
		}
		s.Last = uint64(floor)
		return true, nil
	})
}
