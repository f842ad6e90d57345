package etcd

import (
	"errors"
	"fmt"
	"math"
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
	if _, h, err := rb.readFloor(ctx); err != nil || h.Len() != h0.Len() {
		t.Fatalf("history after the raises: %v segments, %v; want the %d from before them", h.Len(), err, h0.Len())
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
	if _, h, err := rb.readFloor(ctx); err != nil || h.Last() != h0.Last() {
		t.Fatalf("offset after a raise below the current tokens = %d, %v; want %d unchanged", h.Last(), err, h0.Last())
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
