package migrate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/migrate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func mustDual(t testing.TB, old, new driver.Backend) *migrate.Dual {
	t.Helper()
	d, err := migrate.NewDual(old, new)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestConformanceMemory runs the shared suite on a Dual of two memory
// stores: a dual lease is a lease like any other.
func TestConformanceMemory(t *testing.T) {
	old, new := memory.NewStore(), memory.NewStore()
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) {
			return migrate.NewDual(old.Backend(), new.Backend())
		},
	})
}

// noFloor hides a backend's optional interfaces, TokenFloorer included.
type noFloor struct{ driver.Backend }

func TestNewDualRequiresTokenFloors(t *testing.T) {
	for _, c := range []struct {
		name     string
		old, new driver.Backend
	}{
		{"old without floor", noFloor{memory.New()}, memory.New()},
		{"new without floor", memory.New(), noFloor{memory.New()}},
	} {
		_, err := migrate.NewDual(c.old, c.new)
		if !errors.Is(err, migrate.ErrNoFloor) || !errors.Is(err, driver.ErrUnsupported) {
			t.Errorf("%s: NewDual = %v, want ErrNoFloor (matching ErrUnsupported)", c.name, err)
		}
	}
	if _, err := migrate.NewDual(nil, memory.New()); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("NewDual(nil, …) = %v, want ErrInvalidOption", err)
	}
	if _, err := migrate.CopyTokens(t.Context(), noFloor{memory.New()}, memory.New(), ""); !errors.Is(err, migrate.ErrNoFloor) {
		t.Errorf("CopyTokens from a backend without floor = %v, want ErrNoFloor", err)
	}
}

// TestDualTokenAboveBothSides: the dual token exceeds every token either
// side issued, and afterwards each side on its own issues higher ones
// still: the continuity that lets old-only, dual and new-only clients
// share a downstream fence.
func TestDualTokenAboveBothSides(t *testing.T) {
	ctx := t.Context()
	for _, c := range []struct {
		name         string
		oldAt, newAt driver.Token
		wantAtLeast  driver.Token
		raisedOnOld  bool
	}{
		{"old ahead", 100, 5, 101, false},
		{"new ahead", 7, 300, 301, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			old, new := memory.New(), memory.New()
			if err := old.RaiseFloor(ctx, "k", c.oldAt); err != nil {
				t.Fatal(err)
			}
			if err := new.RaiseFloor(ctx, "k", c.newAt); err != nil {
				t.Fatal(err)
			}
			d := mustDual(t, old, new)
			g, err := d.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "dual", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if g.Token < c.wantAtLeast {
				t.Fatalf("dual token %d, want ≥ %d (above both sides' marks %d and %d)", g.Token, c.wantAtLeast, c.oldAt, c.newAt)
			}
			if info, err := d.Inspect(ctx, "k"); err != nil || info.Token != g.Token || info.Owner != "dual" {
				t.Fatalf("Inspect = %+v, %v; want owner dual, token %d", info, err, g.Token)
			}
			if err := d.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
			for name, side := range map[string]driver.Backend{"old": old, "new": new} {
				sg, err := side.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: name + "-only", TTL: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				if sg.Token <= g.Token {
					t.Errorf("%s-only client after the dual holder got token %d, not above the dual token %d", name, sg.Token, g.Token)
				}
				if err := side.Release(ctx, sg); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestDualHeldOnEitherSideRefuses: a key held on the old side (a
// not-yet-migrated client) or on the new side (an already-migrated one)
// refuses the dual client, and the refused attempt leaves nothing behind
// on the other side.
func TestDualHeldOnEitherSideRefuses(t *testing.T) {
	ctx := t.Context()
	for _, heldOn := range []string{"old", "new"} {
		t.Run(heldOn, func(t *testing.T) {
			old, new := memory.New(), memory.New()
			holderSide, otherSide := driver.Backend(old), driver.Backend(new)
			if heldOn == "new" {
				holderSide, otherSide = new, old
			}
			h, err := holderSide.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "single", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			d := mustDual(t, old, new)
			_, err = d.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "dual", TTL: time.Minute})
			var held *driver.HeldError
			if !errors.As(err, &held) || held.Holder.Owner != "single" {
				t.Fatalf("dual Acquire of a key held on the %s side = %v, want a HeldError naming the holder", heldOn, err)
			}
			if info, err := otherSide.Inspect(ctx, "k"); err != nil || info.Locked() {
				t.Fatalf("after the refused dual acquire the other side has %+v, %v: want nothing left", info, err)
			}
			if err := holderSide.Release(ctx, h); err != nil {
				t.Fatal(err)
			}
			g, err := d.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "dual", TTL: time.Minute})
			if err != nil {
				t.Fatalf("dual Acquire once free: %v", err)
			}
			if err := d.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLosingEitherSideEndsTheLease: a dual lease whose record vanishes
// from one side, or whose side becomes unreachable, is lost: no silent
// fall-back to the other side.
func TestLosingEitherSideEndsTheLease(t *testing.T) {
	for _, c := range []struct{ name, side, how string }{
		{"old record expired", "old", "expire"},
		{"new record expired", "new", "expire"},
		{"old unreachable", "old", "unreachable"},
		{"new unreachable", "new", "unreachable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			old, new := memory.New(), memory.New()
			victim := old
			if c.side == "new" {
				victim = new
			}
			cl, err := fencelock.New(mustDual(t, old, new), &fencelock.Options{TTL: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			l, err := cl.TryAcquire(t.Context(), "k")
			if err != nil {
				t.Fatal(err)
			}
			if c.how == "expire" {
				victim.Store().Expire("k")
			} else {
				victim.SetUnreachable(true)
			}
			select {
			case <-l.Done():
			case <-time.After(3 * time.Second):
				t.Fatalf("the dual lease outlived the loss of its %s side by 3s", c.side)
			}
			if !errors.Is(l.Err(), fencelock.ErrLeaseLost) {
				t.Fatalf("lease ended with %v, want ErrLeaseLost", l.Err())
			}
		})
	}
}

func TestDualURL(t *testing.T) {
	ctx := t.Context()
	u := migrate.DualURL("mem://dual-url-old", "mem://dual-url-new?x=&y")
	if _, _, err := fencelock.OpenBackend(ctx, u); !errors.Is(err, driver.ErrInvalidOption) {
		t.Fatalf("a dual URL whose inner URL has unknown parameters: %v, want ErrInvalidOption from the inner backend", err)
	}
	c, err := fencelock.Open(ctx, migrate.DualURL("mem://dual-url-old", "mem://dual-url-new")+"&ttl=2s", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dual-url-old", "dual-url-new"} {
		if info, err := memory.Named(name).Backend().Inspect(ctx, "k"); err != nil || info.Owner != l.Owner() {
			t.Errorf("mem://%s after a dual acquire: %+v, %v; want held by %s", name, info, err, l.Owner())
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	for _, bad := range []struct{ url, why string }{
		{"dual://?new=mem://a", "old missing"},
		{"dual://?old=mem://a", "new missing"},
		{"dual://host?old=mem://a&new=mem://b", "a host"},
		{migrate.DualURL("mem://a", "mem://b") + "&extra=1", "an unknown parameter"},
		{migrate.DualURL(migrate.DualURL("mem://a", "mem://b"), "mem://c"), "a nested dual"},
		{migrate.DualURL("mem://a?ttl=5s", "mem://b"), "an engine parameter on an inner URL"},
		{migrate.DualURL("nosuch://a", "mem://b"), "an unknown inner scheme"},
	} {
		if _, _, err := fencelock.OpenBackend(ctx, bad.url); err == nil {
			t.Errorf("OpenBackend(%s) with %s: no error", bad.url, bad.why)
		}
	}
}

// A Dual is a driver.Watcher in type; it reports, through
// driver.WatchProber, whether either side can watch, so that the engine
// (and Semaphore and RWLock) know a Dual of two polled sides polls.
func TestDualCanWatchOnlyWithAWatchingSide(t *testing.T) {
	// polled hides every optional interface of a memory backend but
	// token floors, which a Dual needs.
	polled := func() driver.Backend {
		b := memory.New()
		return struct {
			driver.Backend
			driver.TokenFloorer
		}{b, b}
	}
	for _, c := range []struct {
		name     string
		old, new driver.Backend
		want     bool
	}{
		{"both sides watch", memory.New(), memory.New(), true},
		{"old side watches", memory.New(), polled(), true},
		{"new side watches", polled(), memory.New(), true},
		{"neither side watches", polled(), polled(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := mustDual(t, c.old, c.new)
			defer d.Close()
			if _, ok := driver.Watches(d); ok != c.want {
				t.Errorf("driver.Watches(Dual) = %v; want %v", ok, c.want)
			}
			if _, err := d.Watch(t.Context(), "k"); (err == nil) != c.want {
				t.Errorf("Dual.Watch = %v; want an error exactly when neither side watches", err)
			}
		})
	}
}
