package migrate

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/fencelock/fencelock/driver"
)

// TokenReport says what CopyTokens did.
type TokenReport struct {
	// Keys is how many per-key marks the source listed.
	Keys int
	// Max is the highest token the source has issued (its global mark, or
	// its largest per-key mark).
	Max driver.Token
	// Global reports whether the destination's global floor was raised to
	// Max (destinations with a store-wide sequence, like PostgreSQL).
	Global bool
	// Raised is how many per-key floors were raised on the destination
	// (every listed key when the destination has no global floor).
	Raised int
	// Warnings lists what the copy could not guarantee.
	Warnings []string
}

// CopyTokens raises to's token floors above every token from has issued
// for the keys starting with prefix ("" for all), so that no token to
// issues afterwards is at or below one a downstream fence may have seen
// from from. When to has a global floor (RaiseFloor with key ""), it is
// raised to from's highest mark, which also covers keys from no longer
// lists; otherwise each listed key's floor is raised to its own mark.
//
// CopyTokens never lowers anything, so it is idempotent and safe to re-run,
// also while locks are held on either side: a held lock keeps its token,
// the next grant is above the floor. A key locked on from after the copy
// started may not be covered: run it once more after the last client has
// left from (see docs/migration.md). Both backends must implement
// driver.TokenFloorer (errors match ErrNoFloor otherwise).
func CopyTokens(ctx context.Context, from, to driver.Backend, prefix string) (TokenReport, error) {
	src, ok := from.(driver.TokenFloorer)
	if !ok {
		return TokenReport{}, fmt.Errorf("%w: source %s", ErrNoFloor, nameOf(from))
	}
	dst, ok := to.(driver.TokenFloorer)
	if !ok {
		return TokenReport{}, fmt.Errorf("%w: destination %s", ErrNoFloor, nameOf(to))
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return TokenReport{}, err
	}
	hw, err := src.HighWater(ctx, prefix)
	if err != nil {
		return TokenReport{}, fmt.Errorf("migrate: reading the source's high-water marks: %w", err)
	}
	rep := TokenReport{Keys: len(hw.Keys), Max: hw.Max()}
	if rep.Max == 0 {
		return rep, nil
	}
	switch err := dst.RaiseFloor(ctx, "", rep.Max); {
	case err == nil:
		rep.Global = true
		return rep, nil
	case !errors.Is(err, driver.ErrUnsupported):
		return rep, fmt.Errorf("migrate: raising the destination's global token floor to %d: %w", rep.Max, err)
	}
	var keysMax driver.Token
	for _, t := range hw.Keys {
		keysMax = max(keysMax, t)
	}
	if hw.Global > keysMax {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf(
			"the source's store-wide mark %d is above every key it lists (%d): it issued tokens for keys it no longer lists (swept rows), and the destination has no global floor, so such keys get no floor here; a key locked once through the dual backend (phase 2) gets its floor lifted above %d", hw.Global, keysMax, hw.Global))
	}
	keys := make([]string, 0, len(hw.Keys))
	for k := range hw.Keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := dst.RaiseFloor(ctx, k, hw.Keys[k]); err != nil {
			return rep, fmt.Errorf("migrate: raising the destination's token floor of %q to %d (after %d of %d keys; re-run to finish): %w", k, hw.Keys[k], rep.Raised, len(keys), err)
		}
		rep.Raised++
	}
	return rep, nil
}
