package recipe_test

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
	"github.com/fencelock/fencelock/recipe"
)

// A recipe's waiting call with a bound of its own (a deadline on its
// context, or WithWait) on a store that fails every request has no
// window of the store's failures: it waits to its bound, past the TTL
// that ends a call without one, and ends as the caller asked it to: with
// the deadline's error (a WithWait bound: an error matching
// ErrNotAcquired), joined with the store's cause. It never ends early
// with the give-up error of a call without a deadline (*BackendError,
// "failed for … (the call's TTL)"), which would drop the
// ErrNotAcquired a WithWait caller tests for.
func TestRecipeWaitWithBoundOnFailingStoreEndsAtItsBound(t *testing.T) {
	calls := []struct {
		name string
		call func(ctx context.Context, c *fencelock.Client, opts ...fencelock.AcquireOption) error
	}{
		{"Semaphore.Acquire", func(ctx context.Context, c *fencelock.Client, opts ...fencelock.AcquireOption) error {
			s, err := recipe.NewSemaphore(c, "pool", 3)
			if err == nil {
				_, err = s.Acquire(ctx, opts...)
			}
			return err
		}},
		{"RWLock.RLock", func(ctx context.Context, c *fencelock.Client, opts ...fencelock.AcquireOption) error {
			rw, err := recipe.NewRWLock(c, "k")
			if err == nil {
				_, err = rw.RLock(ctx, opts...)
			}
			return err
		}},
		{"RWLock.Lock", func(ctx context.Context, c *fencelock.Client, opts ...fencelock.AcquireOption) error {
			rw, err := recipe.NewRWLock(c, "k")
			if err == nil {
				_, err = rw.Lock(ctx, opts...)
			}
			return err
		}},
	}
	bounds := []struct {
		name string
		want error // what the error must match
		call func(c *fencelock.Client, bound time.Duration, call func(context.Context, *fencelock.Client, ...fencelock.AcquireOption) error) error
	}{
		{"deadline", context.DeadlineExceeded, func(c *fencelock.Client, bound time.Duration, call func(context.Context, *fencelock.Client, ...fencelock.AcquireOption) error) error {
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			return call(ctx, c)
		}},
		{"WithWait", fencelock.ErrNotAcquired, func(c *fencelock.Client, bound time.Duration, call func(context.Context, *fencelock.Client, ...fencelock.AcquireOption) error) error {
			return call(context.Background(), c, fencelock.WithWait(bound))
		}},
	}
	for _, bd := range bounds {
		for _, call := range calls {
			t.Run(bd.name+"/"+call.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					store := memory.NewStore()
					b := newFaulty(store)
					o := boundOpts()
					c := newClient(t, b.Backend(), o)
					b.SetAll(refusing)
					bound := 2 * o.TTL
					var err error
					took := within(t, b, c, bound+o.ReleaseTimeout, call.name+" with a bound on a refusing store", func() {
						err = bd.call(c, bound, call.call)
					})
					if took < bound {
						t.Errorf("%s returned after %v, before its bound %v (the store's failure window is the call's own bound)", call.name, took, bound)
					}
					if !errors.Is(err, bd.want) {
						t.Errorf("%s = %v; want an error matching %v", call.name, err, bd.want)
					}
					if !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "connection refused") {
						t.Errorf("%s = %v; want the store's cause (connection refused) joined", call.name, err)
					}
					if strings.Contains(err.Error(), "call's TTL") {
						t.Errorf("%s = %v; want no give-up of a call without a deadline", call.name, err)
					}
				})
			})
		}
	}
}
