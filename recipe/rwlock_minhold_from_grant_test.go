package recipe_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

// A write grant's minimum hold counts from when the grant was handed
// out, not from when each of its leases arrived: a writer that took the
// gate and most slots at once, then waited longer than its minimum hold
// for a reader to leave, and released at once, still keeps readers and
// writers out for the whole hold.
func TestRWLockWriteGrantMinHoldCountsFromGrant(t *testing.T) {
	for _, way := range holdWays {
		for _, sb := range semBackends {
			t.Run(way.name+"/"+sb.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					store := memory.NewStore()
					o, callOpts := way.set("writer")
					writer := rwlock(t, newClient(t, sb.wrap(store.Backend()), o), "k")
					reader := rwlock(t, newClient(t, sb.wrap(store.Backend()), plainOpts("reader")), "k")
					other := rwlock(t, newClient(t, sb.wrap(store.Backend()), plainOpts("other")), "k")

					rg, err := reader.RLock(t.Context())
					if err != nil {
						t.Fatal(err)
					}
					type result struct {
						g   *recipe.RWGrant
						err error
					}
					got := make(chan result, 1)
					go func() {
						g, err := writer.Lock(t.Context(), callOpts...)
						got <- result{g, err}
					}()
					// The writer holds the gate and every free slot,
					// and waits for the reader for longer than its hold.
					time.Sleep(recipeHold + 10*time.Second)
					if err := rg.Release(t.Context()); err != nil {
						t.Fatal(err)
					}
					r := <-got
					if r.err != nil {
						t.Fatal(r.err)
					}
					granted := time.Now()
					if err := r.g.Release(t.Context()); err != nil {
						t.Fatal(err)
					}
					if g, err := other.TryRLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
						if g != nil {
							_ = g.Release(t.Context())
						}
						t.Fatalf("TryRLock right after the write grant's release = %v; want ErrNotAcquired: the grant keeps its minimum hold from when it was handed out", err)
					}
					if g, err := other.TryLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
						if g != nil {
							_ = g.Release(t.Context())
						}
						t.Fatalf("TryLock right after the write grant's release = %v; want ErrNotAcquired", err)
					}
					time.Sleep(recipeHold + time.Second - time.Since(granted))
					g, err := other.TryRLock(t.Context())
					if err != nil {
						t.Fatalf("TryRLock after the hold ended = %v; want the grant", err)
					}
					_ = g.Release(t.Context())
				})
			})
		}
	}
}
