package conformance

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// testFloorConcurrentRaises (a part of TokenFloorHolds): contenders on backends of their own take one
// key in turn (queued in the store where it can queue, else polling, and
// rotating now and then) while raisers on other backends raise the key's
// and the global floor and read the high-water mark. Checked at every
// grant: the token is above every floor whose RaiseFloor returned before
// the acquire began, above the previous holder's last token (rotations
// included), below 2^63, the same in Inspect on every backend, and a
// pre-rotation token is refused; every HighWater is at least every token
// issued before it was called.
func testFloorConcurrentRaises(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "floor")
	prefix := strings.TrimSuffix(key, "floor")
	// No holder crashes here: a long TTL keeps slow rounds from expiring.
	ttl := max(5*time.Second, s.h.TTL)
	// A raise adds at most its floor minus the current tokens to a
	// backend's offset: a bounded number of raises keeps tokens far below
	// 2^62.
	const contenders, rounds, raisers, raises = 3, 8, 2, 12
	all := make([]driver.Backend, contenders+raisers)
	for i := range all {
		all[i] = s.backend(t)
	}
	var (
		raised  atomic.Uint64 // the highest floor a returned RaiseFloor set
		issued  atomic.Uint64 // the highest token handed out so far
		mu      sync.Mutex
		last    driver.Token
		failed  []string
		holders int
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failed = append(failed, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	atomicMax := func(a *atomic.Uint64, v uint64) {
		for {
			cur := a.Load()
			if v <= cur || a.CompareAndSwap(cur, v) {
				return
			}
		}
	}
	// Each grant wakes a raiser (the channel holds one wake-up): raises
	// and high-water reads race the grants that follow.
	wake := make(chan struct{}, 1)
	notify := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	done := make(chan struct{})
	var rwg sync.WaitGroup
	for i := range raisers {
		f := all[contenders+i].(driver.TokenFloorer)
		rwg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				case <-wake:
				}
				before := issued.Load()
				if n%3 == 2 || n >= 3*raises/2 {
					hw, err := f.HighWater(ctx, prefix)
					if err != nil {
						fail("HighWater: %v", err)
						return
					}
					if uint64(hw.Max()) < before {
						fail("HighWater(%q) = %+v, below the token %d issued before it was called", prefix, hw, before)
					}
					continue
				}
				floor := max(before, raised.Load()) + uint64(rand.IntN(5000)) + 1
				k := key
				if n%2 == 0 {
					k = ""
				}
				err := f.RaiseFloor(ctx, k, driver.Token(floor))
				if k == "" && errors.Is(err, driver.ErrUnsupported) {
					k = key // per-key floors only
					err = f.RaiseFloor(ctx, k, driver.Token(floor))
				}
				if err != nil {
					fail("RaiseFloor(%q, %d): %v", k, floor, err)
					return
				}
				atomicMax(&raised, floor)
			}
		})
	}
	var wg sync.WaitGroup
	for c := range contenders {
		b := all[c]
		owner := fmt.Sprintf("floor-%d", c)
		wg.Go(func() {
			for r := range rounds {
				floorBefore := raised.Load()
				g, err := grantWaiting(ctx, b, (c+r)%2 == 0, driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl})
				if err == nil {
					g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: ttl})
				}
				if err != nil {
					fail("contender %d round %d: %v", c, r, err)
					return
				}
				check := func(what string, g driver.Grant) {
					mu.Lock()
					defer mu.Unlock()
					if g.Token <= last || uint64(g.Token) <= floorBefore || g.Token > math.MaxInt64 {
						failed = append(failed, fmt.Sprintf("contender %d round %d: %s token %d; previous %d, floor raised before %d", c, r, what, g.Token, last, floorBefore))
					}
					last = g.Token
					holders++
					atomicMax(&issued, uint64(g.Token))
					notify()
				}
				check("granted", g)
				for _, ob := range all {
					if info, err := ob.Inspect(ctx, key); err != nil || info.Token != g.Token || info.Owner != owner {
						fail("contender %d round %d: Inspect = %+v, %v; want token %d", c, r, info, err, g.Token)
					}
				}
				if r%4 == 3 {
					floorBefore = raised.Load()
					rg, err := b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, Rotate: true})
					if err != nil {
						fail("contender %d round %d: rotation: %v", c, r, err)
						return
					}
					check("rotated", rg)
					if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: ttl}); !errors.Is(err, driver.ErrNotHeld) {
						fail("contender %d round %d: Renew of the pre-rotation token %d = %v; want ErrNotHeld", c, r, g.Token, err)
					}
					g = rg
				}
				if err := b.Release(ctx, g); err != nil {
					fail("contender %d round %d: Release: %v", c, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(done)
	rwg.Wait()
	for _, f := range failed {
		t.Error(f)
	}
	if want := contenders*rounds + contenders*(rounds/4); holders < want && len(failed) == 0 {
		t.Fatalf("%d grants and rotations, want %d", holders, want)
	}
}
