package recipe_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"github.com/fencelock/fencelock/recipe"
)

// Elect returns nil when its campaigner resigns (its ctx ends), whether it
// was leading, waiting for a held key, waiting with a WithWait bound, or
// waiting on a store that failed meanwhile.
func TestElectReturnsNilWhenItsCampaignerResigns(t *testing.T) {
	leading := func(ctx context.Context, l *fencelock.Lease) error {
		<-ctx.Done()
		return ctx.Err()
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, store *memory.Store, b *fakebackend.Fake)
		opts  []fencelock.AcquireOption
	}{
		{name: "leading"},
		{name: "waiting for a held key", setup: holdKey},
		{name: "waiting with WithWait", setup: holdKey, opts: []fencelock.AcquireOption{fencelock.WithWait(3 * time.Second)}},
		{name: "on a refusing store", setup: func(_ *testing.T, _ *memory.Store, b *fakebackend.Fake) { b.SetAll(refusing) }},
		{name: "on a silent store", setup: func(_ *testing.T, _ *memory.Store, b *fakebackend.Fake) { b.SetAll(silent) }},
		{name: "on a silent store with WithWait", opts: []fencelock.AcquireOption{fencelock.WithWait(3 * time.Second)},
			setup: func(_ *testing.T, _ *memory.Store, b *fakebackend.Fake) { b.SetAll(silent) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				b := newFaulty(store)
				c := newClient(t, b.Backend(), boundOpts())
				if tc.setup != nil {
					tc.setup(t, store, b)
				}
				ctx, resign := context.WithCancel(context.Background())
				// Resign at 4s: past a 3s wait bound and into the
				// next, past the first request's failures, before the
				// failure window (the TTL, 15s) ends.
				time.AfterFunc(4*time.Second, resign)
				var err error
				within(t, b, c, 4*time.Second+2*time.Second, "Elect until its campaigner resigns", func() {
					err = recipe.Elect(ctx, c, "k", "me", nil, leading, &recipe.ElectOptions{Acquire: tc.opts})
				})
				if err != nil {
					t.Errorf("Elect = %v after its campaigner resigned; want nil", err)
				}
				b.SetAll(nil)
			})
		})
	}
}

// holdKey makes another client of store hold "k" (its lease outlives the
// test's campaign).
func holdKey(t *testing.T, store *memory.Store, _ *fakebackend.Fake) {
	other := newClient(t, store.Backend(), boundOpts())
	if _, err := other.Acquire(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
}
