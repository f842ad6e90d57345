package redis

import (
	"context"
	"math"
	"strconv"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.TokenFloorer = (*Backend)(nil)

// maxFloor bounds RaiseFloor: 2^63-1 is the largest integer Redis holds
// (and the largest PostgreSQL bigint), so a floor there would leave no
// token to issue. The scripts never hold a token in a Lua number, so every
// token below it is exact.
const maxFloor = math.MaxInt64

// HighWater implements driver.TokenFloorer: SCAN MATCH over the token
// counters under prefix (on a Cluster, over every primary), read in one
// pipeline of GETs per page. Counters never expire, so every key ever
// locked is listed, unless the data was flushed, evicted or lost in a
// crash without appendfsync always. Global is zero: Redis keeps one
// counter per key and no store-wide mark.
func (b *Backend) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if err := b.check(ctx); err != nil {
		return driver.HighWater{}, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return driver.HighWater{}, err
	}
	pattern := b.ks.counterPattern(prefix)
	var mu sync.Mutex
	hw := driver.HighWater{Keys: make(map[string]driver.Token)}
	err := forEachPrimary(ctx, b.c, func(ctx context.Context, c goredis.Cmdable) error {
		var cursor uint64
		for {
			names, next, err := c.Scan(ctx, cursor, pattern, scanCount).Result()
			if err != nil {
				return err
			}
			var keys []string
			var cmds []*goredis.StringCmd
			pipe := c.Pipeline()
			for _, name := range names {
				if k, ok := b.ks.keyOfCounter(name); ok {
					keys = append(keys, k)
					cmds = append(cmds, pipe.Get(ctx, name))
				}
			}
			if len(cmds) > 0 {
				if _, err := pipe.Exec(ctx); err != nil && err != goredis.Nil {
					return err
				}
				for i, cmd := range cmds {
					v, err := cmd.Uint64()
					if err == goredis.Nil {
						continue // deleted since SCAN saw it
					}
					if err != nil {
						return err
					}
					mu.Lock()
					hw.Keys[keys[i]] = max(hw.Keys[keys[i]], driver.Token(v))
					mu.Unlock()
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	})
	if err != nil {
		return driver.HighWater{}, err
	}
	return hw, nil
}

// RaiseFloor implements driver.TokenFloorer for one key: floor.lua sets
// the key's counter to floor if it is below, atomically, so the next INCR
// is above it. There is no global floor (key "" returns
// driver.ErrUnsupported): raise the keys the old backend lists, one by
// one, as fencelock/migrate.CopyTokens does.
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
		return &driver.InvalidOptionError{Option: "token floor", Value: strconv.FormatUint(uint64(floor), 10), Reason: "must be below 2^63-1, the largest integer Redis holds"}
	}
	if floor == 0 {
		return nil
	}
	_, counter, _ := b.ks.names(key)
	return floorScript.Run(ctx, b.c, []string{counter}, strconv.FormatUint(uint64(floor), 10)).Err()
}
