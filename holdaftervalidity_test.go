package fencelock_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// TestHoldRenewalAfterValidityIsNoLoss: a lease released into its
// minimum hold while a renewal is in flight waits for that renewal's
// answer, at most until the lease's local validity ends, before it sends
// the hold renewal. On a slow store the hold renewal then reaches the
// store after the record's TTL, and the store says "not held": the
// record expired after the lease had been released, valid. That is not
// a loss of the lease (ErrNotHeld would tell the holder its work may not
// have been exclusive, and the generative mode's NoLossWithoutCause
// flagged it on a loaded MongoDB run); Release reports that the hold
// could not be kept, as ErrLocalExpiry, and a second Release returns nil.
func TestHoldRenewalAfterValidityIsNoLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		f := fakebackend.New(store.Backend(), fakebackend.Plain)
		c := newClient(t, f.Backend(), &fencelock.Options{TTL: 3 * time.Second})
		l, err := c.Acquire(t.Context(), "k", fencelock.WithMinHold(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		// Every renewal waits before the store: the first (in flight at
		// the release) and the hold renewal.
		gate := fakebackend.NewGate()
		f.Set(fakebackend.Renew, gate.Fault())
		<-gate.Reached()
		done := make(chan error, 1)
		go func() { done <- l.Release(t.Context()) }()
		// Past the lease's local validity and the record's TTL (3s from
		// the grant) while the hold renewal waits at the gate.
		time.Sleep(3 * time.Second)
		synctest.Wait()
		gate.Open()
		err = <-done
		if errors.Is(err, fencelock.ErrNotHeld) {
			t.Fatalf("Release = %v; want no ErrNotHeld: the lease was released while valid, and its record expired only after its validity", err)
		}
		if !errors.Is(err, fencelock.ErrLocalExpiry) {
			t.Fatalf("Release = %v; want ErrLocalExpiry (the hold renewal came after the lease's validity)", err)
		}
		if l.Err() != nil {
			t.Errorf("Err() = %v; want nil: the lease was released, not lost", l.Err())
		}
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("second Release = %v; want nil: the record is gone", err)
		}
		mustFree(t, store, "k")
	})
}
