package recipe_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/recipe"
)

// recipeHold is the minimum hold of the recipes' tests: far longer than
// anything else in them, so that a record kept for it is plainly there.
const recipeHold = 20 * time.Second

// holdWays are the two ways a minimum hold reaches a recipe's leases: per
// call (WithMinHold), and as the client's default (Options.MinHold). Each
// returns the client's options (owner named) and the call's options.
var holdWays = []struct {
	name string
	set  func(owner string) (*fencelock.Options, []fencelock.AcquireOption)
}{
	{"WithMinHold", func(owner string) (*fencelock.Options, []fencelock.AcquireOption) {
		return &fencelock.Options{TTL: 3 * time.Second, Owner: owner}, []fencelock.AcquireOption{fencelock.WithMinHold(recipeHold)}
	}},
	{"Options.MinHold", func(owner string) (*fencelock.Options, []fencelock.AcquireOption) {
		return &fencelock.Options{TTL: 3 * time.Second, Owner: owner, MinHold: recipeHold}, nil
	}},
}

// plainOpts are the options of a client without a minimum hold.
func plainOpts(owner string) *fencelock.Options {
	return &fencelock.Options{TTL: 3 * time.Second, Owner: owner}
}

// storeRecords lists every record of the store.
func storeRecords(t *testing.T, store *memory.Store) []driver.Info {
	t.Helper()
	infos, err := store.Backend().List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	return infos
}

// A write grant refused or given up beside a reader was never handed
// out: the gate and the slots it took are released at once, whatever the
// minimum hold, so that another writer gets the lock as soon as the
// reader has left (not when the refused caller's hold would have ended).
func TestMinHoldNotKeptByRefusedWriteGrant(t *testing.T) {
	refusals := []struct {
		name string
		call func(ctx context.Context, rw *recipe.RWLock, opts []fencelock.AcquireOption) error
	}{
		{"TryLock", func(ctx context.Context, rw *recipe.RWLock, opts []fencelock.AcquireOption) error {
			_, err := rw.TryLock(ctx, opts...)
			return err
		}},
		{"Lock with WithWait", func(ctx context.Context, rw *recipe.RWLock, opts []fencelock.AcquireOption) error {
			_, err := rw.Lock(ctx, append(opts, fencelock.WithWait(300*time.Millisecond))...)
			return err
		}},
		{"Lock until the context ends", func(ctx context.Context, rw *recipe.RWLock, opts []fencelock.AcquireOption) error {
			ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			_, err := rw.Lock(ctx, opts...)
			if errors.Is(err, context.DeadlineExceeded) {
				return fencelock.ErrNotAcquired // the refusal this test expects
			}
			return err
		}},
	}
	for _, way := range holdWays {
		for _, sb := range semBackends {
			for _, refusal := range refusals {
				t.Run(way.name+"/"+sb.name+"/"+refusal.name, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						store := memory.NewStore()
						reader := rwlock(t, newClient(t, sb.wrap(store.Backend()), plainOpts("reader")), "k")
						wo, callOpts := way.set("refused")
						refused := rwlock(t, newClient(t, sb.wrap(store.Backend()), wo), "k")
						other := rwlock(t, newClient(t, sb.wrap(store.Backend()), plainOpts("other")), "k")

						r, err := reader.RLock(t.Context())
						if err != nil {
							t.Fatal(err)
						}
						if err := refusal.call(t.Context(), refused, callOpts); !errors.Is(err, fencelock.ErrNotAcquired) {
							t.Fatalf("%s beside a reader = %v; want ErrNotAcquired", refusal.name, err)
						}
						if err := r.Release(t.Context()); err != nil {
							t.Fatal(err)
						}
						if infos := storeRecords(t, store); len(infos) != 0 {
							t.Errorf("after the refusal and the reader's release the store holds %d records %v; want none: a grant never handed out keeps no minimum hold", len(infos), infos)
						}
						w, err := other.TryLock(t.Context())
						if err != nil {
							t.Fatalf("TryLock by another writer once the reader left = %v; want the lock at once, not after the refused caller's minimum hold", err)
						}
						if err := w.Release(t.Context()); err != nil {
							t.Fatal(err)
						}
					})
				})
			}
		}
	}
}

// A read grant refused (a writer holds the lock, or every slot is held)
// leaves nothing held for its minimum hold either.
func TestMinHoldNotKeptByRefusedReadGrant(t *testing.T) {
	for _, way := range holdWays {
		for _, sb := range semBackends {
			t.Run(way.name+"/"+sb.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					store := memory.NewStore()
					ro, callOpts := way.set("refused")
					refused := rwlock(t, newClient(t, sb.wrap(store.Backend()), ro), "k", recipe.WithMaxReaders(4))
					others := rwlock(t, newClient(t, sb.wrap(store.Backend()), plainOpts("others")), "k", recipe.WithMaxReaders(4))

					var readers []*recipe.RWGrant
					for range 4 {
						g, err := others.TryRLock(t.Context())
						if err != nil {
							t.Fatal(err)
						}
						readers = append(readers, g)
					}
					if _, err := refused.TryRLock(t.Context(), callOpts...); !errors.Is(err, fencelock.ErrNotAcquired) {
						t.Fatalf("TryRLock with every slot held = %v; want ErrNotAcquired", err)
					}
					if _, err := refused.RLock(t.Context(), append(callOpts, fencelock.WithWait(300*time.Millisecond))...); !errors.Is(err, fencelock.ErrNotAcquired) {
						t.Fatalf("RLock with WithWait and every slot held = %v; want ErrNotAcquired", err)
					}
					for _, g := range readers {
						if err := g.Release(t.Context()); err != nil {
							t.Fatal(err)
						}
					}
					if infos := storeRecords(t, store); len(infos) != 0 {
						t.Errorf("after the refusals and the readers' release the store holds %v; want nothing", infos)
					}
					w, err := others.TryLock(t.Context())
					if err != nil {
						t.Fatalf("TryLock once the readers left = %v; want the lock at once", err)
					}
					if err := w.Release(t.Context()); err != nil {
						t.Fatal(err)
					}
				})
			})
		}
	}
}

// A permit refused because a holder uses another number of permits is
// released at once ("the permit just taken is released"), whatever the
// minimum hold: the caller never received it.
func TestMinHoldNotKeptByPermitRefusedForMismatch(t *testing.T) {
	for _, way := range holdWays {
		t.Run(way.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				other := newClient(t, store.Backend(), plainOpts("other"))
				var once sync.Once
				var intruder *fencelock.Lease
				hook := func(string) {
					once.Do(func() {
						l, err := semaphore(t, other, "pool", 5).TryAcquire(context.Background())
						if err != nil {
							t.Error(err)
						}
						intruder = l
					})
				}
				o, callOpts := way.set("refused")
				c := newClient(t, hookAcquire(store.Backend(), hook), o)
				if _, err := semaphore(t, c, "pool", 2).TryAcquire(t.Context(), callOpts...); !errors.Is(err, recipe.ErrPermitsMismatch) {
					t.Fatalf("TryAcquire while a caller with 5 permits took one just before the grant: %v; want ErrPermitsMismatch", err)
				}
				hs := holders(t, semaphore(t, other, "pool", 5))
				if len(hs) != 1 || intruder == nil || hs[0].Owner != intruder.Owner() {
					t.Fatalf("holders %v; want only the other caller's permit: the refused permit is released at once, not kept for its minimum hold", hs)
				}
			})
		})
	}
}

// What a recipe hands out keeps its minimum hold: a write grant, a read
// grant and a permit released at once keep their records until the hold
// ends, and no longer.
func TestMinHoldKeptByRecipeGrants(t *testing.T) {
	grants := []struct {
		name string
		// take takes the grant with opts and returns its release, and
		// try makes another client's conflicting attempt.
		take func(t *testing.T, c *fencelock.Client, opts []fencelock.AcquireOption) func(context.Context) error
		try  func(ctx context.Context, c *fencelock.Client) error
	}{
		{"write grant",
			func(t *testing.T, c *fencelock.Client, opts []fencelock.AcquireOption) func(context.Context) error {
				g, err := rwlock(t, c, "k").Lock(t.Context(), opts...)
				if err != nil {
					t.Fatal(err)
				}
				return g.Release
			},
			func(ctx context.Context, c *fencelock.Client) error {
				rw, err := recipe.NewRWLock(c, "k")
				if err != nil {
					return err
				}
				g, err := rw.TryRLock(ctx)
				if err == nil {
					err = g.Release(ctx)
				}
				return err
			}},
		{"read grant",
			func(t *testing.T, c *fencelock.Client, opts []fencelock.AcquireOption) func(context.Context) error {
				g, err := rwlock(t, c, "k").RLock(t.Context(), opts...)
				if err != nil {
					t.Fatal(err)
				}
				return g.Release
			},
			func(ctx context.Context, c *fencelock.Client) error {
				rw, err := recipe.NewRWLock(c, "k")
				if err != nil {
					return err
				}
				g, err := rw.TryLock(ctx)
				if err == nil {
					err = g.Release(ctx)
				}
				return err
			}},
		{"permit",
			func(t *testing.T, c *fencelock.Client, opts []fencelock.AcquireOption) func(context.Context) error {
				l, err := semaphore(t, c, "pool", 1).Acquire(t.Context(), opts...)
				if err != nil {
					t.Fatal(err)
				}
				return l.Release
			},
			func(ctx context.Context, c *fencelock.Client) error {
				s, err := recipe.NewSemaphore(c, "pool", 1)
				if err != nil {
					return err
				}
				l, err := s.TryAcquire(ctx)
				if err == nil {
					err = l.Release(ctx)
				}
				return err
			}},
	}
	for _, way := range holdWays {
		for _, g := range grants {
			t.Run(way.name+"/"+g.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					store := memory.NewStore()
					o, callOpts := way.set("holder")
					holder := newClient(t, store.Backend(), o)
					other := newClient(t, store.Backend(), plainOpts("other"))
					start := time.Now()
					release := g.take(t, holder, callOpts)
					if err := release(t.Context()); err != nil {
						t.Fatalf("release = %v", err)
					}
					if err := g.try(t.Context(), other); !errors.Is(err, fencelock.ErrNotAcquired) {
						t.Fatalf("another client's attempt right after the release = %v; want ErrNotAcquired: the %s keeps its minimum hold", err, g.name)
					}
					time.Sleep(recipeHold - time.Second - time.Since(start))
					if err := g.try(t.Context(), other); !errors.Is(err, fencelock.ErrNotAcquired) {
						t.Fatalf("another client's attempt 1s before the hold ends = %v; want ErrNotAcquired", err)
					}
					time.Sleep(2 * time.Second)
					if err := g.try(t.Context(), other); err != nil {
						t.Fatalf("another client's attempt after the hold ended = %v; want the grant", err)
					}
				})
			})
		}
	}
}
