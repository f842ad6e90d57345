package fencelock_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// An Acquire whose WithWait bound passed while the store was failing
// reports both: the key was not acquired within the bound (ErrNotAcquired)
// and why (the store's last failure), as one whose context's deadline
// passed does.
func TestAcquireWithWaitOnFailingStoreCarriesStoreCause(t *testing.T) {
	for name, wrap := range map[string]func(*fakebackend.Fake) driver.Backend{
		"polling": func(f *fakebackend.Fake) driver.Backend { return f.Backend() },
		"queue":   queued,
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				b := newFaulty(store)
				// A TTL shorter than the wait: the first attempt is cut
				// at its bound, then the wait goes on until WithWait's.
				c := newClient(t, wrap(b), &fencelock.Options{TTL: time.Second, ReleaseTimeout: 2 * time.Second})
				b.SetAll(silent)
				var err error
				within(t, b, c, 1500*time.Millisecond+2*time.Second, "Acquire(WithWait(1.5s)) on a silent store", func() {
					_, err = c.Acquire(context.Background(), "k", fencelock.WithWait(1500*time.Millisecond))
				})
				if !errors.Is(err, fencelock.ErrNotAcquired) {
					t.Errorf("Acquire = %v; want an error matching ErrNotAcquired (the wait bound passed)", err)
				}
				var be *fencelock.BackendError
				if !errors.As(err, &be) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer") {
					t.Errorf("Acquire = %v; want it to carry the store's failure (a *BackendError: no answer)", err)
				}

				// A store that refuses connections: its cause by errors.Is.
				b.SetAll(refusing)
				within(t, b, c, 1500*time.Millisecond+2*time.Second, "Acquire(WithWait(1.5s)) on a refusing store", func() {
					_, err = c.Acquire(context.Background(), "k", fencelock.WithWait(1500*time.Millisecond))
				})
				if !errors.Is(err, fencelock.ErrNotAcquired) || !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("Acquire = %v; want ErrNotAcquired joined with connection refused", err)
				}
				b.SetAll(nil)
			})
		})
	}
}

// A WithWait bound that passed before the caller's context ended is the
// call's outcome, even when the caller's context ends before Acquire
// returns (its clean-up still running).
func TestAcquireWithWaitBoundPassedBeforeCallerCancelledIsNotAcquired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), boundOpts())
		// Every request hangs: at the wait bound the attempt in flight
		// gets the overrun budget; the caller cancels meanwhile.
		b.SetAll(silent)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		time.AfterFunc(1500*time.Millisecond, cancel)
		var err error
		within(t, b, c, time.Second+2*time.Second, "Acquire(WithWait(1s))", func() {
			_, err = c.Acquire(ctx, "k", fencelock.WithWait(time.Second))
		})
		if !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Errorf("Acquire = %v; want ErrNotAcquired: the wait bound passed before the caller cancelled", err)
		}
		b.SetAll(nil)
	})
}
