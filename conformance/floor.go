package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

func testTokenFloor(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	b := s.backend(t)
	f, ok := b.(driver.TokenFloorer)
	if !ok {
		t.Skip("capability TokenFloorer not implemented by this backend: case not run")
	}
	key := s.key(t, "floor")
	prefix := key[:len(key)-len("floor")]

	// The high-water mark covers a released key's last token.
	g := rawAcquire(t, ctx, b, key, s.h.TTL)
	if err := b.Release(ctx, g); err != nil {
		t.Fatalf("Release: %v", err)
	}
	hw, err := f.HighWater(ctx, prefix)
	if err != nil {
		t.Fatalf("HighWater: %v", err)
	}
	if got := hw.Keys[key]; got < g.Token && hw.Global < g.Token {
		t.Fatalf("HighWater(%q) = key %d, global %d: below the token %d issued for %q", prefix, got, hw.Global, g.Token, key)
	}
	for k := range hw.Keys {
		if len(k) < len(prefix) || k[:len(prefix)] != prefix {
			t.Fatalf("HighWater(%q) lists %q, which does not start with the prefix", prefix, k)
		}
	}

	// A held lock keeps its token while its floor is raised; the next
	// grant is above the floor.
	held := rawAcquire(t, ctx, b, key, s.h.TTL)
	floor := max(hw.Max(), held.Token) + 1000
	if err := f.RaiseFloor(ctx, key, floor); err != nil {
		t.Fatalf("RaiseFloor(%q, %d): %v", key, floor, err)
	}
	if info, err := b.Inspect(ctx, key); err != nil || info.Token != held.Token || info.Owner != held.Owner {
		t.Fatalf("after RaiseFloor, Inspect = %+v, %v; want the holder %q with its token %d unchanged", info, err, held.Owner, held.Token)
	}
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("Release of the lock held while the floor rose: %v", err)
	}
	next := rawAcquire(t, ctx, b, key, s.h.TTL)
	if next.Token <= floor {
		t.Fatalf("token %d issued after RaiseFloor(%q, %d): must be above the floor", next.Token, key, floor)
	}
	if err := b.Release(ctx, next); err != nil {
		t.Fatal(err)
	}
	if hw, err := f.HighWater(ctx, prefix); err != nil || (hw.Keys[key] < next.Token && hw.Global < next.Token) {
		t.Fatalf("HighWater after the raise = %+v, %v: below the token %d", hw, err, next.Token)
	}

	// Lowering is a no-op, and re-running is idempotent.
	for _, lower := range []driver.Token{1, floor} {
		if err := f.RaiseFloor(ctx, key, lower); err != nil {
			t.Fatalf("RaiseFloor(%q, %d) below the current mark: %v", key, lower, err)
		}
	}
	again := rawAcquire(t, ctx, b, key, s.h.TTL)
	if again.Token <= next.Token {
		t.Fatalf("after a lower RaiseFloor, token %d is not above the previous %d: a floor never goes down", again.Token, next.Token)
	}
	if err := b.Release(ctx, again); err != nil {
		t.Fatal(err)
	}

	// Bad input is rejected with a typed error.
	if err := f.RaiseFloor(ctx, "bad\x00key", floor); !errors.Is(err, driver.ErrInvalidKey) {
		t.Fatalf("RaiseFloor with a control character in the key = %v, want ErrInvalidKey", err)
	}
	if _, err := f.HighWater(ctx, "bad\x00prefix"); !errors.Is(err, driver.ErrInvalidKey) {
		t.Fatalf("HighWater with a control character in the prefix = %v, want ErrInvalidKey", err)
	}

	// A global floor, where the backend has one, covers keys never used.
	global := again.Token + 1000
	switch err := f.RaiseFloor(ctx, "", global); {
	case errors.Is(err, driver.ErrUnsupported):
		t.Log("backend has no global floor (RaiseFloor(\"\") = ErrUnsupported): per-key floors only")
	case err != nil:
		t.Fatalf("RaiseFloor(\"\", %d): %v", global, err)
	default:
		fresh := s.key(t, "fresh")
		g := rawAcquire(t, ctx, b, fresh, s.h.TTL)
		if g.Token <= global {
			t.Fatalf("token %d for a new key after the global floor %d: must be above it", g.Token, global)
		}
		if err := b.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("RaisedBetweenHolders", func(t *testing.T) { testFloorBetweenHolders(t, s) })
	t.Run("ConcurrentRaises", func(t *testing.T) { testFloorConcurrentRaises(t, s) })
	t.Run("SeenByAcquireWithLockDelay", func(t *testing.T) { testFloorLockDelay(t, s) })
}

// testFloorLockDelay: a floor raised through one backend holds for an
// acquire with a lock delay through another, which reads and writes more
// than a plain acquire (the delay's record), on a backend that has read
// no floor yet and on one that has: each grant's token is above the
// floor raised before it.
func testFloorLockDelay(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "delay")
	raiser := s.backend(t).(driver.TokenFloorer)
	b := s.backend(t)
	var floor driver.Token = 1 << 40
	for round := range 3 {
		if err := raiser.RaiseFloor(ctx, key, floor); err != nil {
			t.Fatalf("RaiseFloor(%q, %d): %v", key, floor, err)
		}
		req := driver.AcquireRequest{Key: key, Owner: fmt.Sprintf("floor-delay-%d-%s", round, randHex()), TTL: s.h.TTL, LockDelay: s.h.TTL}
		g, err := grantWaiting(ctx, b, round == 2, req)
		if errors.Is(err, driver.ErrUnsupported) {
			t.Skipf("lock delay not supported by this backend: %v", err)
		}
		if err != nil {
			t.Fatalf("round %d: acquire with a lock delay: %v", round, err)
		}
		if g.Token <= floor {
			t.Errorf("round %d: token %d granted with a lock delay after RaiseFloor(%q, %d): must be above the floor", round, g.Token, key, floor)
		}
		if err := b.Release(ctx, g); err != nil {
			t.Fatalf("Release: %v", err)
		}
		floor = max(floor, g.Token) + 1<<20
	}
}

// testFloorBetweenHolders: contenders, each on a backend of its own, take
// one key in turn (half of them queued in the store, where the backend is
// a driver.Waiter, the others polling with Acquire); each holder raises the key's floor above its own token
// through its backend before it releases, as the dual backend of a
// migration does. The next holder's token (after the confirming Renew, as
// the engine does it) must be above the previous holder's and above every
// floor raised before the previous holder's release: the handover to a
// waiter that queued before the raise included.
func testFloorBetweenHolders(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "handover")
	const contenders, rounds = 3, 8
	var (
		mu         sync.Mutex
		last       driver.Token // the last holder's token
		floorBelow driver.Token // the highest floor raised before the last release
		holders    int
		failed     []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failed = append(failed, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for c := range contenders {
		b := s.backend(t)
		f, ok := b.(driver.TokenFloorer)
		if !ok {
			t.Fatal("a second backend of the same harness is not a TokenFloorer")
		}
		owner := fmt.Sprintf("floor-contender-%d-%s", c, randHex())
		wg.Go(func() {
			for r := range rounds {
				md := []byte(fmt.Sprintf("contender %d round %d", c, r))
				g, err := grantWaiting(ctx, b, c%2 == 0, driver.AcquireRequest{Key: key, Owner: owner, TTL: 3 * s.h.TTL, Metadata: md})
				if err != nil {
					fail("contender %d round %d: acquire: %v", c, r, err)
					return
				}
				if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: 3 * s.h.TTL}); err != nil {
					fail("contender %d round %d: confirming Renew: %v", c, r, err)
					return
				}
				mu.Lock()
				if g.Token <= last || g.Token <= floorBelow {
					failed = append(failed, fmt.Sprintf("contender %d round %d: token %d; the previous holder had %d and raised the floor to %d before releasing", c, r, g.Token, last, floorBelow))
				}
				last = g.Token
				holders++
				mu.Unlock()
				floor := g.Token + 500
				if err := f.RaiseFloor(ctx, key, floor); err != nil {
					fail("contender %d round %d: RaiseFloor(%d) while holding: %v", c, r, floor, err)
				}
				if info, err := b.Inspect(ctx, key); err != nil || info.Token != g.Token || info.Owner != owner || string(info.Metadata) != string(md) {
					fail("contender %d round %d: Inspect after the raise = %+v, %v; want token %d of %q with metadata %q (a grant re-issued above a floor keeps its metadata)", c, r, info, err, g.Token, owner, md)
				}
				mu.Lock()
				floorBelow = max(floorBelow, floor)
				mu.Unlock()
				if err := b.Release(ctx, g); err != nil {
					fail("contender %d round %d: Release: %v", c, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, f := range failed {
		t.Error(f)
	}
	if holders != contenders*rounds && len(failed) == 0 {
		t.Fatalf("%d grants, want %d", holders, contenders*rounds)
	}
}

// grantWaiting takes key, queued in the store if queue is set and b is a
// driver.Waiter, else by polling with Acquire.
func grantWaiting(ctx context.Context, b driver.Backend, queue bool, req driver.AcquireRequest) (driver.Grant, error) {
	if w, ok := b.(driver.Waiter); ok && queue {
		return w.AcquireWait(ctx, req)
	}
	for {
		g, err := b.Acquire(ctx, req)
		if !errors.Is(err, driver.ErrNotAcquired) {
			return g, err
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return driver.Grant{}, ctx.Err()
		case <-t.C:
		}
	}
}
