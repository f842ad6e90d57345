package mongo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/faultproxy"
)

// TestStalledClockReadGrantsNoSecondHolder: the server stops answering
// (a proxy holds every byte, as a SIGSTOPped server would) for 2s while a
// client's periodic clock read (hello) is in flight. That sample's round
// trip is 2s, so its midpoint estimate runs about 1s fast, far beyond
// the Margin (300ms of a 3s TTL). Another client then holds a key and
// stops reaching the server; the first client must not be granted the
// key while that holder's lease is still valid by the holder's clock.
// (A clock that replaced its estimate with every sample took the key
// over about 2s into the holder's 2.7s of validity.)
func TestStalledClockReadGrantsNoSecondHolder(t *testing.T) {
	eachServer(t, testStalledClockReadGrantsNoSecondHolder)
}

func testStalledClockReadGrantsNoSecondHolder(t *testing.T, _ server, raw string) {
	const ttl = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	coll := freshCollection(t, raw)
	params := []string{"database", testDatabase, "collection", coll, "clock_resync", "6s",
		// No heartbeat during the test: the only bytes the stall holds
		// are the operations'.
		"heartbeatFrequencyMS", "60000"}
	pb := newProxy(t, raw)
	contender, err := fencelock.Open(ctx, withParams(t, viaProxy(t, pb, raw), params...), &fencelock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer contender.Close()
	opened := time.Now()
	pa := newProxy(t, raw)
	holder, err := fencelock.Open(ctx, withParams(t, viaProxy(t, pa, raw), params...), &fencelock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()

	// The contender's next operation after clock_resync reads the
	// server's clock first; the server stalls with that hello in flight.
	// (clock_resync is longer than the rest of the test takes, so no
	// later sample corrects a bad estimate by chance.)
	time.Sleep(time.Until(opened.Add(6100 * time.Millisecond))) // clock_resync must pass: a duration, not an event
	pb.SetMode(faultproxy.Blackhole)
	done := make(chan error, 1)
	go func() {
		l, err := contender.TryAcquire(ctx, "stall/other")
		if err == nil {
			err = l.Release(ctx)
		}
		done <- err
	}()
	select {
	case <-pb.Held():
	case err := <-done:
		t.Fatalf("TryAcquire through a stalled proxy returned %v before sending anything", err)
	}
	time.Sleep(2 * time.Second) // the stall: a fault's duration
	pb.SetMode(faultproxy.Pass)
	// Whatever this call's outcome (the stall may outlast its bound),
	// its clock read is what counts here.
	if err := <-done; err != nil {
		t.Logf("the call whose clock read stalled: %v", err)
	}

	// The holder takes the key, then stops reaching the server: its
	// lease stays valid by its own clock for TTL − Margin.
	l, err := holder.TryAcquire(ctx, "stall/key")
	if err != nil {
		t.Fatal(err)
	}
	validEnd := time.Now().Add(l.Remaining())
	pa.SetMode(faultproxy.Blackhole)

	wctx, wcancel := context.WithTimeout(ctx, 4*ttl)
	defer wcancel()
	l2, err := contender.Acquire(wctx, "stall/key")
	granted := time.Now()
	t.Logf("granted %v after the holder's validity ended", granted.Sub(validEnd).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("the contender was never granted the key after the holder stopped renewing: %v", err)
	}
	if granted.Before(validEnd) {
		t.Errorf("the contender was granted the key (token %d) %v before the holder's lease (token %d) ended by the holder's clock: two valid holders",
			l2.Token(), validEnd.Sub(granted).Round(time.Millisecond), l.Token())
	}
	if err := l2.Release(ctx); err != nil && !errors.Is(err, fencelock.ErrNotHeld) {
		t.Error(err)
	}
}
