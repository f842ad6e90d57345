package mongo

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
)

// TestSlowClockSampleKeepsTightEstimate: a hello answered after a long
// round trip (the server stalled with it in flight) does not replace a
// tighter estimate; the estimate's bound grows with its age by the drift
// rate, and a sample tighter than the aged bound replaces it.
func TestSlowClockSampleKeepsTightEstimate(t *testing.T) {
	var c serverClock
	t0 := time.Now()
	srv := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tight := clockSample{base: t0, server: srv, bound: 2 * time.Millisecond}
	if !c.offer(tight, t0) {
		t.Fatal("the first sample was not taken")
	}
	// Sent at t0+10s, answered 3s later: the midpoint says the server
	// read srv+13s at t0+11.5s, 1.5s fast if the server answered at the
	// end of the stall.
	slow := clockSample{base: t0.Add(11500 * time.Millisecond), server: srv.Add(13 * time.Second), bound: 1501 * time.Millisecond}
	if c.offer(slow, t0.Add(13*time.Second)) {
		t.Error("a sample with a 3s round trip replaced one with a 4ms round trip")
	}
	r := c.at(t0.Add(20 * time.Second))
	if want := srv.Add(20 * time.Second); !r.mid.Equal(want) {
		t.Errorf("estimate at t0+20s = %v; want %v (the tight sample's)", r.mid, want)
	}
	if want := 2*time.Millisecond + 20*time.Second/maxDriftDiv; r.bound != want {
		t.Errorf("bound at t0+20s = %v; want %v (the sample's, plus drift)", r.bound, want)
	}
	if !r.early().Before(r.mid) || !r.late().After(r.mid) {
		t.Errorf("reading %+v: early %v, late %v do not enclose it", r, r.early(), r.late())
	}
	// An hour later the tight sample's bound has grown to 1.8s: a 1s
	// sample is tighter now.
	later := t0.Add(time.Hour)
	newer := clockSample{base: later, server: srv.Add(time.Hour), bound: time.Second}
	if !c.offer(newer, later) {
		t.Error("a sample tighter than the aged estimate was refused")
	}
}

// TestWideClockBoundLeavesExpiredRecord: while the estimate's bound is
// wider than a tenth of the TTL and no tighter sample can be taken, an
// Acquire does not take over an expired record of another owner; it is
// refused with an error matching ErrClockUncertain and
// driver.ErrNotAcquired. Once a sample is due again, the tight sample
// lets the takeover happen.
func TestWideClockBoundLeavesExpiredRecord(t *testing.T) {
	raw := testenv.URL(t, "FENCELOCK_TEST_MONGO")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := mongo.Connect(options.Client().ApplyURI(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Disconnect(context.Background())
	coll := "locks_clock_" + time.Now().Format("150405.000000")
	t.Cleanup(func() {
		_ = client.Database("fencelock_test").Collection(coll).Drop(context.Background())
		for _, n := range TokenCollections(coll) {
			_ = client.Database("fencelock_test").Collection(n).Drop(context.Background())
		}
	})
	b, err := New(ctx, client, &Options{Database: "fencelock_test", Collection: coll})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const ttl = time.Second
	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "gone", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	for {
		info, err := b.Inspect(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if !info.Locked() {
			break
		}
		time.Sleep(info.Remaining + 10*time.Millisecond) // the record's expiry: a time, not an event
	}
	// Widen the estimate's bound past ttl/10 (with a sample just tried),
	// by less than the record has been expired.
	time.Sleep(400 * time.Millisecond)
	b.clock.mu.Lock()
	b.clock.cur.bound = 300 * time.Millisecond
	b.clock.tried = time.Now()
	b.clock.mu.Unlock()
	_, err = b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "next", TTL: ttl})
	if !errors.Is(err, ErrClockUncertain) || !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire with a ±300ms clock over an expired record = %v; want ErrClockUncertain", err)
	}
	// A sample is due again: tighten takes one, and the takeover goes on.
	b.clock.mu.Lock()
	b.clock.tried = time.Now().Add(-retightenEvery)
	b.clock.mu.Unlock()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "next", TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire after a tight sample = %v; want the takeover", err)
	}
	if g.Token != 2 {
		t.Errorf("takeover token = %d; want 2", g.Token)
	}
}
