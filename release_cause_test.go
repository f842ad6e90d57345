package fencelock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// A Release without a deadline that the store leaves unanswered fails
// with the engine's "no answer from the store" (matching
// context.DeadlineExceeded), not a bare context error.
func TestReleaseOnSilentStoreSaysTheStoreDidNotAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), boundOpts())
		l, err := c.Acquire(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		b.SetAll(silent)
		within(t, b, c, 2*time.Second, "Release(Background) on a silent store", func() {
			err = l.Release(context.Background())
		})
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer from the store") {
			t.Errorf("Release = %v; want DeadlineExceeded saying the store did not answer", err)
		}
		b.SetAll(nil)
	})
}

// earlyTimeout fails a request with a bare context.DeadlineExceeded a
// millisecond before its context's deadline, as a driver does that sets
// its socket's deadline from the context's (MongoDB's): the request's
// context is still live when the backend returns.
func earlyTimeout(ctx context.Context) error {
	dl, ok := ctx.Deadline()
	if !ok {
		<-ctx.Done()
		return ctx.Err()
	}
	t := time.NewTimer(time.Until(dl) - time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return context.DeadlineExceeded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A request that the driver timed out on its own, a moment before the
// engine's bound ended its context, is the store's failure all the same:
// the error after the caller's deadline names it.
func TestDriverTimeoutBeforeRequestBoundNamesTheStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), &fencelock.Options{TTL: time.Second, ReleaseTimeout: 2 * time.Second})
		b.Set(fakebackend.Acquire, earlyTimeout)
		b.Set(fakebackend.Inspect, silent) // the clean-up outlasts the caller's deadline
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var err error
		within(t, b, c, 2*time.Second+2*time.Second, "TryAcquire(2s deadline)", func() {
			_, err = c.TryAcquire(ctx, "k")
		})
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer from the store") {
			t.Errorf("TryAcquire = %v; want DeadlineExceeded joined with the store's cause (no answer)", err)
		}
		b.SetAll(nil)
	})
}
