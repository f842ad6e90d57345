package generative

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// A client that dies lets its requests already on their way land before
// the store sees it dead: die waits for the late requests whose callers
// gave up, then runs the hard crash. A hook that cuts the connection (the
// etcd and ZooKeeper hooks do) would otherwise drop them, and no program
// would see a late request land after its client died. In a synctest
// bubble the late request's delay passes only once every goroutine
// waits, so the order is the same on every run.
func TestDieLetsLateRequestsLand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newFaulty(nil, faults{Late: 1000, maxDelayTenths: 5}, 10*time.Millisecond, 2*time.Second, newRecorder(), 0)
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the caller has given up: a late request goes on alone
		var landed atomic.Bool
		land := func(context.Context) (struct{}, error) {
			landed.Store(true)
			return struct{}{}, nil
		}
		// A drawn delay of 0 runs the request at once; draw again until
		// one is on its way.
		for w.pending() == 0 {
			landed.Store(false)
			_, _ = call(w, ctx, "acquire", false, nil, land)
		}
		if landed.Load() {
			t.Fatal("the late request landed before its delay passed")
		}
		var landedFirst bool
		w.die(func(driver.Backend) { landedFirst = landed.Load() })
		if !landedFirst {
			t.Error("the hard crash ran before the late request already on its way landed")
		}
		w.settle() // leave no goroutine in the bubble
	})
}

// pending returns how many late requests are still on their way.
func (w *faulty) pending() int {
	w.lateMu.Lock()
	defer w.lateMu.Unlock()
	return w.late
}

// A paused store applies what reached it in the order it arrived, once
// the pause ends: each request after the one before it was applied,
// whether its caller gave up during the pause (a late-cut request, run in
// the background) or still waits for it. The engine's clean-up of an
// acquire it gave up on is sent after that acquire; applied first, it
// would leave the acquire's record behind, with nobody to release it (on
// ZooKeeper, for as long as the session lives). Each request takes a
// millisecond of the bubble's time in the store, so that requests let go
// at once overlap.
func TestPausedStoreAppliesRequestsInArrivalOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newFaulty(nil, faults{}, 10*time.Millisecond, 2*time.Second, newRecorder(), 0)
		w.setOutage(outagePause, 0)
		var (
			mu      sync.Mutex
			applied []int
			busy    bool
			overlap bool
		)
		const n = 6
		var wg sync.WaitGroup
		for i := range n {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wg.Go(func() {
				_, _ = call(w, ctx, "acquire", false, nil, func(context.Context) (struct{}, error) {
					mu.Lock()
					overlap = overlap || busy
					busy = true
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
					busy = false
					applied = append(applied, i)
					mu.Unlock()
					return struct{}{}, nil
				})
			})
			synctest.Wait() // request i has reached the paused store
			if i%2 == 0 {
				cancel() // its caller gives up: it is applied late
				synctest.Wait()
			}
		}
		// A wait in the queue whose caller gave up is over at once (it
		// has no late form); the queue behind it stays in order.
		wctx, wcancel := context.WithCancel(context.Background())
		wg.Go(func() {
			_, _ = call(w, wctx, "acquire-wait", false, nil, func(context.Context) (struct{}, error) {
				t.Error("a wait whose caller gave up during the pause was applied")
				return struct{}{}, nil
			})
		})
		synctest.Wait()
		wcancel()
		synctest.Wait()
		w.setOutage(outageNone, 0)
		// A request sent after the pause ended queues behind the ones
		// the store still applies.
		_, _ = call(w, context.Background(), "release", false, nil, func(context.Context) (struct{}, error) {
			mu.Lock()
			overlap = overlap || busy
			applied = append(applied, n)
			mu.Unlock()
			return struct{}{}, nil
		})
		wg.Wait()
		w.settle()
		if overlap {
			t.Error("the store applied a request while it still applied the one before it")
		}
		for i, got := range applied {
			if got != i {
				t.Fatalf("the store applied the requests in the order %v, not the order they arrived in", applied)
			}
		}
		if len(applied) != n+1 {
			t.Fatalf("the store applied %d requests, not %d", len(applied), n+1)
		}
	})
}
