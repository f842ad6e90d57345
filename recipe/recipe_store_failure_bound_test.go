package recipe_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"github.com/fencelock/fencelock/recipe"
)

// A recipe's waiting call without a deadline (Semaphore.Acquire, RLock,
// Lock) on a store that fails every request gives up as Client.Acquire
// does: once the store has failed for the call's TTL, with the store's
// cause in the error; it does not retry its own requests (the
// semaphore's List, the read-write lock's look at the intent) for as long
// as the context lasts.
func TestRecipeWaitWithoutDeadlineReturnsStoreCause(t *testing.T) {
	calls := []struct {
		name string
		call func(ctx context.Context, c *fencelock.Client) error
	}{
		{"Semaphore.Acquire", func(ctx context.Context, c *fencelock.Client) error {
			s, err := recipe.NewSemaphore(c, "pool", 3)
			if err == nil {
				_, err = s.Acquire(ctx)
			}
			return err
		}},
		{"RWLock.RLock", func(ctx context.Context, c *fencelock.Client) error {
			rw, err := recipe.NewRWLock(c, "k")
			if err == nil {
				_, err = rw.RLock(ctx)
			}
			return err
		}},
		{"RWLock.Lock", func(ctx context.Context, c *fencelock.Client) error {
			rw, err := recipe.NewRWLock(c, "k")
			if err == nil {
				_, err = rw.Lock(ctx)
			}
			return err
		}},
	}
	faults := []struct {
		name  string
		fault func(context.Context) error
		cause func(error) bool
	}{
		{"refusing", refusing, func(err error) bool {
			return errors.Is(err, syscall.ECONNREFUSED) && strings.Contains(err.Error(), "connection refused")
		}},
		{"silent", silent, func(err error) bool {
			return errors.Is(err, context.DeadlineExceeded) && strings.Contains(err.Error(), "no answer")
		}},
	}
	for _, fc := range faults {
		for _, call := range calls {
			t.Run(fc.name+"/"+call.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					store := memory.NewStore()
					b := newFaulty(store)
					o := boundOpts()
					c := newClient(t, b.Backend(), o)
					b.SetAll(fc.fault)
					var err error
					// Each step that fails gives up after one TTL
					// of failures; allow a few in turn.
					within(t, b, c, 3*o.TTL+o.ReleaseTimeout, call.name+"(Background) on a failing store", func() {
						err = call.call(context.Background(), c)
					})
					if !fc.cause(err) {
						t.Errorf("%s = %v; want the store's cause", call.name, err)
					}
				})
			})
		}
	}
}

// refuseAcquires makes f's acquire requests of the keys that match fail
// as on a store that refuses connections; every other request is
// answered.
func refuseAcquires(f *fakebackend.Fake, match func(key string) bool) {
	f.OnAcquire(func(ctx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
		if match(r.Key) {
			return driver.Grant{}, refused
		}
		return next(ctx, r)
	})
}

// A recipe's waiting call without a deadline whose tries at its slots
// fail gives up once they have failed for the call's TTL, with the
// store's cause, even though the store answers its other requests (the
// semaphore's List, the read-write lock's look at the intent and its
// gate): whether it polls the slots or waits on every one at once. The
// gate a reader releases after its slot wait failed is no loss of the
// gate: the call does not enter again (and fail again, for ever). Each
// call is made several times: whether the release of the gate is taken
// for a loss depends on the order of two goroutines.
func TestRecipeSlotWaitWithoutDeadlineReturnsStoreCause(t *testing.T) {
	calls := []struct {
		name string
		call func(ctx context.Context, c *fencelock.Client) error
	}{
		{"Semaphore.Acquire", func(ctx context.Context, c *fencelock.Client) error {
			s, err := recipe.NewSemaphore(c, "pool", 3)
			if err == nil {
				_, err = s.Acquire(ctx)
			}
			return err
		}},
		{"RWLock.RLock", func(ctx context.Context, c *fencelock.Client) error {
			rw, err := recipe.NewRWLock(c, "k")
			if err == nil {
				_, err = rw.RLock(ctx)
			}
			return err
		}},
	}
	// The memory backend's store (its capabilities hidden: waits poll),
	// or with its notifications: a waiting call waits on every slot at
	// once.
	ways := []struct {
		name string
		caps fakebackend.Caps
	}{
		{"poll", fakebackend.Plain},
		{"notify", fakebackend.Watcher},
	}
	const rounds = 8
	for _, way := range ways {
		for _, call := range calls {
			t.Run(way.name+"/"+call.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					store := memory.NewStore()
					b := newFaulty(store)
					o := boundOpts()
					slots := func(key string) bool {
						return strings.Contains(key, recipe.PermitSeparator) || strings.Contains(key, recipe.RWSeparator+"r/")
					}
					refuseAcquires(b, slots)
					c := newClient(t, b.As(way.caps), o)
					for round := range rounds {
						var err error
						within(t, b, c, 2*o.TTL+o.ReleaseTimeout, call.name+"(Background) whose tries are refused", func() {
							err = call.call(context.Background(), c)
						})
						if !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "connection refused") {
							t.Fatalf("round %d: %s = %v; want the store's cause (connection refused)", round, call.name, err)
						}
						if infos := storeRecords(t, store); len(infos) != 0 {
							t.Fatalf("round %d: after %s failed, the store holds %v; want nothing", round, call.name, infos)
						}
					}
				})
			})
		}
	}
}
