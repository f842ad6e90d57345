package generative

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

// quietLoss is a memory backend that pushes no loss: a forced-away record
// is found by the holder's next call, as on a store that does not push.
type quietLoss struct{ *memory.Backend }

func (quietLoss) NotifyLoss(driver.Grant, func(error)) func() { return func() {} }

// Defect (found by TestGenerativeMemoryOldAndDual under load, as
// StaleCallsRefused): a lease with a lock delay whose release went into
// its minimum hold, and whose hold renewal migrate.Dual refused (the
// administrator's force-release had removed the new side's record and not
// yet the old side's), was taken as confirmed gone, so the stale release
// by owner that then removed the old side's record, which Dual leaves to
// expire for the delay's sake, counted as a violation. A refused hold
// renewal of a delayed lease confirms the lease ended, not that its
// record is gone; one without a delay, or a refused Release, still does.
// Mutation caught: refusedHoldMayLeaveRecord always false (the old
// judgement), or true without a lock delay.
func TestRefusedHoldRenewalConfirmsGoneOnlyWithoutALockDelay(t *testing.T) {
	for _, tc := range []struct {
		name     string
		minHold  time.Duration
		delay    time.Duration
		mayLeave bool
	}{
		{"hold and delay", 10 * time.Second, 4 * time.Second, true},
		{"hold, no delay", 10 * time.Second, 0, false},
		{"delay, no hold", 0, 4 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := memory.NewStore()
				c, err := fencelock.New(quietLoss{s.Backend()}, &fencelock.Options{TTL: 3 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				opts := []fencelock.AcquireOption{}
				if tc.minHold > 0 {
					opts = append(opts, fencelock.WithMinHold(tc.minHold))
				}
				if tc.delay > 0 {
					opts = append(opts, fencelock.WithLockDelay(tc.delay))
				}
				l, err := c.Acquire(t.Context(), "k", opts...)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Backend().ForceRelease(t.Context(), "k"); err != nil {
					t.Fatal(err)
				}
				if err := l.Release(t.Context()); !errors.Is(err, fencelock.ErrNotHeld) || l.Err() != nil {
					t.Fatalf("Release after the record was forced away = %v (lease error %v); want ErrNotHeld found at release", err, l.Err())
				}
				r := newRecorder()
				rec := &leaseRec{id: 1, key: "k", owner: l.Owner()}
				r.delayed(rec, tc.delay)
				if got := r.refusedHoldMayLeaveRecord(rec, l); got != tc.mayLeave {
					t.Errorf("refusedHoldMayLeaveRecord = %v (cause %v); want %v", got, context.Cause(l.Context()), tc.mayLeave)
				}
			})
		})
	}
}
