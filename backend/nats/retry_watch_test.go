package nats

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// openTest opens a backend on a fresh bucket of the test server.
func openTest(t *testing.T, u string) *Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestAcquireRetryBySameOwnerRestartsTTL: an Acquire by the owner of the
// key's live record (a retry after a lost reply) returns the existing
// grant, and the engine counts its TTL from that call; so the record
// must be written again, expiring no sooner than the call's start plus
// the granted TTL. Returning the old record as it was leaves the server
// removing it while the engine still counts the lease valid.
func TestAcquireRetryBySameOwnerRestartsTTL(t *testing.T) {
	b := openTest(t, testURL(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := driver.AcquireRequest{Key: "retry", Owner: "a", TTL: 2 * time.Second}
	g1, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond) // the lease's time passing is what is tested
	start := time.Now()
	g2, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token != g1.Token {
		t.Fatalf("a retry by the same owner got token %d, not the grant's %d", g2.Token, g1.Token)
	}
	ttl := req.TTL
	if g2.TTL > 0 {
		ttl = g2.TTL
	}
	rec, err := b.last(ctx, b.lockSubj(req.Key))
	if err != nil {
		t.Fatal(err)
	}
	// The server and the test share a clock (one machine).
	if exp, want := rec.ts.Add(rec.ttl), start.Add(ttl); exp.Before(want.Add(-50 * time.Millisecond)) {
		t.Fatalf("after a retry by the same owner the server expires the record at %s, %s before the engine's lease (%s from the call's start) ends",
			exp.Format(time.StampMilli), want.Sub(exp), ttl)
	}
}

// TestWatchSeesReleaseRightAfterSubscribing: a release stored just after
// Watch returns (the engine tries once more right after subscribing,
// then waits) wakes the waiter, though the bucket's watch was not yet
// running when Watch returned.
func TestWatchSeesReleaseRightAfterSubscribing(t *testing.T) {
	u := testURL(t)
	holder := openTest(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 5 {
		waiter := openTest(t, u) // its watch not yet started
		key := "w" + string(rune('a'+i))
		g, err := holder.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "h", TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		ch, err := waiter.Watch(wctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := holder.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: a release stored after Watch returned did not wake the waiter in 5s", i)
		}
		wcancel()
		waiter.Close()
	}
}

// TestLossSeenWhileWatchStarts: a holder registered for loss while the
// bucket's watch is being started by a waiter (so from the stream's end
// then, not from the holder's write) learns of a force release stored
// before the watch ran.
func TestLossSeenWhileWatchStarts(t *testing.T) {
	u := testURL(t)
	other := openTest(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 5 {
		b := openTest(t, u) // its watch not yet started
		key := "l" + string(rune('a'+i))
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "h", TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		if _, err := b.Watch(wctx, "elsewhere"); err != nil { // starts the watch from the stream's end
			t.Fatal(err)
		}
		lost := make(chan error, 1)
		stop := b.NotifyLoss(g, func(err error) { lost <- err })
		if _, err := other.ForceRelease(ctx, key); err != nil {
			t.Fatal(err)
		}
		select {
		case <-lost:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: a force release stored while the watch started was not reported as loss in 5s", i)
		}
		stop()
		wcancel()
		b.Close()
	}
}
