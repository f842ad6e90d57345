package mongo_test

import (
	"context"
	"fmt"
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
// collection (a second per find at a few thousand claims: the
// safety soak's slow handoffs). Only a process that meets a key whose
// claims it has never seen, and which has no recent hint, sorts once; the
// next such process walks from the hint that left.
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
	a, b := open(), open()
	for i := range 40 {
		cycle(a, fmt.Sprint("a", i))
		cycle(b, fmt.Sprint("b", i))
		if i%10 == 9 {
			// Another process's run of tokens: the next walk of a and
			// b is longer than one probe.
			c := open()
			for j := range 12 {
				cycle(c, fmt.Sprint("c", i, j))
			}
		}
	}
	if n := sorted.Load(); n > 1 {
		t.Errorf("%d sorted finds of the highest claim during handoffs; want at most one (the first new process)", n)
	}
	before := sorted.Load()
	for i := range 5 {
		cycle(open(), fmt.Sprint("new", i))
	}
	if n := sorted.Load() - before; n != 0 {
		t.Errorf("%d sorted finds by new processes after the key's hint was written; want none", n)
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
