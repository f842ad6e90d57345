package mongo_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/faultproxy"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// TestRenewalAnsweredAfterItsTTLIsNotALoss: a renewal the store applied
// is a renewal, even when its answer takes longer than the TTL it asked
// for (a minimum-hold renewal asks for the rest of the hold, as little as
// driver.MinTTL, and a loaded server can take longer than that). The
// store received it while the record was live, and the TTL counts from
// that receipt; the engine bounds its own validity from when it sent the
// request. Telling the holder "not held" reported a loss nobody caused
// (the generative mode's NoLossWithoutCause, at a Do's release into its
// minimum hold). The request is held in a proxy for twice its TTL.
func TestRenewalAnsweredAfterItsTTLIsNotALoss(t *testing.T) {
	eachServer(t, testRenewalAnsweredAfterItsTTLIsNotALoss)
}

func testRenewalAnsweredAfterItsTTLIsNotALoss(t *testing.T, _ server, raw string) {
	p := newProxy(t, raw)
	// No clock sample in the renewal: its first command is its insert.
	u := withParams(t, viaProxy(t, p, raw), "database", testDatabase, "collection", freshCollection(t, raw), "clock_resync", "1h")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := mongolock.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "slow/renewal", Owner: "holder", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// A first renewal, so that the next one also deletes a claim.
	if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	const ttl = driver.MinTTL
	p.SetMode(faultproxy.Blackhole)
	type answer struct {
		g   driver.Grant
		err error
	}
	done := make(chan answer, 1)
	go func() {
		ng, err := b.Renew(ctx, g, driver.RenewRequest{TTL: ttl})
		done <- answer{ng, err}
	}()
	select {
	case <-p.Held(): // the renewal's insert waits in the proxy
	case <-ctx.Done():
		t.Fatal("the renewal never reached the proxy")
	}
	// The delay itself is the condition under test, not a synchronization.
	time.Sleep(2 * ttl)
	p.SetMode(faultproxy.Pass)
	a := <-done
	if a.err != nil {
		t.Fatalf("renewal with TTL %v answered after %v = %v; want the renewed grant: the store applied it", ttl, 2*ttl, a.err)
	}
	if a.g.Token != g.Token || a.g.Owner != g.Owner {
		t.Errorf("renewed grant = %+v; want owner %q token %d", a.g, g.Owner, g.Token)
	}
}
