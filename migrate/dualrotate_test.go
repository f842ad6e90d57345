package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/migrate"
)

// errInjected is the transient failure flaky injects.
var errInjected = errors.New("injected transient failure")

// flaky wraps one side of a Dual and fails that side's next renewal call
// (Renew or RenewBatch, whole call or per grant) once, on demand, without
// touching the store: a transient failure of one side only.
type flaky struct {
	*memory.Backend
	mu       sync.Mutex
	failNext string // "", "batch" (whole call), "grant" (per grant), "renew", "floor" (RaiseFloor)
}

func (f *flaky) arm(how string) {
	f.mu.Lock()
	f.failNext = how
	f.mu.Unlock()
}

func (f *flaky) take(how string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failNext == how {
		f.failNext = ""
		return true
	}
	return false
}

func (f *flaky) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if f.take("renew") {
		return driver.Grant{}, errInjected
	}
	return f.Backend.Renew(ctx, g, req)
}

func (f *flaky) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	if f.take("floor") {
		return errInjected
	}
	return f.Backend.RaiseFloor(ctx, key, floor)
}

func (f *flaky) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if f.take("batch") {
		return nil, errInjected
	}
	if f.take("grant") {
		res := make([]driver.RenewResult, len(grants))
		for i := range res {
			res[i].Err = errInjected
		}
		return res, nil
	}
	return f.Backend.RenewBatch(ctx, grants, req)
}

// dualWithFlakySide returns a Dual whose old or new side can be failed
// once, the two memory backends, and that side.
func dualWithFlakySide(t *testing.T, flakySide string) (d *migrate.Dual, old, new *memory.Backend, f *flaky) {
	t.Helper()
	old, new = memory.New(), memory.New()
	var oldB, newB driver.Backend = old, new
	if flakySide == "old" {
		f = &flaky{Backend: old}
		oldB = f
	} else {
		f = &flaky{Backend: new}
		newB = f
	}
	d = mustDual(t, oldB, newB)
	t.Cleanup(func() { d.Close() })
	return d, old, new, f
}

func acquireDual(t *testing.T, d *migrate.Dual, n int) []driver.Grant {
	t.Helper()
	gs := make([]driver.Grant, n)
	for i := range gs {
		g, err := d.Acquire(t.Context(), driver.AcquireRequest{Key: fmt.Sprintf("k%d", i), Owner: fmt.Sprintf("o%d", i), TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = g
	}
	return gs
}

// checkHeldOnBoth fails unless g's owner holds g's key on both sides, at
// tokens no higher than g's (the dual token is the larger side's).
func checkHeldOnBoth(t *testing.T, old, new *memory.Backend, g driver.Grant) {
	t.Helper()
	for name, side := range map[string]*memory.Backend{"old": old, "new": new} {
		info, err := side.Inspect(t.Context(), g.Key)
		if err != nil || info.Owner != g.Owner || info.Token > g.Token {
			t.Errorf("%s side of %q = %+v, %v; want held by %q at a token ≤ %d", name, g.Key, info, err, g.Owner, g.Token)
		}
	}
}

// The defect: a rotating batch renewal that succeeded on one side and
// failed transiently on the other was reported as failed, so the engine
// kept the old dual grants and retried with them; the side that had
// rotated then answered ErrNotHeld (its token had changed), and every
// lease in the batch was lost though nobody else held any of them. The
// retry with the old grants must renew them all.
func TestDualRotatingBatchRenewalSurvivesOneSidesTransientError(t *testing.T) {
	for _, c := range []struct{ side, how string }{
		{"new", "batch"}, {"old", "batch"}, // the side's whole call fails
		{"new", "grant"}, {"old", "grant"}, // each grant fails on that side
	} {
		t.Run(c.side+"/"+c.how, func(t *testing.T) {
			ctx := t.Context()
			d, old, new, f := dualWithFlakySide(t, c.side)
			gs := acquireDual(t, d, 3)
			req := driver.RenewRequest{TTL: time.Minute, Rotate: true}

			f.arm(c.how)
			res, err := d.RenewBatch(ctx, gs, req)
			if err == nil {
				for i, r := range res {
					if r.Err == nil || errors.Is(r.Err, driver.ErrNotHeld) {
						t.Fatalf("grant %d of the batch whose %s side failed: %+v; want a transient error", i, c.side, r)
					}
				}
			} else if errors.Is(err, driver.ErrNotHeld) {
				t.Fatalf("batch whose %s side failed transiently = %v; want a transient error", c.side, err)
			}

			// The engine retries with the grants it still holds.
			res, err = d.RenewBatch(ctx, gs, req)
			if err != nil {
				t.Fatalf("retry = %v", err)
			}
			for i, r := range res {
				if r.Err != nil || r.Grant.Token <= gs[i].Token {
					t.Fatalf("retry of grant %d = %+v; want renewed above token %d (the lease was lost to the other side's rotation)", i, r, gs[i].Token)
				}
				checkHeldOnBoth(t, old, new, r.Grant)
			}
			// The renewed grants go on as usual.
			for _, r := range res {
				if err := d.Release(ctx, r.Grant); err != nil {
					t.Errorf("Release(%+v) = %v", r.Grant, err)
				}
			}
		})
	}
}

// The same defect in Dual's single-lease Renew.
func TestDualRotatingRenewSurvivesOneSidesTransientError(t *testing.T) {
	for _, side := range []string{"old", "new"} {
		t.Run(side, func(t *testing.T) {
			ctx := t.Context()
			d, old, new, f := dualWithFlakySide(t, side)
			g := acquireDual(t, d, 1)[0]
			req := driver.RenewRequest{TTL: time.Minute, Rotate: true}

			f.arm("renew")
			if _, err := d.Renew(ctx, g, req); err == nil || errors.Is(err, driver.ErrNotHeld) {
				t.Fatalf("Renew whose %s side failed transiently = %v; want a transient error", side, err)
			}
			ng, err := d.Renew(ctx, g, req)
			if err != nil || ng.Token <= g.Token {
				t.Fatalf("retry = %+v, %v; want renewed above token %d (the lease was lost to the other side's rotation)", ng, err, g.Token)
			}
			checkHeldOnBoth(t, old, new, ng)
			if err := d.Release(ctx, ng); err != nil {
				t.Fatalf("Release = %v", err)
			}
		})
	}
}

// The same loss when both sides rotated but the floors could not be
// levelled afterwards: the renewal fails transiently, and the retry with
// the old dual grant must still renew (and level).
func TestDualRotatingRenewalSurvivesAFailedFloorRaise(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			ctx := t.Context()
			d, old, new, f := dualWithFlakySide(t, "new")
			g := acquireDual(t, d, 1)[0]
			// The old side's tokens run ahead, so the rotation must raise
			// the new side's floor.
			if err := old.RaiseFloor(ctx, g.Key, 1000); err != nil {
				t.Fatal(err)
			}
			req := driver.RenewRequest{TTL: time.Minute, Rotate: true}
			renew := func() (driver.Grant, error) {
				if !batch {
					return d.Renew(ctx, g, req)
				}
				res, err := d.RenewBatch(ctx, []driver.Grant{g}, req)
				if err != nil {
					return driver.Grant{}, err
				}
				return res[0].Grant, res[0].Err
			}
			f.arm("floor")
			if _, err := renew(); err == nil || errors.Is(err, driver.ErrNotHeld) {
				t.Fatalf("renewal whose floor raise failed = %v; want a transient error", err)
			}
			ng, err := renew()
			if err != nil || ng.Token <= g.Token {
				t.Fatalf("retry = %+v, %v; want renewed above token %d", ng, err, g.Token)
			}
			checkHeldOnBoth(t, old, new, ng)
			// Levelled: the new side alone now issues above the dual token.
			if err := d.Release(ctx, ng); err != nil {
				t.Fatal(err)
			}
			sg, err := new.Acquire(ctx, driver.AcquireRequest{Key: g.Key, Owner: "new-only", TTL: time.Minute})
			if err != nil || sg.Token <= ng.Token {
				t.Fatalf("new-only Acquire after the dual holder = %+v, %v; want a token above %d", sg, err, ng.Token)
			}
		})
	}
}

// Defect (found by the generative mode on a Dual of two memory stores): a
// release that raced a rotating renewal removed one side's record and was
// refused by the other, whose record had moved to its rotated token. The
// engine's clean-up by owner then sent a grant looked up by owner; the side
// already released had no record of the owner's and Dual answered "not
// held", so Do reported a lease lost that nobody else ever held.
func TestDualReleaseByOwnerReleasesWhatRemains(t *testing.T) {
	ctx := t.Context()
	old, new := memory.New(), memory.New()
	d := mustDual(t, old, new)
	_, err := d.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The rotation reached the old side; the holder's release reached
	// the new side with the pre-rotation sub-grant and was refused by
	// the old side. (Dual.Release now takes the moved record itself,
	// TestReleaseAfterOneSideRotatedReleasesBoth; this is the state an
	// earlier attempt whose look-up failed leaves to the engine.)
	oi, _ := old.Inspect(ctx, "k")
	if _, err := old.Renew(ctx, driver.Grant{Key: "k", Owner: "o", Token: oi.Token}, driver.RenewRequest{TTL: time.Minute, Rotate: true}); err != nil {
		t.Fatal(err)
	}
	ni, _ := new.Inspect(ctx, "k")
	if err := new.Release(ctx, driver.Grant{Key: "k", Owner: "o", Token: ni.Token}); err != nil {
		t.Fatal(err)
	}
	// The engine's clean-up: look the key up, release by owner.
	info, err := d.Inspect(ctx, "k")
	if err != nil || info.Owner != "o" {
		t.Fatalf("Inspect = %+v, %v; want the owner's record on the old side", info, err)
	}
	if err := d.Release(ctx, driver.Grant{Key: "k", Owner: "o", Token: info.Token}); err != nil {
		t.Errorf("Release by owner = %v, want nil: it removed what was left of the lease", err)
	}
	for name, b := range map[string]*memory.Backend{"old": old, "new": new} {
		if i, err := b.Inspect(ctx, "k"); err != nil || i.Locked() {
			t.Errorf("%s side after release: %+v, %v; want free", name, i, err)
		}
	}
	// Nothing of the owner's anywhere: still "not held".
	if err := d.Release(ctx, driver.Grant{Key: "k", Owner: "o", Token: info.Token}); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Release by owner of a free key = %v, want ErrNotHeld", err)
	}
}
