package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// newClient returns a fencelock.Client of b (TTL one minute: no renewal
// runs during a test) that closes when the test ends.
func newClient(t *testing.T, b driver.Backend) *fencelock.Client {
	t.Helper()
	c, err := fencelock.New(b, &fencelock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// crashedDualHolder acquires "k" through a dual client of oldStore and
// newStore and then cuts that client off from both stores, as if its
// process had crashed: its records stay until they expire. The client is
// reconnected and closed when the test ends.
func crashedDualHolder(t *testing.T, oldStore, newStore *memory.Store) *fencelock.Lease {
	t.Helper()
	oldB, newB := oldStore.Backend(), newStore.Backend()
	c, err := fencelock.New(mustDual(t, oldB, newB), &fencelock.Options{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	oldB.SetUnreachable(true)
	newB.SetUnreachable(true)
	t.Cleanup(func() {
		oldB.SetUnreachable(false)
		newB.SetUnreachable(false)
		c.Close()
	})
	return l
}

// checkDualReportsHolder checks that every view of "k" through a dual
// client (Inspect, List, Leader, Observe's first delivery) names want.
func checkDualReportsHolder(t *testing.T, c *fencelock.Client, want *fencelock.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if info, err := c.Inspect(ctx, "k"); err != nil || info.Owner != want.Owner() || info.Token != want.Token() {
		t.Errorf("Inspect = %+v, %v; want holder %q, token %d", info, err, want.Owner(), want.Token())
	}
	if infos, err := c.List(ctx, ""); err != nil || len(infos) != 1 || infos[0].Owner != want.Owner() || infos[0].Token != want.Token() {
		t.Errorf("List = %+v, %v; want one key held by %q, token %d", infos, err, want.Owner(), want.Token())
	}
	if l, err := c.Leader(ctx, "k"); err != nil || l.Owner != want.Owner() || l.Token != want.Token() {
		t.Errorf("Leader = %+v, %v; want %q, token %d", l, err, want.Owner(), want.Token())
	}
	ch, err := c.Observe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-ch:
		if l.Owner != want.Owner() || l.Token != want.Token() {
			t.Errorf("Observe delivered %+v first; want %q, token %d", l, want.Owner(), want.Token())
		}
	case <-ctx.Done():
		t.Fatal("Observe delivered nothing")
	}
	cancel()
	for range ch { // Observe closes its channel once ctx ends
	}
}

// Defect: with phase-1 (old only) and phase-2 (dual) clients running, the
// old backend decides who holds a key. A dual holder whose last renewal
// failed on the old side only, then crashed, has its old record expire
// first (Store.Expire stands for that earlier expiry); an old-only client
// takes the key. Until the crashed holder's new record expired, the dual
// backend reported the new side's holder whenever the sides disagreed, so
// every dual client's Inspect, List, Leader and Observe named the crashed
// holder instead of the one the arbiter had granted the key to.
func TestDualReportsTheOldOnlyHolderAfterADualHolderLostTheOldSide(t *testing.T) {
	oldStore, newStore := memory.NewStore(), memory.NewStore()
	crashed := crashedDualHolder(t, oldStore, newStore)
	if !oldStore.Expire("k") {
		t.Fatal("the crashed holder had no record on the old side")
	}
	oldOnly, err := newClient(t, oldStore.Backend()).TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatalf("old-only TryAcquire after the crashed holder's old record expired = %v", err)
	}
	if info, _ := newStore.Backend().Inspect(t.Context(), "k"); info.Owner != crashed.Owner() {
		t.Fatalf("new side = %+v; the test needs the crashed holder's record there", info)
	}
	checkDualReportsHolder(t, newClient(t, mustDual(t, oldStore.Backend(), newStore.Backend())), oldOnly)
}

// The mirror image, with dual (phase-2) and new-only (phase-3) clients:
// the new backend decides. A crashed dual holder's new record expires
// first and a new-only client takes the key; every dual client must name
// that client, not the crashed holder whose old record is still there.
func TestDualReportsTheNewOnlyHolderAfterADualHolderLostTheNewSide(t *testing.T) {
	oldStore, newStore := memory.NewStore(), memory.NewStore()
	crashed := crashedDualHolder(t, oldStore, newStore)
	if !newStore.Expire("k") {
		t.Fatal("the crashed holder had no record on the new side")
	}
	newOnly, err := newClient(t, newStore.Backend()).TryAcquire(t.Context(), "k")
	if err != nil {
		t.Fatalf("new-only TryAcquire after the crashed holder's new record expired = %v", err)
	}
	if info, _ := oldStore.Backend().Inspect(t.Context(), "k"); info.Owner != crashed.Owner() {
		t.Fatalf("old side = %+v; the test needs the crashed holder's record there", info)
	}
	checkDualReportsHolder(t, newClient(t, mustDual(t, oldStore.Backend(), newStore.Backend())), newOnly)
}
