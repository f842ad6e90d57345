package migrate_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// TestRefusedRenewalKeepsTheOtherSidesLockDelay: a dual lease acquired
// with a lock delay that one side refuses to renew has ended without a
// release, so the other side must keep the key from its own clients (the
// ones not yet migrated, or already migrated) for the record's TTL and
// then the delay, as it would for a single-store lease that was lost: a
// release there would free the key at once while the dual holder's last
// writes may still land. Without the delay the other side's record is
// released (TestRenewRefusedByOneSideReleasesTheOther).
func TestRefusedRenewalKeepsTheOtherSidesLockDelay(t *testing.T) {
	ctx := t.Context()
	for _, refuser := range []int{0, 1} {
		name := []string{"old refuses", "new refuses"}[refuser]
		t.Run(name, func(t *testing.T) {
			old, new := memory.New(), memory.New()
			sides := [2]driver.Backend{old, new}
			d := mustDual(t, old, new)
			g, err := d.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "dual", TTL: time.Minute, LockDelay: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			// The refusing side loses the record (a takeover there).
			if _, err := sides[refuser].(driver.ForceReleaser).ForceRelease(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute}); !errors.Is(err, driver.ErrNotHeld) {
				t.Fatalf("Renew after one side lost the record = %v, want ErrNotHeld", err)
			}
			other := sides[1-refuser]
			_, err = other.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "single", TTL: time.Minute, LockDelay: time.Minute})
			var held *driver.HeldError
			if !errors.As(err, &held) {
				t.Fatalf("a single-store client's Acquire on the other side right after the dual lease ended = %v, want a HeldError: the lease ended without a release and asked for a lock delay", err)
			}
		})
	}
}
