package mongo_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"pgregory.net/rapid"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
	"github.com/fencelock/fencelock/driver"
)

// TestHandoffsReadTheHighestClaimByID: handing a key between processes
// finds its highest token claim with finds by _id, never with the sorted
// find over the key's claims, which FerretDB serves by reading the whole
// collection (a second per find at a few thousand claims: the safety
// soak's slow handoffs). Once the key's first claim is older than
// GarbageAfter/2 (dated back here), a process that never saw the key sorts
// once, and the hint that leaves serves the next such processes.
func TestHandoffsReadTheHighestClaimByID(t *testing.T) {
	eachServer(t, testHandoffsReadTheHighestClaimByID)
}

func testHandoffsReadTheHighestClaimByID(t *testing.T, _ server, raw string) {
	locks := freshCollection(t, raw)
	ctx := t.Context()
	var sorted atomic.Int64
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "find" {
			if _, err := e.Command.LookupErr("sort"); err == nil {
				sorted.Add(1)
			}
		}
	}}
	mc, err := mongo.Connect(options.Client().ApplyURI(raw).SetMonitor(mon))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mc.Disconnect(context.Background()) })
	open := func() *mongolock.Backend {
		b, err := mongolock.New(ctx, mc, &mongolock.Options{Database: testDatabase, Collection: locks})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	var last driver.Token
	cycle := func(b *mongolock.Backend, who string) {
		t.Helper()
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: who, TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if g.Token <= last {
			t.Fatalf("%s got token %d after token %d", who, g.Token, last)
		}
		last = g.Token
		if err := b.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	handoffs := func(phase string) {
		a, b := open(), open()
		for i := range 30 {
			cycle(a, fmt.Sprint(phase, "a", i))
			cycle(b, fmt.Sprint(phase, "b", i))
			if i%10 == 9 {
				// Another process's run of tokens: the next walks
				// of a and b are longer than one probe.
				c := open()
				for j := range 12 {
					cycle(c, fmt.Sprint(phase, "c", i, j))
				}
			}
		}
	}
	handoffs("young")
	if n := sorted.Load(); n != 0 {
		t.Errorf("%d sorted finds of the highest claim while the key's first claim was recent; want none", n)
	}
	a := open()
	if err := a.AgeClaim(ctx, "k", 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	before := sorted.Load()
	handoffs("old")
	for i := range 5 {
		cycle(open(), fmt.Sprint("new", i))
	}
	if n := sorted.Load() - before; n > 1 {
		t.Errorf("%d sorted finds of the highest claim once the key's first claim was old; want at most one (the first process that never saw the key), then the hint", n)
	}
}

// TestOldHintIsNotAStart: a hint older than GarbageAfter/2 may name a base
// whose next claims are garbage by now; walking from it would find that
// hole and issue a token again. The walk must not start there.
func TestOldHintIsNotAStart(t *testing.T) { eachServer(t, testOldHintIsNotAStart) }

func testOldHintIsNotAStart(t *testing.T, _ server, raw string) {
	ctx := t.Context()
	a, u := openTest(t, raw)
	var last driver.Token
	for range 10 {
		g, err := a.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o" + randHex(), TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		last = g.Token
		if err := a.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	// An hour later, as garbage collection leaves it: the first claim
	// and the highest; a hint from back then.
	for tok := int64(1); tok <= int64(last); tok++ {
		if err := a.AgeClaim(ctx, "k", tok, time.Hour+time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.DeleteClaims(ctx, "k", 2, int64(last)-1); err != nil {
		t.Fatal(err)
	}
	if err := a.SetHint(ctx, "k", 3, time.Hour); err != nil {
		t.Fatal(err)
	}
	b, err := mongolock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "new", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= last {
		t.Fatalf("a new process got token %d after token %d: it walked from an old start (the hint, or the first claim) into garbage-collected claims", g.Token, last)
	}
}

// TestWalkAgreesWithSortedFind: from any base that was a key's highest
// (none of its claims garbage), the walk by _id finds the same next base
// as the sorted find, through acquisitions by several processes (each
// with its own cached last token), rotations and token floors of any
// height. Checked on the real servers, over generated histories.
func TestWalkAgreesWithSortedFind(t *testing.T) { eachServer(t, testWalkAgreesWithSortedFind) }

func testWalkAgreesWithSortedFind(t *testing.T, _ server, raw string) {
	ctx := t.Context()
	first, u := openTest(t, raw)
	bs := []*mongolock.Backend{first}
	for range 2 {
		b, err := mongolock.Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		bs = append(bs, b)
	}
	var run atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		key := fmt.Sprint("walk/", run.Add(1))
		var seen []int64 // bases that were the highest, in order
		var last driver.Token
		highest := func() int64 {
			h, err := first.ScanHighest(ctx, key)
			if err != nil {
				rt.Fatal(err)
			}
			return h
		}
		steps := rapid.IntRange(1, 16).Draw(rt, "steps")
		for range steps {
			b := bs[rapid.IntRange(0, len(bs)-1).Draw(rt, "backend")]
			switch rapid.IntRange(0, 3).Draw(rt, "op") {
			case 0, 1:
				g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "o" + randHex(), TTL: 10 * time.Second})
				if err != nil {
					rt.Fatal(err)
				}
				if g.Token <= last {
					rt.Fatalf("token %d after %d", g.Token, last)
				}
				last = g.Token
				if rapid.Bool().Draw(rt, "rotate") {
					ng, err := b.Renew(ctx, g, driver.RenewRequest{TTL: 10 * time.Second, Rotate: true})
					if err != nil {
						rt.Fatal(err)
					}
					if ng.Token <= last {
						rt.Fatalf("rotated token %d after %d", ng.Token, last)
					}
					last, g = ng.Token, ng
				}
				if err := b.Release(ctx, g); err != nil {
					rt.Fatal(err)
				}
			case 2:
				floor := highest() + rapid.Int64Range(0, 40).Draw(rt, "raise")
				if err := b.RaiseFloor(ctx, key, driver.Token(floor)); err != nil {
					rt.Fatal(err)
				}
				last = max(last, driver.Token(floor))
			case 3:
				// Nothing: a base seen twice.
			}
			if rapid.IntRange(0, 2).Draw(rt, "record") == 0 {
				seen = append(seen, highest())
			}
		}
		want := highest()
		for _, start := range append(seen, 0) {
			got, ok, err := first.WalkFrom(ctx, key, start)
			if err != nil {
				rt.Fatal(err)
			}
			if !ok || got != want {
				rt.Fatalf("walk from %d = %d (found %v); the sorted find says %d (bases seen: %v)", start, got, ok, want, seen)
			}
		}
	})
	// The hint documents are not claims: HighWater sees only claims and
	// records.
	hw, err := first.HighWater(ctx, "walk/")
	if err != nil {
		t.Fatal(err)
	}
	for k, tok := range hw.Keys {
		h, err := first.ScanHighest(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if int64(tok) < h {
			t.Errorf("HighWater(%q) = %d, below the sorted find's %d", k, tok, h)
		}
	}
}

// TestFloorOverUnclaimedRecord: a record whose token claim never landed
// (its acquire failed between the two inserts, and its removal failed
// too) must not let RaiseFloor put a floor claim above that unclaimed
// token: the hole below the floor would stop every walk there, and the
// hole's token would be issued after the floor. RaiseFloor claims the
// record's token first; a second raise over the same record succeeds.
func TestFloorOverUnclaimedRecord(t *testing.T) { eachServer(t, testFloorOverUnclaimedRecord) }

func testFloorOverUnclaimedRecord(t *testing.T, _ server, raw string) {
	ctx := t.Context()
	a, u := openTest(t, raw)
	const key = "k"
	g, err := a.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "first", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	b, err := mongolock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tok, err := b.InsertRecordOnly(ctx, key, "unclaimed", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.RaiseFloor(ctx, key, 1000); err != nil {
		t.Fatal(err)
	}
	if err := b.RaiseFloor(ctx, key, 2000); err != nil {
		t.Fatalf("a second RaiseFloor over the record with an unclaimed token: %v", err)
	}
	for _, start := range []int64{0, 1} {
		walked, ok, err := b.WalkFrom(ctx, key, start)
		if err != nil {
			t.Fatal(err)
		}
		scanned, err := b.ScanHighest(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !ok || walked != scanned || scanned != 2000 {
			t.Errorf("walk from %d = %d (found %v), sorted find %d; want 2000 from both", start, walked, ok, scanned)
		}
	}
	// The record goes (its owner's clean-up, by owner and token).
	if err := b.Release(ctx, driver.Grant{Key: key, Owner: "unclaimed", Token: driver.Token(tok)}); err != nil {
		t.Fatal(err)
	}
	c, err := mongolock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err = c.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "next", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= 2000 {
		t.Fatalf("token %d issued after RaiseFloor(2000) returned", g.Token)
	}
}

// TestTokenOverflowRefused: a key whose floor reaches 2^63-1 issues that
// token once, then refuses Acquire with ErrTokenOverflow (matching
// driver.ErrUnsupported, so the engine does not retry) and stores nothing.
func TestTokenOverflowRefused(t *testing.T) { eachServer(t, testTokenOverflowRefused) }

func testTokenOverflowRefused(t *testing.T, _ server, raw string) {
	ctx := t.Context()
	a, _ := openTest(t, raw)
	const key = "k"
	if err := a.RaiseFloor(ctx, key, math.MaxInt64-1); err != nil {
		t.Fatal(err)
	}
	g, err := a.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "o", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g.Token != math.MaxInt64 {
		t.Fatalf("token %d; want 2^63-1", g.Token)
	}
	if err := a.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	_, err = a.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "o2", TTL: 10 * time.Second})
	if !errors.Is(err, mongolock.ErrTokenOverflow) || !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("Acquire past 2^63-1 = %v; want ErrTokenOverflow", err)
	}
	if info, err := a.Inspect(ctx, key); err != nil || info.Owner != "" {
		t.Fatalf("Inspect after a refused Acquire = %+v, %v; want nothing held", info, err)
	}
}
