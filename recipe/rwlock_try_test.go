package recipe_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"github.com/fencelock/fencelock/recipe"
)

// Concurrent TryRLock calls on a lock that no writer holds or waits for,
// with slots to spare, are never refused: a reader passing the gate does
// not make another try-reader fail.
//
// On a slow store ("slow": every request takes 4ms, and MaxBackoff is
// 20ms) the readers take longer to pass the gate, all of them, than
// MaxBackoff: a try gives up only when one reader stays in the gate.
func TestRWLockConcurrentTryRLockNotRefusedByReaders(t *testing.T) {
	const readers, rounds = 6, 200
	ways := append(semBackends[:len(semBackends):len(semBackends)], struct {
		name string
		wrap func(*memory.Backend) driver.Backend
	}{"slow", func(b *memory.Backend) driver.Backend {
		return slowStore(b, fakebackend.Plain, 4*time.Millisecond).Backend()
	}})
	for _, sb := range ways {
		t.Run(sb.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				var rws []*recipe.RWLock
				for range readers {
					o := &fencelock.Options{TTL: 3 * time.Second, MaxBackoff: 20 * time.Millisecond}
					rws = append(rws, rwlock(t, newClient(t, sb.wrap(store.Backend()), o), "k"))
				}
				for round := range rounds {
					grants := make([]*recipe.RWGrant, readers)
					errs := make([]error, readers)
					start := make(chan struct{})
					var wg sync.WaitGroup
					for i, rw := range rws {
						wg.Go(func() {
							<-start
							grants[i], errs[i] = rw.TryRLock(t.Context())
						})
					}
					close(start)
					wg.Wait()
					slots := map[string]bool{}
					for i, err := range errs {
						if err != nil {
							t.Fatalf("round %d: TryRLock %d of %d concurrent ones on a free lock refused: %v", round, i, readers, err)
						}
						if k := grants[i].Lease().Key(); slots[k] {
							t.Fatalf("round %d: two read grants on slot %s", round, k)
						} else {
							slots[k] = true
						}
					}
					for _, g := range grants {
						if err := g.Release(t.Context()); err != nil {
							t.Fatal(err)
						}
					}
				}
			})
		})
	}
}

// A writer still refuses a TryRLock at once, whether it holds the gate
// waiting for a reader to drain or waits for the gate holding the
// intent; and a writer that begins to wait while a try-reader waits for
// another reader to pass the gate refuses that try-reader too.
func TestRWLockTryRLockRefusedByWaitingWriter(t *testing.T) {
	t.Run("writer draining readers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memory.NewStore()
			reader := rwlock(t, newClient(t, store.Backend(), plainOpts("reader")), "k")
			writer := rwlock(t, newClient(t, store.Backend(), plainOpts("writer")), "k")
			r, err := reader.RLock(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				g, err := writer.Lock(t.Context())
				if err == nil {
					err = g.Release(t.Context())
				}
				done <- err
			}()
			synctest.Wait() // the writer holds the gate and waits for r's slot
			if hs := rwHolders(t, reader); len(hs) != 2 || !hs[1].Write {
				t.Fatalf("holders %+v; want the reader, then the writer draining it", hs)
			}
			start := time.Now()
			_, err = reader.TryRLock(t.Context())
			var he *fencelock.HeldError
			if !errors.As(err, &he) || he.Holder.Key != reader.GateKey() {
				t.Fatalf("TryRLock while a writer holds the gate = %v; want a *HeldError naming the gate", err)
			}
			if d := time.Since(start); d != 0 {
				t.Errorf("TryRLock beside a writer took %v; want a refusal at once, without waiting for the gate", d)
			}
			if err := r.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("writer arrives while a try-reader waits for a reader in the gate", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memory.NewStore()
			paused := rwlock(t, newClient(t, store.Backend(), plainOpts("paused")), "k")
			try := rwlock(t, newClient(t, store.Backend(), plainOpts("try")), "k")
			writer := rwlock(t, newClient(t, store.Backend(), plainOpts("writer")), "k")
			resume := make(chan struct{})
			resumeOnce := sync.OnceFunc(func() { close(resume) })
			defer resumeOnce() // a failed test lets it go on, so that the bubble ends
			defer recipe.SetRWTestHookEntered(func(gate *fencelock.Lease) {
				if strings.HasPrefix(gate.Owner(), "paused") {
					<-resume // a reader that stays in the gate
				}
			})()
			pausedDone := make(chan *recipe.RWGrant, 1)
			go func() {
				g, err := paused.RLock(t.Context())
				if err != nil && t.Context().Err() == nil {
					t.Error(err)
				}
				pausedDone <- g
			}()
			synctest.Wait() // the paused reader holds the gate
			tryDone := make(chan error, 1)
			go func() {
				_, err := try.TryRLock(t.Context())
				tryDone <- err
			}()
			synctest.Wait() // the try-reader found a reader in the gate, and waits to try again
			writerDone := make(chan error, 1)
			go func() {
				g, err := writer.Lock(t.Context())
				if err == nil {
					err = g.Release(t.Context())
				}
				writerDone <- err
			}()
			synctest.Wait() // the writer holds the intent and waits for the gate
			err := <-tryDone
			var he *fencelock.HeldError
			if !errors.As(err, &he) || he.Holder.Key != try.IntentKey() {
				t.Fatalf("TryRLock after a writer began to wait = %v; want a *HeldError naming the intent", err)
			}
			resumeOnce()
			g := <-pausedDone
			if g == nil {
				return
			}
			if err := g.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := <-writerDone; err != nil {
				t.Fatal(err)
			}
		})
	})
}

// A reader that stays in the gate (its process paused between the gate
// and a slot) makes a TryRLock fail after Options.MaxBackoff, not when
// the gate's lease ends.
func TestRWLockTryRLockBoundedByReaderStuckInGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		opts := &fencelock.Options{TTL: 3 * time.Second, Owner: "try", MaxBackoff: 200 * time.Millisecond}
		paused := rwlock(t, newClient(t, store.Backend(), plainOpts("paused")), "k")
		try := rwlock(t, newClient(t, store.Backend(), opts), "k")
		resume := make(chan struct{})
		resumeOnce := sync.OnceFunc(func() { close(resume) })
		defer resumeOnce() // a failed test lets it go on, so that the bubble ends
		defer recipe.SetRWTestHookEntered(func(gate *fencelock.Lease) {
			if strings.HasPrefix(gate.Owner(), "paused") {
				<-resume
			}
		})()
		pausedDone := make(chan *recipe.RWGrant, 1)
		go func() {
			g, err := paused.RLock(t.Context())
			if err != nil && t.Context().Err() == nil {
				t.Error(err)
			}
			pausedDone <- g
		}()
		synctest.Wait() // the paused reader holds the gate
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err := try.TryRLock(ctx)
		var he *fencelock.HeldError
		if !errors.As(err, &he) || he.Holder.Key != try.GateKey() {
			t.Fatalf("TryRLock while a reader stays in the gate = %v; want a *HeldError naming the gate", err)
		}
		if d := time.Since(start); d > opts.MaxBackoff {
			t.Errorf("TryRLock refused after %v; want within MaxBackoff (%v)", d, opts.MaxBackoff)
		}
		resumeOnce()
		if g := <-pausedDone; g != nil {
			if err := g.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
