package fencelock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// grantLog records the tokens the store granted, by owner.
type grantLog struct {
	mu     sync.Mutex
	tokens map[string][]driver.Token
}

func (gl *grantLog) add(g driver.Grant, err error) {
	if err != nil {
		return
	}
	gl.mu.Lock()
	defer gl.mu.Unlock()
	if gl.tokens == nil {
		gl.tokens = map[string][]driver.Token{}
	}
	if !slices.Contains(gl.tokens[g.Owner], g.Token) {
		gl.tokens[g.Owner] = append(gl.tokens[g.Owner], g.Token)
	}
}

// shared returns an owner the store granted two leases (two tokens), if any.
func (gl *grantLog) shared() (string, []driver.Token) {
	gl.mu.Lock()
	defer gl.mu.Unlock()
	for o, ts := range gl.tokens {
		if len(ts) > 1 {
			return o, ts
		}
	}
	return "", nil
}

// An Acquire that released a late grant (the store's answer came after
// the grant's local validity, TTL − Margin, had ended) and then takes the
// key again holds a new lease, and a new lease has an owner of its own
// (Lease.Owner, Leader.Owner: unique per lease): the store must never
// grant one owner two tokens. Otherwise Observe reports the late grant's
// owner, then no leader (its release), then that owner again: an owner
// seen again after it disappeared, and a new term that a watcher keyed
// on Owner cannot tell from the released one. Each case makes a different
// attempt of the call late: its first, a retry after a transient failure
// (polling), and the confirmation of a queued grant.
func TestLeaseAfterLateGrantHasOwnerOfItsOwn(t *testing.T) {
	const late = 2800 * time.Millisecond // past TTL − Margin = 2.7s
	for _, tc := range []string{"first attempt", "retry", "queue"} {
		t.Run(tc, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				var log grantLog
				var lateOwner atomic.Value // the owner of the late grant
				// The memory store, its capabilities hidden; as a queue, a
				// Waiter whose AcquireWait tries Acquire whenever the key
				// changes.
				h := fakebackend.New(store.Backend(), fakebackend.Plain)
				var attempts atomic.Int32
				h.OnAcquire(func(ctx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
					n := attempts.Add(1)
					if tc == "retry" && n == 1 {
						return driver.Grant{}, errors.New("injected: connection reset")
					}
					g, err := next(ctx, r)
					log.add(g, err)
					if err == nil && (tc == "first attempt" && n == 1 || tc == "retry" && n == 2) {
						lateOwner.Store(g.Owner)
						time.Sleep(late)
					}
					return g, err
				})
				var confirms atomic.Int32
				h.OnRenew(func(ctx context.Context, g driver.Grant, r driver.RenewRequest, next fakebackend.RenewFunc) (driver.Grant, error) {
					ng, err := next(ctx, g, r)
					log.add(ng, err)
					if tc == "queue" && confirms.Add(1) == 1 {
						lateOwner.Store(g.Owner)
						time.Sleep(late)
					}
					return ng, err
				})
				b := h.Backend()
				waiting := make(chan struct{})
				var once sync.Once
				o := &fencelock.Options{TTL: 3 * time.Second}
				if tc == "queue" {
					b = h.As(fakebackend.Waiter)
					o.Observer = fencelock.ObserverFunc(func(e fencelock.Event) {
						if e.Kind == fencelock.EventWaiting {
							once.Do(func() { close(waiting) })
						}
					})
				}
				c := newClient(t, b, o)
				if tc == "queue" {
					// Held by another client until c waits in the queue,
					// so that c's grant comes from AcquireWait.
					holder := newClient(t, store.Backend(), nil)
					hl, err := holder.Acquire(t.Context(), "k")
					if err != nil {
						t.Fatal(err)
					}
					go func() {
						<-waiting
						_ = hl.Release(context.Background())
					}()
				}
				l, err := c.Acquire(t.Context(), "k")
				if err != nil {
					t.Fatal(err)
				}
				lo, _ := lateOwner.Load().(string)
				if lo == "" {
					t.Fatal("no grant was made late")
				}
				if l.Owner() == lo {
					t.Errorf("the lease after the late grant has the late grant's owner %q", lo)
				}
				if o, ts := log.shared(); o != "" {
					t.Errorf("the store granted owner %q tokens %v: two leases under one owner", o, ts)
				}
				if err := l.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
				mustFree(t, store, "k")
			})
		})
	}
}
