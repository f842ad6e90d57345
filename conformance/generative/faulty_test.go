package generative

import (
	"context"
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
