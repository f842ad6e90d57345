package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

// Many clients take read and write grants of one lock at once, with every
// way a call can end without a grant mixed in (a try refused, a wait cut
// by its context's deadline or by WithWait, a per-call TTL shorter than
// the client's, a minimum hold on some): no writer ever holds a grant
// beside another writer or a reader, every grant is admitted by the
// lock's fence while it is held, and once every call has returned and
// every hold has ended, the store holds nothing.
func TestRWLockExclusionUnderCancelsAndRefusals(t *testing.T) {
	for _, sb := range semBackends {
		t.Run(sb.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const clients, ops = 6, 60
				store := memory.NewStore()
				var (
					mu               sync.Mutex
					readers, writers int
					fence            recipe.RWFence
					grants           = map[string]int{}
				)
				enter := func(g *recipe.RWGrant) error {
					mu.Lock()
					defer mu.Unlock()
					if g.Shared() {
						readers++
						grants["read"]++
					} else {
						writers++
						grants["write"]++
					}
					if writers > 1 || writers == 1 && readers > 0 {
						return fmt.Errorf("%d writers and %d readers hold grants at once", writers, readers)
					}
					return fence.Admit("resource", g)
				}
				leave := func(g *recipe.RWGrant) {
					mu.Lock()
					defer mu.Unlock()
					if g.Shared() {
						readers--
					} else {
						writers--
					}
				}
				var wg sync.WaitGroup
				for ci := range clients {
					o := &fencelock.Options{TTL: 3 * time.Second, Owner: fmt.Sprint("c", ci), MaxBackoff: 50 * time.Millisecond}
					if ci%3 == 0 {
						o.MinHold = 40 * time.Millisecond
					}
					rw := rwlock(t, newClient(t, sb.wrap(store.Backend()), o), "k")
					wg.Go(func() {
						r := rand.New(rand.NewPCG(uint64(ci), 1))
						for range ops {
							ctx, cancel := context.WithTimeout(t.Context(), time.Duration(r.IntN(60))*time.Millisecond)
							var opts []fencelock.AcquireOption
							if r.IntN(3) == 0 {
								opts = append(opts, fencelock.WithTTL(time.Second))
							}
							if r.IntN(3) == 0 {
								cancel()
								ctx, cancel = context.WithCancel(t.Context())
								opts = append(opts, fencelock.WithWait(time.Duration(1+r.IntN(60))*time.Millisecond))
							}
							var g *recipe.RWGrant
							var err error
							switch r.IntN(4) {
							case 0:
								g, err = rw.Lock(ctx, opts...)
							case 1:
								g, err = rw.RLock(ctx, opts...)
							case 2:
								g, err = rw.TryLock(ctx, opts...)
							default:
								g, err = rw.TryRLock(ctx, opts...)
							}
							cancel()
							if err != nil {
								if !errors.Is(err, fencelock.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) {
									t.Errorf("client %d: %v", ci, err)
								}
								continue
							}
							if err := enter(g); err != nil {
								t.Errorf("client %d: %v", ci, err)
							}
							time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
							if err := g.Err(); err != nil {
								t.Errorf("client %d: grant lost while held: %v", ci, err)
							}
							leave(g)
							if err := g.Release(t.Context()); err != nil {
								t.Errorf("client %d: release: %v", ci, err)
							}
						}
					})
				}
				wg.Wait()
				time.Sleep(time.Second) // every minimum hold has ended
				if infos := storeRecords(t, store); len(infos) != 0 {
					t.Errorf("after every call returned and every hold ended, the store holds %v; want nothing", infos)
				}
				t.Logf("grants: %v", grants)
			})
		})
	}
}
