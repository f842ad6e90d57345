package benchkit

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// scaleWorkers is how many goroutines acquire a Scale run's leases.
const scaleWorkers = 32

// Scale runs, for each count of leases, a sub-benchmark "leases=N" in
// which one Client holds N leases on distinct keys and renews them, as one
// process holding many locks would. open returns the run's backend and the
// engine options its URL gave (fencelock.OpenBackend's results: the
// defaults a URL user gets); Scale wraps the backend to count the renewal
// calls the engine makes, creates the Client on it, acquires the N leases
// (scaleWorkers at a time), lets 1.5 renewal intervals pass, then measures
// over intervals renewal intervals (b.N times); under -short only the
// first count runs, over one interval. It reports:
//
//   - "renew-calls/interval": Renew and RenewBatch calls per renewal
//     interval; batch renewal should keep it O(1) in N. What one
//     RenewBatch costs the store is the backend's: one pipeline (Redis),
//     one statement (PostgreSQL, which also coalesces concurrent calls),
//     one read for all the grants with armed, quiet loss watches
//     (ZooKeeper),
//     concurrent read transactions of up to 128 grants plus a keep-alive
//     (etcd).
//   - "renewed/interval": grants those calls carried per interval (about
//     N: every lease renewed once).
//   - "client-cpu-%": the CPU time of this process (getrusage) over the
//     window, in % of one core; "client-cpu-us/lease/interval" the same per
//     lease and interval.
//   - "server-cpu-%" with ServerCPU.
//   - "acquire-s": how long acquiring the N leases took.
//   - "lost": leases lost during the run. Any loss fails the benchmark.
//
// Options: ServerCPU.
func Scale(b *testing.B, counts []int, intervals int, open func(b *testing.B) (driver.Backend, *fencelock.Options), opts ...Option) {
	c := newConfig(opts)
	if testing.Short() && len(counts) > 0 {
		// The smoke run (scripts/test: -short -benchtime=1x) checks that
		// the benchmark works, not its numbers: the smallest count, one
		// interval.
		counts, intervals = counts[:1], 1
	}
	for _, n := range counts {
		b.Run("leases="+strconv.Itoa(n), func(b *testing.B) { c.scale(b, n, intervals, open) })
	}
}

func (c config) scale(b *testing.B, n, intervals int, open func(b *testing.B) (driver.Backend, *fencelock.Options)) {
	be, o := open(b)
	cb := &countingBackend{Backend: be}
	var wrapped driver.Backend = cb
	if br, ok := be.(driver.BatchRenewer); ok {
		wrapped = &countingBatcher{countingBackend: cb, br: br}
		if ln, ok := be.(driver.LossNotifier); ok {
			// Loss push changes how some backends renew (ZooKeeper
			// renews every watched grant with one read).
			wrapped = &countingBatchNotifier{countingBatcher: wrapped.(*countingBatcher), LossNotifier: ln}
		}
	}
	cl, err := fencelock.New(wrapped, o)
	if err != nil {
		_ = be.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cl.Close() })
	interval := cl.Options().RenewInterval

	ctx := context.Background()
	base := UniqueKey()
	leases := make([]*fencelock.Lease, n)
	start := time.Now()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range min(scaleWorkers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				l, err := cl.TryAcquire(ctx, base+"-"+strconv.Itoa(i))
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				leases[i] = l
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatalf("acquiring %d leases: %v", n, firstErr)
	}
	acquired := time.Since(start)

	lost := func() int {
		k := 0
		for _, l := range leases {
			select {
			case <-l.Done():
				k++
			default:
			}
		}
		return k
	}
	// One and a half intervals for the renewals of the acquisition burst
	// to settle; the half keeps the window's edges away from the moments
	// at which leases acquired together fall due.
	time.Sleep(interval + interval/2)

	window := time.Duration(intervals) * interval
	var calls, grants int64
	var clientCPU, serverCPU, elapsed time.Duration
	serverKnown := c.server != nil
	b.ResetTimer()
	for range b.N {
		calls0, grants0 := cb.calls.Load(), cb.grants.Load()
		cpu0 := processCPU()
		var srv0 time.Duration
		if serverKnown {
			srv0, serverKnown = c.server()
		}
		t0 := time.Now()
		time.Sleep(window) // the load under test is the client's own renewals
		elapsed += time.Since(t0)
		clientCPU += processCPU() - cpu0
		if serverKnown {
			srv1, ok := c.server()
			serverCPU += srv1 - srv0
			serverKnown = ok
		}
		calls += cb.calls.Load() - calls0
		grants += cb.grants.Load() - grants0
	}
	b.StopTimer()
	if k := lost(); k > 0 {
		var cause error
		for _, l := range leases {
			if err := l.Err(); err != nil {
				cause = err
				break
			}
		}
		b.Fatalf("%d of %d leases lost (first: %v)", k, n, cause)
	}
	per := float64(elapsed) / float64(interval) // intervals measured
	b.ReportMetric(float64(calls)/per, "renew-calls/interval")
	b.ReportMetric(float64(grants)/per, "renewed/interval")
	b.ReportMetric(100*float64(clientCPU)/float64(elapsed), "client-cpu-%")
	b.ReportMetric(float64(clientCPU)/float64(time.Microsecond)/per/float64(n), "client-cpu-us/lease/interval")
	if serverKnown {
		b.ReportMetric(100*float64(serverCPU)/float64(elapsed), "server-cpu-%")
	}
	b.ReportMetric(acquired.Seconds(), "acquire-s")
	b.ReportMetric(0, "lost")
	if grants < int64(n)*int64(b.N)*int64(intervals)/2 {
		b.Errorf("only %d renewals of %d leases over %d intervals", grants, n, intervals*b.N)
	}
}

// countingBackend counts the renewal calls the engine makes on a backend.
// It exposes driver.Backend and, where the backend has them,
// driver.BatchRenewer (countingBatcher) and driver.LossNotifier
// (countingBatchNotifier), the interfaces that decide how leases are
// renewed; a Scale run holds leases and neither waits nor watches keys.
type countingBackend struct {
	driver.Backend
	calls, grants atomic.Int64
}

func (c *countingBackend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	c.calls.Add(1)
	c.grants.Add(1)
	return c.Backend.Renew(ctx, g, req)
}

// countingBatcher is countingBackend for a driver.BatchRenewer.
type countingBatcher struct {
	*countingBackend
	br driver.BatchRenewer
}

func (c *countingBatcher) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	c.calls.Add(1)
	c.grants.Add(int64(len(grants)))
	return c.br.RenewBatch(ctx, grants, req)
}

// countingBatchNotifier is countingBatcher for a backend that also pushes
// losses.
type countingBatchNotifier struct {
	*countingBatcher
	driver.LossNotifier
}
