package fencelock_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// renewFails is a real memory backend whose renewals fail (the holder
// cut off from the store for renewals, not for its other requests).
type renewFails struct{ *memory.Backend }

var errCutOff = errors.New("renewal cut off")

func (renewFails) Renew(context.Context, driver.Grant, driver.RenewRequest) (driver.Grant, error) {
	return driver.Grant{}, errCutOff
}

func (renewFails) RenewBatch(context.Context, []driver.Grant, driver.RenewRequest) ([]driver.RenewResult, error) {
	return nil, errCutOff
}

// A lease with a lock delay that is lost (its renewals failed until its
// validity ran out) ended without its holder's release: another acquirer
// with the same delay is refused until the delay has passed, even though
// the engine's clean-up after the loss reached the store.
func TestLockDelayKeepsGapAfterLossCleanup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		const delay = time.Minute
		a := newClient(t, renewFails{store.Backend()}, &fencelock.Options{TTL: 3 * time.Second, LockDelay: delay})
		b := newClient(t, store.Backend(), &fencelock.Options{TTL: 3 * time.Second, LockDelay: delay})
		ctx := context.Background()
		l, err := a.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		<-l.Done()
		if l.Err() == nil {
			t.Fatalf("lease ended with no error; want a loss")
		}
		synctest.Wait() // the engine's clean-up after the loss has run (or waits)
		// Until the store's record expires, the key is held; from then on
		// it is in its lock delay, until delay after that end. (Sleeps
		// here advance the bubble's clock; they order nothing.)
		var end time.Time
		for i := 0; ; i++ {
			_, err := b.TryAcquire(ctx, "k")
			var he *fencelock.HeldError
			if !errors.As(err, &he) {
				t.Fatalf("TryAcquire %v after the loss = %v; want a *HeldError (held, then in the lock delay)", time.Duration(i)*time.Second, err)
			}
			if he.LockDelay > 0 {
				end = time.Now().Add(he.LockDelay)
				break
			}
			time.Sleep(he.Holder.Remaining + time.Millisecond)
			synctest.Wait()
		}
		time.Sleep(time.Until(end) - time.Millisecond)
		synctest.Wait()
		if l2, err := b.TryAcquire(ctx, "k"); err == nil {
			l2.Release(ctx)
			t.Fatalf("TryAcquire just before the lock delay's end was granted; want refused")
		}
		time.Sleep(2 * time.Millisecond)
		l2, err := b.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatalf("TryAcquire after the lock delay = %v; want granted", err)
		}
		l2.Release(ctx)
	})
}

// A force-release removes a holder's record and frees the key at once,
// but a key already in its lock delay (no holder: the record expired) has
// nothing to remove: the gap goes on, as documented in deploying.md.
func TestForceReleaseLeavesLockDelayGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		const delay = time.Minute
		a := newClient(t, store.Backend(), &fencelock.Options{LockDelay: delay})
		ctx := context.Background()
		l, err := a.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		store.Expire("k") // the holder's record ends without a release
		if info, err := a.ForceRelease(ctx, "k"); err != nil || info.Owner != "" {
			t.Fatalf("ForceRelease of a key in its lock delay = %+v, %v; want nothing removed", info, err)
		}
		var he *fencelock.HeldError
		if _, err := a.TryAcquire(ctx, "k"); !errors.As(err, &he) || he.LockDelay <= 0 {
			t.Errorf("TryAcquire after ForceRelease in the gap = %v; want a *HeldError with a LockDelay", err)
		}
		l.Release(ctx)
	})
}
