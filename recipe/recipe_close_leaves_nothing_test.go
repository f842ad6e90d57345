package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
)

// Client.Close during many recipe calls of the client (waiting read and
// write grants, waiting permits, tries, held grants) ends every call, and
// once Close has returned the store holds no record of that client: not a
// gate, slot, intent or permit of a call it ended, nor of a grant it held.
func TestRecipeCloseDuringCallsLeavesNothing(t *testing.T) {
	for _, sb := range semBackends {
		t.Run(sb.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				other := newClient(t, sb.wrap(store.Backend()), plainOpts("other"))
				// Another client's reader and permit keep the calls waiting.
				r, err := rwlock(t, other, "k").RLock(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				p, err := semaphore(t, other, "pool", 1).Acquire(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				for round := range 20 {
					label := fmt.Sprint("closing", round)
					c, err := fencelock.New(sb.wrap(store.Backend()), &fencelock.Options{TTL: 3 * time.Second, Owner: label, MaxBackoff: 50 * time.Millisecond})
					if err != nil {
						t.Fatal(err)
					}
					rw := rwlock(t, c, "k")
					sem := semaphore(t, c, "pool", 1)
					var wg sync.WaitGroup
					calls := []func() error{
						func() error { _, err := rw.Lock(context.Background()); return err },
						func() error { _, err := rw.RLock(context.Background()); return err },
						func() error { _, err := rw.TryRLock(context.Background()); return err },
						func() error { _, err := rw.TryLock(context.Background()); return err },
						func() error { _, err := sem.Acquire(context.Background()); return err },
						func() error { _, err := sem.TryAcquire(context.Background()); return err },
					}
					for i, call := range calls {
						wg.Go(func() {
							if err := call(); err != nil && !errors.Is(err, fencelock.ErrClosed) && !errors.Is(err, fencelock.ErrNotAcquired) {
								t.Errorf("round %d: call %d: %v", round, i, err)
							}
						})
					}
					time.Sleep(time.Duration(round) * time.Millisecond)
					if err := c.Close(); err != nil {
						t.Errorf("round %d: Close = %v", round, err)
					}
					wg.Wait()
					for _, info := range storeRecords(t, store) {
						if strings.HasPrefix(info.Owner, label+"/") {
							t.Errorf("round %d: after Close the store holds %s of the closed client (%s)", round, info.Key, info.Owner)
						}
					}
				}
				_ = r.Release(t.Context())
				_ = p.Release(t.Context())
			})
		})
	}
}
