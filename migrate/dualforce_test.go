package migrate_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// Defect (found by TestGenerativeMemoryOldAndDual under load, as
// NothingHeldButTheGrant: a semaphore permit forced away while it was
// being acquired stayed held on the new side): ForceRelease forces the
// new side, then the old one. A dual Acquire that took the old side
// before the force-release reached it, and the new side after it had
// passed there, was left with a record on the new side only. Its lease
// was over (the old side's push told its holder at once, and the engine
// neither renews nor releases a lost lease), yet the record kept the key
// from every dual client and from the new side's own until its TTL, and
// Inspect named the forced holder. Mutation caught: dropping the call of
// forceStraggler from ForceRelease.
func TestForceReleaseRacingAnAcquireLeavesNothingOnEitherSide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		oldStore, newStore := memory.NewStore(), memory.NewStore()
		// The administrator's old side stops before forcing, after the
		// new side was forced: the window in which the Acquire runs.
		sf := &slowForce{Backend: oldStore.Backend(), started: make(chan struct{}), proceed: make(chan struct{})}
		admin := mustDual(t, sf, newStore.Backend())
		holder := mustDual(t, oldStore.Backend(), newStore.Backend())
		ctx := t.Context()
		forced := make(chan error, 1)
		var removed driver.Info
		go func() {
			var err error
			removed, err = admin.ForceRelease(ctx, "k")
			forced <- err
		}()
		<-sf.started // the new side has been forced (it was free)
		g, err := holder.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "holder", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		lost := make(chan error, 1)
		stop := holder.NotifyLoss(g, func(cause error) { lost <- cause })
		defer stop()
		close(sf.proceed) // the old side is forced now, the holder's record with it
		if err := <-forced; err != nil {
			t.Fatalf("ForceRelease = %v", err)
		}
		if removed.Owner != "holder" {
			t.Errorf("ForceRelease returned %+v; want the holder's record", removed)
		}
		select {
		case <-lost:
		case <-time.After(time.Second):
			t.Errorf("the holder was not told its lease was forced away")
		}
		if info, err := newStore.Backend().Inspect(ctx, "k"); err != nil || info.Locked() {
			t.Errorf("the new side after the force-release = %+v, %v; want the key free: the forced holder's lease is over", info, err)
		}
		if info, err := admin.Inspect(ctx, "k"); err != nil || info.Locked() {
			t.Errorf("dual Inspect after the force-release = %+v, %v; want the key free", info, err)
		}
		other := mustDual(t, oldStore.Backend(), newStore.Backend())
		if _, err := other.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "other", TTL: time.Minute}); err != nil {
			t.Errorf("a dual Acquire after the force-release = %v; want the key", err)
		}
		if _, err := holder.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute}); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("the forced holder's renewal = %v; want ErrNotHeld", err)
		}
	})
}
