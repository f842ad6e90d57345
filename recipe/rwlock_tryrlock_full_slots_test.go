package recipe_test

import (
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"github.com/fencelock/fencelock/recipe"
)

// Try-readers on a lock whose slots are nearly all held by readers, on
// a slow store (every request 4ms, MaxBackoff 20ms), are not refused
// while a slot is free for each: a reader in the gate may try every slot
// before it finds the free one (longer than MaxBackoff), and is no reader
// stuck in the gate for that.
func TestRWLockTryRLockBesideNearlyFullSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const tries, rounds = 2, 30
		store := memory.NewStore()
		o := func(owner string) *fencelock.Options {
			return &fencelock.Options{TTL: 3 * time.Second, Owner: owner, MaxBackoff: 20 * time.Millisecond}
		}
		const slots = 16
		holders := rwlock(t, newClient(t, store.Backend(), o("holders")), "k", recipe.WithMaxReaders(slots))
		for range slots - tries {
			if _, err := holders.TryRLock(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		var rws []*recipe.RWLock
		for i := range tries {
			rws = append(rws, rwlock(t, newClient(t, slowStore(store.Backend(), fakebackend.Plain, 4*time.Millisecond).Backend(), o(fmt.Sprint("try", i))), "k", recipe.WithMaxReaders(slots)))
		}
		for round := range rounds {
			grants := make([]*recipe.RWGrant, tries)
			errs := make([]error, tries)
			var wg sync.WaitGroup
			for i, rw := range rws {
				wg.Go(func() { grants[i], errs[i] = rw.TryRLock(t.Context()) })
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("round %d: TryRLock %d with a free slot for each and only readers about = %v; want a grant", round, i, err)
				}
			}
			for _, g := range grants {
				if err := g.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
