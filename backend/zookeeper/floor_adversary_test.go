package zookeeper

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"math"
	"net/url"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// Adversarial tests of the token floors (floor.go): raises that race
// grants, waiters, rotations, high-water reads (which write the floor
// znode) and session expiry, from backends (sessions of their own) whose
// cached floors differ.

// openFresh opens n backends on a root of their own: the offset is one per
// root, and this run's other tests share theirs.
func openFresh(t *testing.T, n int) []*Backend {
	t.Helper()
	u, err := url.Parse(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	q := u.Query()
	q.Set("prefix", "fencelock-test-"+runID+"-floor-"+hex.EncodeToString(rnd[:]))
	u.RawQuery = q.Encode()
	bs := make([]*Backend, n)
	for i := range bs {
		b, err := Open(t.Context(), u.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs[i] = b
	}
	return bs
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// confirmed is the outcome of waitConfirmed.
type confirmed struct {
	g   driver.Grant
	err error
}

// handOffAbove queues owner "waiter" for key on wb behind hb's grant g1,
// has raise raise the floor to g1's token + 1,000,000 while it waits,
// releases g1, and checks that the waiter's confirmed token is above that
// floor. It returns the waiter's grant and the floor.
func handOffAbove(ctx context.Context, t *testing.T, hb, wb *Backend, g1 driver.Grant, raise func(floor driver.Token)) (driver.Grant, driver.Token) {
	t.Helper()
	waited := waitConfirmed(ctx, wb, g1.Key, testTTL)
	queued(t, hb, g1.Key, 2)
	floor := g1.Token + 1_000_000
	raise(floor)
	return releaseToWaiter(ctx, t, hb, g1, waited, floor), floor
}

// releaseToWaiter releases g1 on hb and checks that the waiter behind it
// (waited, from waitConfirmed) gets a token above floor; it returns the
// waiter's grant.
func releaseToWaiter(ctx context.Context, t *testing.T, hb *Backend, g1 driver.Grant, waited <-chan confirmed, floor driver.Token) driver.Grant {
	t.Helper()
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
	return r.g
}

// waitConfirmed queues owner "waiter" for key on b, as the engine does:
// AcquireWait, then the confirming Renew. The outcome arrives on the
// channel.
func waitConfirmed(ctx context.Context, b *Backend, key string, ttl time.Duration) <-chan confirmed {
	ch := make(chan confirmed, 1)
	go func() {
		g, err := b.AcquireWait(ctx, driver.AcquireRequest{Key: key, Owner: "waiter", TTL: ttl})
		if err == nil {
			g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: ttl}) // the engine's confirmation
		}
		ch <- confirmed{g, err}
	}()
	return ch
}

// A waiter queued before a raise made by a backend whose cached floor is
// stale, and granted after it (the holder released, or its session ended),
// gets a confirmed token above the floor and above the holder's; the stale
// tokens are refused everywhere.
func TestFloorAdversaryWaiterQueuedBeforeStaleRaise(t *testing.T) {
	for _, c := range []struct {
		name           string
		rotate, expire bool
	}{{"release", false, false}, {"rotate", true, false}, {"expire", false, true}} {
		t.Run(c.name, func(t *testing.T) { testWaiterQueuedBeforeStaleRaise(t, c.rotate, c.expire) })
	}
}

func testWaiterQueuedBeforeStaleRaise(t *testing.T, rotate, expire bool) {
	ctx := ctxT(t)
	const key = "adv-waiter"
	ttl := testTTL
	bs := openFresh(t, 4)
	hb, wb, rb, ob := bs[0], bs[1], bs[2], bs[3]
	// rb's cached floor: read now, stale once ob raises.
	if err := rb.RaiseFloor(ctx, "", 1); err != nil {
		t.Fatal(err)
	}
	g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	waited := waitConfirmed(ctx, wb, key, ttl)
	queued(t, hb, key, 2)
	g1r := g1
	if rotate {
		if g1r, err = hb.Renew(ctx, g1, driver.RenewRequest{TTL: ttl, Rotate: true}); err != nil || g1r.Token <= g1.Token {
			t.Fatalf("rotation = %+v, %v; want a token above %d", g1r, err, g1.Token)
		}
	}
	if err := ob.RaiseFloor(ctx, "", g1r.Token+10); err != nil {
		t.Fatal(err)
	}
	floor := g1r.Token + 1_000_000
	if err := rb.RaiseFloor(ctx, key, floor); err != nil {
		t.Fatal(err)
	}
	if err := wb.RaiseFloor(ctx, "", g1r.Token+5); err != nil { // lower: nothing to do
		t.Fatal(err)
	}
	for _, b := range bs {
		if info, err := b.Inspect(ctx, key); err != nil || info.Token != g1r.Token || info.Owner != "holder" {
			t.Fatalf("Inspect during the raises = %+v, %v; want the holder's token %d", info, err, g1r.Token)
		}
	}
	if rotate {
		if err := hb.Release(ctx, g1); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release with the pre-rotation token = %v; want ErrNotHeld", err)
		}
	}
	if expire {
		killSession(t, hb)
	} else if err := hb.Release(ctx, g1r); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.g.Token <= floor || r.g.Token <= g1r.Token || r.g.Token > math.MaxInt64 {
		t.Fatalf("waiter queued before RaiseFloor(%d) got token %d after it (holder had %d)", floor, r.g.Token, g1r.Token)
	}
	for _, b := range []*Backend{wb, rb, ob} {
		if info, err := b.Inspect(ctx, key); err != nil || info.Token != r.g.Token {
			t.Fatalf("Inspect of the waiter's grant = %+v, %v; want token %d", info, err, r.g.Token)
		}
		stale := driver.Grant{Key: key, Owner: "holder", Token: g1r.Token}
		if _, err := b.Renew(ctx, stale, driver.RenewRequest{TTL: ttl}); !errors.Is(err, driver.ErrNotHeld) {
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
	const key = "adv-limit"
	ttl := testTTL
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
		if err := b1.Release(ctx, g); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release with the pre-rotation token = %v; want ErrNotHeld", err)
		}
		if err := b1.Release(ctx, rg); err != nil {
			t.Fatal(err)
		}
		prev = rg.Token
		if hw, err := b2.HighWater(ctx, ""); err != nil || hw.Max() < prev || hw.Max() > math.MaxInt64 {
			t.Fatalf("HighWater = %+v, %v; want at least %d, at most 2^63-1", hw, err, prev)
		}
	}
	var bad *driver.InvalidOptionError
	if err := b2.RaiseFloor(ctx, "", maxOffset); !errors.As(err, &bad) {
		t.Fatalf("RaiseFloor(2^62) = %v; want an InvalidOptionError", err)
	}
}

// A holder that raises the floor just above its own token before it
// releases (what the dual backend of a migration does to the lower side
// when the other side is one ahead), round after round: the floors asked
// for grow by a few per round, so the raises must keep succeeding and the
// tokens stay far from 2^62. Such a floor is below the tokens issued from
// then on, so the raises change no offset and the history does not grow.
func TestFloorAdversaryRepeatedSmallRaises(t *testing.T) {
	ctx := ctxT(t)
	const key, rounds = "adv-small", 100
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
	s0, err := rb.readFloor(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var first, prev driver.Token
	for r := range rounds {
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "a", TTL: testTTL})
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
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "a", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= prev || g.Token-first > 1<<40 {
		t.Fatalf("after %d raises of one above the holder's token, tokens went from %d to %d (last %d)", rounds, first, g.Token, prev)
	}
	if s, err := rb.readFloor(ctx, 0); err != nil || s.h.Last() != s0.h.Last() || s.h.Len() > s0.h.Len()+1 {
		t.Fatalf("history after the raises: last offset %d of %d segments, %v; want the offset from before them, %d of %d", s.h.Last(), s.h.Len(), err, s0.h.Last(), s0.h.Len())
	}
}

// A raise to a floor that the tokens issued from now on exceed already
// (here the token of a grant made after the waiter queued) changes no
// offset, but a waiter that queued before it and is granted after it must
// still get a token above it: the raise has to move the floor znode's
// mzxid, which makes the waiter rewrite its znode.
func TestFloorAdversaryWaiterAndRaiseBelowCurrentTokens(t *testing.T) {
	ctx := ctxT(t)
	const key, other = "adv-waiter-small", "adv-waiter-small-other"
	bs := openFresh(t, 3)
	hb, wb, rb := bs[0], bs[1], bs[2]
	// A segment first, so that the offset is not zero.
	if err := rb.RaiseFloor(ctx, "", 1_000_000); err != nil {
		t.Fatal(err)
	}
	g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	waited := waitConfirmed(ctx, wb, key, testTTL)
	queued(t, hb, key, 2)
	// A grant after the waiter queued: its token is above the waiter's.
	go2, err := rb.Acquire(ctx, driver.AcquireRequest{Key: other, Owner: "other", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	s0, err := rb.readFloor(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	floor := go2.Token
	if err := rb.RaiseFloor(ctx, key, floor); err != nil {
		t.Fatal(err)
	}
	if s, err := rb.readFloor(ctx, 0); err != nil || s.h.Last() != s0.h.Last() {
		t.Fatalf("offset after a raise below the current tokens = %d, %v; want %d unchanged", s.h.Last(), err, s0.h.Last())
	}
	wg := releaseToWaiter(ctx, t, hb, g1, waited, floor)
	if info, err := hb.Inspect(ctx, key); err != nil || info.Token != wg.Token {
		t.Fatalf("Inspect = %+v, %v; want the waiter's token %d", info, err, wg.Token)
	}
	for _, rel := range []struct {
		b *Backend
		g driver.Grant
	}{{wb, wg}, {rb, go2}} {
		if err := rel.b.Release(ctx, rel.g); err != nil {
			t.Fatal(err)
		}
	}
}

// A backend with a cached floor takes a raise made elsewhere into account:
// in a waiter's hand-off, where the raise came after the waiter queued and
// the waiter's backend read nothing since (its sync goes out beside the
// confirming read), and in the tokens it maps for a holder it finds.
func TestFloorAdversaryCachedFloorSeesRaise(t *testing.T) {
	ctx := ctxT(t)
	const key, seen = "adv-watched", "adv-watched-seen"
	bs := openFresh(t, 3)
	hb, wb, rb := bs[0], bs[1], bs[2]
	// wb reads the floor before anything is raised.
	gw, err := wb.Acquire(ctx, driver.AcquireRequest{Key: seen, Owner: "seen", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	wg, _ := handOffAbove(ctx, t, hb, wb, g1, func(floor driver.Token) {
		if err := rb.RaiseFloor(ctx, key, floor); err != nil {
			t.Fatal(err)
		}
	})
	if info, err := rb.Inspect(ctx, key); err != nil || info.Token != wg.Token {
		t.Fatalf("Inspect elsewhere = %+v, %v; want the waiter's token %d", info, err, wg.Token)
	}
	// Raise again; a grant made elsewhere after it has a token above it,
	// and wb, which has read nothing since, maps the holder's zxid to
	// that same token.
	if err := wb.Release(ctx, wg); err != nil {
		t.Fatal(err)
	}
	floor2 := wg.Token + 1_000_000
	if err := rb.RaiseFloor(ctx, "", floor2); err != nil {
		t.Fatal(err)
	}
	g2, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder2", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= floor2 {
		t.Fatalf("grant after RaiseFloor(%d) has token %d", floor2, g2.Token)
	}
	if info, err := wb.Inspect(ctx, key); err != nil || info.Token != g2.Token {
		t.Fatalf("Inspect by the backend with the watched cache = %+v, %v; want token %d", info, err, g2.Token)
	}
	var held *driver.HeldError
	if _, err := wb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "late", TTL: testTTL}); !errors.As(err, &held) || held.Holder.Token != g2.Token {
		t.Fatalf("Acquire of the held key = %v; want a HeldError with token %d", err, g2.Token)
	}
	for _, rel := range []struct {
		b *Backend
		g driver.Grant
	}{{hb, g2}, {wb, gw}} {
		if err := rel.b.Release(ctx, rel.g); err != nil {
			t.Fatal(err)
		}
	}
}
