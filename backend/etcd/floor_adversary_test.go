package etcd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// Adversarial tests of the token floors (floor.go): raises that race
// grants, waiters and rotations, from backends (separate etcd clients)
// whose cached offsets differ.

// A waiter queued before a global raise, made by a backend whose cache is
// stale, and granted after it gets a token above the floor and above the
// holder's token (rotated before the raise, or not: a rotation re-puts the
// waiter's entry on its own); the stale tokens are refused everywhere.
func TestFloorAdversaryWaiterQueuedBeforeStaleRaise(t *testing.T) {
	for _, rotate := range []bool{false, true} {
		t.Run(fmt.Sprintf("rotate=%v", rotate), func(t *testing.T) { testWaiterQueuedBeforeStaleRaise(t, rotate) })
	}
}

func testWaiterQueuedBeforeStaleRaise(t *testing.T, rotate bool) {
	ctx := ctxT(t)
	const key, ttl = "adv-waiter", 5 * time.Second
	bs := openFresh(t, 4)
	hb, wb, rb, ob := bs[0], bs[1], bs[2], bs[3]
	// rb's cache: read now, stale once ob raises.
	if _, err := rb.HighWater(ctx, ""); err != nil {
		t.Fatal(err)
	}
	g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	waited := make(chan result, 1)
	go func() {
		g, err := wb.AcquireWait(ctx, driver.AcquireRequest{Key: key, Owner: "waiter", TTL: ttl})
		if err == nil {
			g, err = wb.Renew(ctx, g, driver.RenewRequest{TTL: ttl}) // the engine's confirmation
		}
		waited <- result{g, err}
	}()
	for queueLen(t, hb, key) < 2 {
		time.Sleep(5 * time.Millisecond) // polling the server's view of the queue
	}
	g1r := g1
	if rotate {
		if g1r, err = hb.Renew(ctx, g1, driver.RenewRequest{TTL: ttl, Rotate: true}); err != nil || g1r.Token <= g1.Token {
			t.Fatalf("rotation = %+v, %v; want a token above %d", g1r, err, g1.Token)
		}
	}
	// ob raises a little, then rb (cache from before) raises for real.
	if err := ob.RaiseFloor(ctx, "", g1r.Token+10); err != nil {
		t.Fatal(err)
	}
	floor := g1r.Token + 1_000_000
	if err := rb.RaiseFloor(ctx, key, floor); err != nil {
		t.Fatal(err)
	}
	// A lower raise from a backend that has not seen either is a no-op.
	if err := wb.RaiseFloor(ctx, "", g1r.Token+5); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*Backend{hb, wb, rb, ob} {
		if info, err := b.Inspect(ctx, key); err != nil || info.Token != g1r.Token || info.Owner != "holder" {
			t.Fatalf("Inspect during the raises = %+v, %v; want the holder's rotated token %d", info, err, g1r.Token)
		}
	}
	if rotate {
		if err := hb.Release(ctx, g1); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release with the pre-rotation token = %v; want ErrNotHeld", err)
		}
	}
	if err := hb.Release(ctx, g1r); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.g.Token <= floor || r.g.Token <= g1r.Token {
		t.Fatalf("waiter queued before RaiseFloor(%d) got token %d after it (holder had %d)", floor, r.g.Token, g1r.Token)
	}
	for _, b := range []*Backend{hb, rb, ob} {
		if info, err := b.Inspect(ctx, key); err != nil || info.Token != r.g.Token {
			t.Fatalf("Inspect of the waiter's grant = %+v, %v; want token %d", info, err, r.g.Token)
		}
		if _, err := b.Renew(ctx, g1r, driver.RenewRequest{TTL: ttl}); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Renew with the previous holder's token = %v; want ErrNotHeld", err)
		}
	}
	if err := wb.Release(ctx, r.g); err != nil {
		t.Fatal(err)
	}
}

// Contenders on backends of their own take one key in turn (queued or
// polling, rotating now and then) while raisers on other backends raise
// the global floor and read the high-water mark. Checked at every grant:
// the token is above every floor whose RaiseFloor returned before the
// acquire began, above the previous holder's last token (rotations
// included), below 2^63, the same in Inspect on every backend, and a
// pre-rotation token is refused; every HighWater is at least every token
// issued before it was called.
func TestFloorAdversaryConcurrentRaises(t *testing.T) {
	ctx := ctxT(t)
	const key, ttl = "adv-concurrent", 5 * time.Second
	// A raise adds at most its floor minus the current tokens to the
	// offset: a bounded number of raises keeps the offsets far below 2^62.
	const contenders, rounds, raisers, raises = 3, 10, 2, 12
	all := openFresh(t, contenders+raisers)
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
		b := all[contenders+i]
		rwg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				case <-wake:
				}
				before := issued.Load()
				if n%3 == 2 || n >= 3*raises/2 {
					hw, err := b.HighWater(ctx, "")
					if err != nil {
						fail("HighWater: %v", err)
						return
					}
					if uint64(hw.Max()) < before {
						fail("HighWater = %+v, below the token %d issued before it was called", hw, before)
					}
					continue
				}
				floor := max(before, raised.Load()) + uint64(rand.IntN(5000)) + 1
				k := key
				if n%2 == 0 {
					k = ""
				}
				if err := b.RaiseFloor(ctx, k, driver.Token(floor)); err != nil {
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
		owner := fmt.Sprintf("adv-%d", c)
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
					other := all[(c+1)%len(all)]
					if _, err := other.Renew(ctx, g, driver.RenewRequest{TTL: ttl}); !errors.Is(err, driver.ErrNotHeld) {
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

// Floors close to 2^62: tokens stay above the floor and below 2^63,
// strictly increasing, mapped back exactly, and the offset saturates
// instead of overflowing.
func TestFloorAdversaryNearLimit(t *testing.T) {
	ctx := ctxT(t)
	const key, ttl = "adv-limit", 5 * time.Second
	bs := openFresh(t, 2)
	b1, b2 := bs[0], bs[1]
	g, err := b1.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	prev := g.Token
	if err := b1.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	top := driver.Token(maxOffset - 1)
	for i := range 4 {
		// The same top floor each time: the first raise sets the offset
		// just high enough, the others are below the tokens issued now.
		if err := b2.RaiseFloor(ctx, "", top); err != nil {
			t.Fatalf("raise %d to 2^62-1: %v", i, err)
		}
		g, err := b1.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "a", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if g.Token <= top || g.Token <= prev || g.Token > math.MaxInt64 {
			t.Fatalf("raise %d: token %d; want above the floor %d and the previous %d, at most 2^63-1", i, g.Token, top, prev)
		}
		rg, err := b1.Renew(ctx, g, driver.RenewRequest{TTL: ttl, Rotate: true})
		if err != nil || rg.Token <= g.Token || rg.Token > math.MaxInt64 {
			t.Fatalf("rotation = %+v, %v; want a token above %d, at most 2^63-1", rg, err, g.Token)
		}
		if info, err := b2.Inspect(ctx, key); err != nil || info.Token != rg.Token {
			t.Fatalf("Inspect = %+v, %v; want %d", info, err, rg.Token)
		}
		if err := b2.Release(ctx, g); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release with the pre-rotation token = %v; want ErrNotHeld", err)
		}
		if err := b1.Release(ctx, rg); err != nil {
			t.Fatal(err)
		}
		prev = rg.Token
	}
	var bad *driver.InvalidOptionError
	if err := b2.RaiseFloor(ctx, "", maxOffset); !errors.As(err, &bad) {
		t.Fatalf("RaiseFloor(2^62) = %v; want an InvalidOptionError", err)
	}
	if hw, err := b2.HighWater(ctx, ""); err != nil || hw.Max() < prev || hw.Max() > math.MaxInt64 {
		t.Fatalf("HighWater = %+v, %v; want at least %d, at most 2^63-1", hw, err, prev)
	}
}

// openFresh opens n backends on a prefix of their own, new at each run
// (open keeps one prefix per test name, also across -count runs): offsets
// raised by an earlier run must not carry over.
func openFresh(t *testing.T, n int) []*Backend {
	t.Helper()
	u := testURL(t)
	bs := make([]*Backend, n)
	for i := range bs {
		b, err := Open(t.Context(), u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs[i] = b
	}
	return bs
}

// grantWaiting takes key, queued in the store if queue is set, else by
// polling with Acquire.
func grantWaiting(ctx context.Context, b *Backend, queue bool, req driver.AcquireRequest) (driver.Grant, error) {
	if queue {
		return b.AcquireWait(ctx, req)
	}
	for {
		g, err := b.Acquire(ctx, req)
		if !errors.Is(err, driver.ErrNotAcquired) {
			return g, err
		}
		t := time.NewTimer(2 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return driver.Grant{}, ctx.Err()
		case <-t.C:
		}
	}
}

// A holder that raises the floor just above its own token before it
// releases (what the dual backend of a migration does to the lower side
// when the other side is one ahead), round after round: the floors asked
// for grow by a few per round, so the raises must keep succeeding and the
// tokens stay far from 2^62. Such a floor is below the tokens issued from
// then on, so the raises add no segment to the history.
func TestFloorAdversaryRepeatedSmallRaises(t *testing.T) {
	ctx := ctxT(t)
	const key, ttl, rounds = "adv-small", 5 * time.Second, 100
	bs := openFresh(t, 2)
	b, rb := bs[0], bs[1]
	// The copy from the old backend, whose tokens were ahead.
	hw, err := rb.HighWater(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.RaiseFloor(ctx, "", hw.Max()+100_000); err != nil {
		t.Fatal(err)
	}
	_, h0, err := rb.readFloor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var first, prev driver.Token
	for r := range rounds {
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "a", TTL: ttl})
		if err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		if g.Token <= prev || g.Token > math.MaxInt64 {
			t.Fatalf("round %d: token %d after %d (the floor raised to %d)", r, g.Token, prev, prev+1)
		}
		if r == 0 {
			first = g.Token
		}
		prev = g.Token
		if err := rb.RaiseFloor(ctx, key, g.Token+1); err != nil {
			t.Fatalf("round %d: RaiseFloor(token %d + 1): %v", r, g.Token, err)
		}
		if err := b.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= prev || g.Token-first > 1<<40 {
		t.Fatalf("after %d raises of one above the holder's token, tokens went from %d to %d (last %d)", rounds, first, g.Token, prev)
	}
	if _, h, err := rb.readFloor(ctx); err != nil || len(h.starts) != len(h0.starts) {
		t.Fatalf("history after the raises: %v segments, %v; want the %d from before them", h.starts, err, len(h0.starts))
	}
}

// A raise to a floor that the tokens issued from now on exceed already
// (here the high-water mark: the token of the current revision) adds no
// segment, but a waiter that queued before it and is granted after it
// must still get a token above it: its entry is older than the floor, so
// the raise has to leave a trace (the floor key's revision) that makes
// the waiter re-put its entry.
func TestFloorAdversaryWaiterAndRaiseBelowCurrentTokens(t *testing.T) {
	ctx := ctxT(t)
	const key, ttl = "adv-waiter-small", 5 * time.Second
	bs := openFresh(t, 3)
	hb, wb, rb := bs[0], bs[1], bs[2]
	// A segment first, so that the offset is not zero.
	if err := rb.RaiseFloor(ctx, "", 1_000_000); err != nil {
		t.Fatal(err)
	}
	g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	waited := make(chan result, 1)
	go func() {
		g, err := wb.AcquireWait(ctx, driver.AcquireRequest{Key: key, Owner: "waiter", TTL: ttl})
		waited <- result{g, err}
	}()
	for queueLen(t, hb, key) < 2 {
		time.Sleep(5 * time.Millisecond) // polling the server's view of the queue
	}
	hw, err := rb.HighWater(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	_, h0, err := rb.readFloor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	floor := hw.Global
	if err := rb.RaiseFloor(ctx, key, floor); err != nil {
		t.Fatal(err)
	}
	if _, h, err := rb.readFloor(ctx); err != nil || h.last() != h0.last() {
		t.Fatalf("offset after a raise below the current tokens = %d, %v; want %d unchanged", h.last(), err, h0.last())
	}
	if err := hb.Release(ctx, g1); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.g.Token <= floor {
		t.Fatalf("waiter queued before RaiseFloor(%d) got token %d after it", floor, r.g.Token)
	}
	if info, err := hb.Inspect(ctx, key); err != nil || info.Token != r.g.Token {
		t.Fatalf("Inspect = %+v, %v; want the waiter's token %d", info, err, r.g.Token)
	}
	if err := wb.Release(ctx, r.g); err != nil {
		t.Fatal(err)
	}
}
