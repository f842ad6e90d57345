package fencelock_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// closeBound is Close's bound with boundOpts: ReleaseTimeout (2s) plus
// its grace, a tenth of it.
const closeBound = 2*time.Second + 200*time.Millisecond

func TestCloseReturnsWithinReleaseTimeoutWhateverTheStoreDoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		// The store's own Close blocks until the test lets it go, as a
		// driver's Close does that waits on an unreachable store (etcd's
		// client, say).
		b.OnClose(func(next func() error) error {
			<-b.Gone().Done()
			return next()
		})
		c := newClient(t, b.Backend(), boundOpts())
		defer b.LetGo() // the backend's Close, still blocked, returns
		// Held leases, whose releases Close makes.
		for _, k := range []string{"a", "b", "c"} {
			if _, err := c.Acquire(context.Background(), k); err != nil {
				t.Fatal(err)
			}
		}
		// A clean-up left to the background: the attempt was applied,
		// its answer never came, and looking the record up hangs.
		b.SetLate(fakebackend.Acquire, silent)
		b.Set(fakebackend.Inspect, silent)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		within(t, b, c, 3*time.Second, "TryAcquire(1s deadline)", func() {
			_, _ = c.TryAcquire(ctx, "t")
		})
		// Then the store stops answering altogether, with an Acquire in
		// flight.
		b.SetLate(fakebackend.Acquire, nil)
		b.SetAll(silent)
		acquired := make(chan error, 1)
		go func() {
			_, err := c.Acquire(context.Background(), "w")
			acquired <- err
		}()
		synctest.Wait()

		var err error
		within(t, b, c, closeBound, "Close on a silent store whose own Close hangs", func() { err = c.Close() })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Close = %v; want an error matching DeadlineExceeded (the backend's Close did not return)", err)
		}
		if err := <-acquired; !errors.Is(err, fencelock.ErrClosed) {
			t.Errorf("Acquire in flight at Close = %v; want ErrClosed", err)
		}
	})
}

func TestCloseReleasesAndClosesTheBackendWhenTheStoreAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), boundOpts())
		for _, k := range []string{"a", "b"} {
			if _, err := c.Acquire(context.Background(), k); err != nil {
				t.Fatal(err)
			}
		}
		// The backend's own Close returned within the budget: no
		// error says it goes on in the background.
		if err := c.Close(); err != nil {
			t.Errorf("Close = %v; want nil", err)
		}
		for _, k := range []string{"a", "b"} {
			if owner := heldBy(t, store, k); owner != "" {
				t.Errorf("Close left %q held by %q", k, owner)
			}
		}
	})
}
