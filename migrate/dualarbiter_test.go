package migrate_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/recipe"
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
	if l, err := recipe.CurrentLeader(ctx, c, "k"); err != nil || l.Owner != want.Owner() || l.Token != want.Token() {
		t.Errorf("Leader = %+v, %v; want %q, token %d", l, err, want.Owner(), want.Token())
	}
	ch, err := recipe.Observe(ctx, c, "k")
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

// failRenewalOnce wraps one side of a Dual: once armed, its next renewal
// (Renew or RenewBatch) fails transiently without reaching the store, and
// hit closes.
type failRenewalOnce struct {
	*memory.Backend
	armed atomic.Bool
	hit   chan struct{}
}

func (f *failRenewalOnce) fail() bool {
	if f.armed.CompareAndSwap(true, false) {
		close(f.hit)
		return true
	}
	return false
}

func (f *failRenewalOnce) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if f.fail() {
		return driver.Grant{}, errInjected
	}
	return f.Backend.Renew(ctx, g, req)
}

func (f *failRenewalOnce) RenewBatch(ctx context.Context, gs []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if f.fail() {
		return nil, errInjected
	}
	return f.Backend.RenewBatch(ctx, gs, req)
}

// Defect: a rotating renewal that one side failed transiently rotated the
// other side's token without raising the failed side's floor (levelling
// waited for the engine's retry). If the holder crashed then, the failed
// side's record expired first and the client that took the key there got
// a token no larger than the holder's rotated one on the other side, so
// every dual client reported the crashed holder (the larger token, see
// merge) instead of the one the arbiter had granted the key to: in 1+2
// (the old side failed, an old-only client took the key) and in 2+3 (the
// new side failed, a new-only client took it).
func TestDualReportsTheArbitersHolderAfterAHalfRotatedHolderCrashed(t *testing.T) {
	for _, failing := range []string{"old", "new"} {
		t.Run(failing+" side failed", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				oldStore, newStore := memory.NewStore(), memory.NewStore()
				oldB, newB := oldStore.Backend(), newStore.Backend()
				f := &failRenewalOnce{hit: make(chan struct{})}
				var oldSide, newSide driver.Backend = oldB, newB
				failedStore, rotatedStore := oldStore, newStore
				if failing == "old" {
					f.Backend, oldSide = oldB, f
				} else {
					f.Backend, newSide = newB, f
					failedStore, rotatedStore = newStore, oldStore
				}
				holder, err := fencelock.New(mustDual(t, oldSide, newSide), &fencelock.Options{TTL: 3 * time.Second, RotateEvery: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				l, err := holder.Acquire(t.Context(), "k")
				if err != nil {
					t.Fatal(err)
				}
				f.armed.Store(true)
				<-f.hit         // the first renewal, a rotating one, fails on one side
				synctest.Wait() // and has finished on the other
				oldB.SetUnreachable(true)
				newB.SetUnreachable(true) // the holder crashes
				t.Cleanup(func() {
					oldB.SetUnreachable(false)
					newB.SetUnreachable(false)
					holder.Close()
				})
				if got := rotatedStore.TokenOf("k"); got <= l.Token() {
					t.Fatalf("the %s side's token is %d after the renewal; the test needs it rotated above %d", map[bool]string{true: "new", false: "old"}[failing == "old"], got, l.Token())
				}
				if !failedStore.Expire("k") {
					t.Fatalf("the crashed holder had no record on the %s side", failing)
				}
				other, err := newClient(t, failedStore.Backend()).TryAcquire(t.Context(), "k")
				if err != nil {
					t.Fatalf("%s-only TryAcquire after the crashed holder's record there expired = %v", failing, err)
				}
				checkDualReportsHolder(t, newClient(t, mustDual(t, oldStore.Backend(), newStore.Backend())), other)
			})
		})
	}
}
