package recipe_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"github.com/fencelock/fencelock/recipe"
)

// A permit whose lease ends while the semaphore checks its holders (a
// List retried through the store's failures, for longer than the lease's
// validity) is never handed out: Acquire takes another permit, and
// TryAcquire returns an error matching ErrLeaseLost. Handed out, it would
// be a lease already lost whose slot another client may hold by then
// with a higher token (seen on a NATS cluster restarted whole: the permit
// came back 8 s after it was lost, its slot granted four times since).
func TestSemaphoreEndedPermitNotHandedOut(t *testing.T) {
	calls := []struct {
		name string
		call func(ctx context.Context, s *recipe.Semaphore) (*fencelock.Lease, error)
	}{
		{"Acquire", func(ctx context.Context, s *recipe.Semaphore) (*fencelock.Lease, error) { return s.Acquire(ctx) }},
		{"TryAcquire", func(ctx context.Context, s *recipe.Semaphore) (*fencelock.Lease, error) { return s.TryAcquire(ctx) }},
	}
	for _, call := range calls {
		t.Run(call.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				b := newFaulty(store)
				o := boundOpts()
				c := newClient(t, b.Backend(), o)
				// The store fails every List but the first (the check
				// before the grant) and every renewal, until it heals
				// just after the permit's validity (TTL − Margin, the
				// default Margin TTL/10) has passed: more than one
				// MaxBackoff (the longest pause between Lists) before
				// the TTL of failures that ends a waiting call, so a
				// List lands after the heal and within that window.
				// Margin and MaxBackoff are the client's, resolved.
				var lists atomic.Int64
				var healed atomic.Bool
				co := c.Options()
				heal := co.TTL - co.Margin + co.TTL/100
				if co.TTL-heal <= co.MaxBackoff {
					t.Fatalf("heal at %v leaves no whole MaxBackoff (%v) before the failure window ends at %v", heal, co.MaxBackoff, co.TTL)
				}
				time.AfterFunc(heal, func() { healed.Store(true) })
				b.Set(fakebackend.List, func(context.Context) error {
					if lists.Add(1) == 1 || healed.Load() {
						return nil
					}
					return refused
				})
				b.Set(fakebackend.Renew, func(context.Context) error {
					if healed.Load() {
						return nil
					}
					return refused
				})
				if call.name == "TryAcquire" {
					// One List, answered after the permit's validity.
					b.Set(fakebackend.List, func(ctx context.Context) error {
						if lists.Add(1) == 1 {
							return nil
						}
						return slow(o.TTL - o.TTL/20)(ctx)
					})
				}
				var grants atomic.Int64
				b.OnAcquire(func(ctx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
					g, err := next(ctx, r)
					if err == nil {
						grants.Add(1)
					}
					return g, err
				})
				s, err := recipe.NewSemaphore(c, "pool", 3)
				if err != nil {
					t.Fatal(err)
				}
				l, err := call.call(t.Context(), s)
				if err != nil {
					if call.name == "TryAcquire" && errors.Is(err, fencelock.ErrLeaseLost) {
						return
					}
					t.Fatalf("%s = %v", call.name, err)
				}
				select {
				case <-l.Done():
					t.Fatalf("%s returned a permit (%s, token %d) whose lease had ended: %v", call.name, l.Key(), l.Token(), l.Err())
				default:
				}
				if n := grants.Load(); call.name == "Acquire" && n < 2 {
					// The first permit, still valid at the heal: the
					// test would not see an ended one handed out.
					t.Errorf("Acquire returned the first of %d permits granted; want it to have ended before the heal, and another taken", n)
				}
				if call.name == "TryAcquire" {
					t.Errorf("TryAcquire returned a permit after its one List outlasted the permit's validity; want an error matching ErrLeaseLost")
				}
				if err := l.Release(t.Context()); err != nil {
					t.Error(err)
				}
			})
		})
	}
}
