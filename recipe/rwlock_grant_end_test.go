package recipe_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

// A grant's methods may be called from any goroutine while the grant
// ends, and the end completes: a write grant (a writer's, an upgraded
// reader's) released, or lost when its leases expire by the holder's
// clock, while other goroutines read its token, validity and error.
// Each of its leases ends under that lease's lock and then takes the
// grant's; a method that held the grant's lock while it asked a lease
// (Token of a write grant did) deadlocked with it, and the holder hung for
// good: its Done never closed, Remaining and Err never returned, and its
// process could not stop.
func TestRWGrantEndsWhileItsMethodsRun(t *testing.T) {
	const ttl = 150 * time.Millisecond
	cases := []struct {
		name     string
		upgraded bool
		lose     bool // by local expiry, the store unreachable; else Release
		rounds   int
	}{
		{"writer released", false, false, 200},
		{"upgraded released", true, false, 200},
		{"upgraded lost", true, true, 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := memory.NewStore()
			for i := range tc.rounds {
				b := store.Backend()
				rw := rwlock(t, newClient(t, b, &fencelock.Options{TTL: ttl}), fmt.Sprint("k", i))
				var g *recipe.RWGrant
				var err error
				if tc.upgraded {
					if g, err = rw.UpgradeableRLock(t.Context()); err == nil {
						err = g.Upgrade(t.Context())
					}
				} else {
					g, err = rw.Lock(t.Context())
				}
				if err != nil {
					t.Fatal(err)
				}
				ended := make(chan struct{})
				var wg sync.WaitGroup
				for range 3 {
					wg.Go(func() {
						for {
							_, _, _, _ = g.Token(), g.Remaining(), g.Err(), g.Owner()
							select {
							case <-g.Done():
								_ = g.Token() // as a watcher that reports the loss does
								return
							default:
							}
						}
					})
				}
				go func() {
					defer close(ended)
					if tc.lose {
						b.SetUnreachable(true)
						<-g.Done()
						return
					}
					_ = g.Release(context.Background())
				}()
				wg.Go(func() { <-ended })
				all := make(chan struct{})
				go func() { wg.Wait(); close(all) }()
				select {
				case <-all:
				case <-time.After(10*ttl + 5*time.Second):
					buf := make([]byte, 1<<20)
					t.Fatalf("round %d: the grant's end and its methods still running 5 s after it ended; want them to return (a lock-order deadlock?)\n%s",
						i, buf[:runtime.Stack(buf, true)])
				}
				b.SetUnreachable(false)
			}
		})
	}
}
