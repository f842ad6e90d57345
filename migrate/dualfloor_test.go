package migrate_test

import (
	"math"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/migrate"
)

// TestDualPerKeyCountersAndEtcd runs a Dual of per-key counters (memory,
// as PostgreSQL keeps them) and etcd (one global revision plus an offset)
// for 500 acquires over a few keys, some of whose counters start ahead of
// etcd, with rotations and a re-run of the token copy every few acquires
// (what `migrate tokens` does when run again). Every level raise and
// every copy must succeed, the dual tokens of a key strictly increase and
// stay far from 2^62, and afterwards each side on its own issues tokens
// above the last dual one. A raise to just above the tokens a side issues
// already must not grow its offset: if it does, the etcd floors run into
// 2^62 within about sixty raises and every dual Acquire fails.
func TestDualPerKeyCountersAndEtcd(t *testing.T) {
	ctx := t.Context()
	const rounds, ttl = 500, 10 * time.Second
	old := memory.New()
	eb, _, err := fencelock.OpenBackend(ctx, etcdSide.url(t))
	if err != nil {
		t.Fatal(err)
	}
	efl := eb.(driver.TokenFloorer)
	hw, err := efl.HighWater(ctx, "")
	if err != nil {
		eb.Close()
		t.Fatal(err)
	}
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	// Half the keys' counters start ahead of etcd's tokens, by different
	// amounts; the others behind.
	for i, k := range keys {
		at := hw.Max()/2 + driver.Token(i)
		if i%2 == 1 {
			at = hw.Max() + driver.Token(1000*i)
		}
		if err := old.RaiseFloor(ctx, k, at); err != nil {
			eb.Close()
			t.Fatal(err)
		}
	}
	d := mustDual(t, old, eb)
	defer d.Close()
	last := make(map[string]driver.Token)
	var first driver.Token
	for r := range rounds {
		k := keys[r%len(keys)]
		g, err := d.Acquire(ctx, driver.AcquireRequest{Key: k, Owner: "dual", TTL: ttl})
		if err != nil {
			t.Fatalf("round %d: dual Acquire(%s): %v", r, k, err)
		}
		if g.Token <= last[k] {
			t.Fatalf("round %d: dual token %d for %s, not above the previous %d", r, g.Token, k, last[k])
		}
		if r == 0 {
			first = g.Token
		}
		last[k] = g.Token
		if r%7 == 3 {
			rg, err := d.Renew(ctx, g, driver.RenewRequest{TTL: ttl, Rotate: true})
			if err != nil {
				t.Fatalf("round %d: rotation: %v", r, err)
			}
			if rg.Token <= g.Token {
				t.Fatalf("round %d: rotated token %d, not above %d", r, rg.Token, g.Token)
			}
			g = rg
			last[k] = g.Token
		}
		if err := d.Release(ctx, g); err != nil {
			t.Fatalf("round %d: Release: %v", r, err)
		}
		if r%5 == 4 {
			if _, err := migrate.CopyTokens(ctx, old, eb, ""); err != nil {
				t.Fatalf("round %d: re-running the token copy: %v", r, err)
			}
		}
	}
	var top driver.Token
	for _, k := range keys {
		top = max(top, last[k])
		for name, side := range map[string]driver.Backend{"memory": old, "etcd": eb} {
			g, err := side.Acquire(ctx, driver.AcquireRequest{Key: k, Owner: name + "-only", TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			if g.Token <= last[k] {
				t.Errorf("%s-only token %d for %s, not above the last dual token %d", name, g.Token, k, last[k])
			}
			if err := side.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
		}
	}
	if top > math.MaxInt64/4 || top-first > 1<<40 {
		t.Fatalf("after %d dual acquires, tokens went from %d to %d", rounds, first, top)
	}
}
