package benchkit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// contendedTimeout bounds one contended run, so that a lock that is never
// handed on fails the benchmark instead of hanging it.
const contendedTimeout = 10 * time.Minute

// Uncontended runs, for each Lib, a sub-benchmark in which one goroutine
// acquires and releases one key b.N times (with try, or wait if the Lib has
// no try). It reports the rate ("acq+rel/s", see Rate) and the p50 latency
// of one acquire+release ("p50-µs", see Unit). Options: Rate, Unit,
// FreshKeys.
func Uncontended(b *testing.B, libs []Lib, opts ...Option) {
	Distinct(b, 1, libs, opts...)
}

// Distinct runs, for each Lib, a sub-benchmark in which the given number of
// goroutines, each on its own key, share b.N acquire+release cycles. It
// reports what Uncontended does. Options: Rate, Unit, FreshKeys.
func Distinct(b *testing.B, goroutines int, libs []Lib, opts ...Option) {
	c := newConfig(opts)
	for _, lib := range libs {
		b.Run(lib.Name, func(b *testing.B) { c.distinct(b, goroutines, lib) })
	}
}

func (c config) distinct(b *testing.B, goroutines int, lib Lib) {
	locks := lockers(b, lib, goroutines, false)
	b.ResetTimer()
	el, lat, err := cycles(locks, b.N, 0, c.keyer(UniqueKey()), true)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), c.rate)
	b.ReportMetric(c.in(pick(lat, 50)), "p50-"+c.unitName())
}

// Contended runs, for each Lib, a sub-benchmark in which the given number of
// goroutines take turns on one key with wait, for at least b.N handoffs.
// Unless Barging, a goroutine that released the lock does not try again
// until another one has taken it. It reports "handoffs/s", the wait of a
// handoff ("p50-wait-µs", "p99-wait-µs", "max-wait-µs"; see Unit and
// Barging), the CPU of this process in % of one core ("client-cpu-%") and
// per handoff ("client-cpu-us/handoff"), and what ServerCPU and PerHandoff
// add. Options: Unit, Barging, Holds, ServerCPU, PerHandoff.
func Contended(b *testing.B, goroutines int, libs []Lib, opts ...Option) {
	c := newConfig(opts)
	run := func(b *testing.B, hold time.Duration) {
		for _, lib := range libs {
			b.Run(lib.Name, func(b *testing.B) { c.contended(b, goroutines, hold, lib) })
		}
	}
	if len(c.holds) == 0 {
		run(b, 0)
		return
	}
	for _, hold := range c.holds {
		b.Run("hold="+hold.String(), func(b *testing.B) { run(b, hold) })
	}
}

func (c config) contended(b *testing.B, goroutines int, hold time.Duration, lib Lib) {
	waits := lockers(b, lib, goroutines, true)
	ctx, cancel := context.WithTimeout(context.Background(), contendedTimeout)
	defer cancel()
	key := UniqueKey()
	counted := make([]float64, len(c.counters))
	for i, ct := range c.counters {
		v, err := ct.read()
		if err != nil {
			b.Fatalf("%s: %v", ct.name, err)
		}
		counted[i] = v
	}
	srv0, srvOK := c.serverCPU()
	cpu0 := processCPU()
	b.ResetTimer()
	r := handoffs(ctx, waits, key, b.N, hold, c.barging)
	b.StopTimer()
	cpu := processCPU() - cpu0
	srv1, srvOK1 := c.serverCPU()
	if r.err != nil {
		b.Fatal(r.err)
	}
	el, n := r.elapsed.Seconds(), float64(r.count)
	b.ReportMetric(n/el, "handoffs/s")
	u := c.unitName()
	b.ReportMetric(c.in(pick(r.waits, 50)), "p50-wait-"+u)
	b.ReportMetric(c.in(pick(r.waits, 99)), "p99-wait-"+u)
	b.ReportMetric(c.in(pick(r.waits, 100)), "max-wait-"+u)
	if cpu0 >= 0 {
		b.ReportMetric(100*cpu.Seconds()/el, "client-cpu-%")
		b.ReportMetric(float64(cpu.Microseconds())/n, "client-cpu-us/handoff")
	}
	if srvOK && srvOK1 {
		b.ReportMetric(100*(srv1-srv0).Seconds()/el, "server-cpu-%")
	}
	for i, ct := range c.counters {
		v, err := ct.read()
		if err != nil {
			b.Fatalf("%s: %v", ct.name, err)
		}
		b.ReportMetric((v-counted[i])/n, ct.name)
	}
}

func (c config) serverCPU() (time.Duration, bool) {
	if c.server == nil {
		return 0, false
	}
	return c.server()
}

// Interleaved runs every Lib in turns within one benchmark: each of the b.N
// rounds gives every Lib, one after the other, turn acquire+release cycles
// spread over the given number of goroutines, each on its own key. On a
// shared, busy machine every Lib then meets the same noise, so the ratios
// are far steadier than those of separate runs. Round r starts with Lib r
// (mod the number of Libs), so that every Lib runs in every place of the
// order equally often: with a fixed order, fencelock on Redis, run right
// after the raw operations, measured 0.88× raw over nine runs, and 0.94×
// over five with the backend alone moved before it. Every Lib's keys have
// the same length (they name the Lib by its place, not its name): until
// 2026-11-28 they carried the Lib's name, so a Lib named
// "fencelock-backend-shared" wrote keys 21 bytes longer than "raw"'s, and
// on Redis at 16 goroutines 64 more bytes in raw's key names cost it
// 0.04–0.06 of its rate (bench/redis BenchmarkKeyLength). It reports each Lib's rate
// over the time it took ("<name>-acq+rel/s", see Rate) and, for all but the
// first, its ratio to the first ("<name>/<first>"). With one goroutine it
// also reports the latency of one acquire+release at p50 and p99 over all
// rounds ("<name>-p50-µs", "<name>-p99-µs"; see Unit). Options: Rate, Unit,
// FreshKeys, Counted.
func Interleaved(b *testing.B, goroutines, turn int, libs []Lib, opts ...Option) {
	c := newConfig(opts)
	locks := make([][]LockFunc, len(libs))
	keys := make([]func(i, n int) string, len(libs))
	base := UniqueKey()
	for li, lib := range libs {
		locks[li] = lockers(b, lib, goroutines, false)
		keys[li] = c.keyer(base + "-" + libTag(li))
	}
	spent := make([]time.Duration, len(libs))
	lone := goroutines == 1
	lat := make([][]time.Duration, len(libs))
	b.ResetTimer()
	for round := range b.N {
		for k := range libs {
			li := (round + k) % len(libs)
			el, l, err := cycles(locks[li], turn, round*turn, keys[li], lone)
			if err != nil {
				b.Fatalf("%s: %v", libs[li].Name, err)
			}
			spent[li] += el
			lat[li] = append(lat[li], l...)
		}
	}
	b.StopTimer()
	ops := float64(b.N * turn)
	for li, lib := range libs {
		b.ReportMetric(ops/spent[li].Seconds(), lib.Name+"-"+c.rate)
		if li > 0 {
			b.ReportMetric(spent[0].Seconds()/spent[li].Seconds(), lib.Name+"/"+libs[0].Name)
		}
		if lone {
			slices.Sort(lat[li])
			b.ReportMetric(c.in(pick(lat[li], 50)), lib.Name+"-p50-"+c.unitName())
			b.ReportMetric(c.in(pick(lat[li], 99)), lib.Name+"-p99-"+c.unitName())
		}
	}
	if c.counted != nil {
		c.counted.run(b, goroutines, libs, c.keyer)
	}
}

// InterleavedContended is Contended for every Lib in turns within one
// benchmark: each of the b.N rounds runs, for every Lib one after the
// other (round r starting with Lib r, as in Interleaved), at least perRound
// handoffs among the given number of goroutines on
// one key. It reports each Lib's "<name>-handoffs/s" over the time it took,
// for all but the first its ratio to the first ("<name>/<first>"), and each
// Lib's "<name>-p50-wait-µs" and "<name>-p99-wait-µs" over all rounds.
// Options: Unit, Barging, Counted (round trips and counters per handoff).
func InterleavedContended(b *testing.B, goroutines, perRound int, libs []Lib, opts ...Option) {
	c := newConfig(opts)
	waits := make([][]LockFunc, len(libs))
	keys := make([]string, len(libs))
	for li, lib := range libs {
		waits[li] = lockers(b, lib, goroutines, true)
		keys[li] = UniqueKey()
	}
	ctx, cancel := context.WithTimeout(context.Background(), contendedTimeout)
	defer cancel()
	spent := make([]time.Duration, len(libs))
	count := make([]int, len(libs))
	lat := make([][]time.Duration, len(libs))
	b.ResetTimer()
	for round := range b.N {
		for k := range libs {
			li := (round + k) % len(libs) // every Lib in every place, as in Interleaved
			r := handoffs(ctx, waits[li], keys[li], perRound, 0, c.barging)
			if r.err != nil {
				b.Fatalf("%s: %v", libs[li].Name, r.err)
			}
			spent[li] += r.elapsed
			count[li] += r.count
			lat[li] = append(lat[li], r.waits...)
		}
	}
	b.StopTimer()
	u := c.unitName()
	rate := func(li int) float64 { return float64(count[li]) / spent[li].Seconds() }
	for li, lib := range libs {
		b.ReportMetric(rate(li), lib.Name+"-handoffs/s")
		if li > 0 {
			b.ReportMetric(rate(li)/rate(0), lib.Name+"/"+libs[0].Name)
		}
		slices.Sort(lat[li])
		b.ReportMetric(c.in(pick(lat[li], 50)), lib.Name+"-p50-wait-"+u)
		b.ReportMetric(c.in(pick(lat[li], 99)), lib.Name+"-p99-wait-"+u)
	}
	if c.counted != nil {
		c.counted.runContended(b, goroutines, libs, c.barging)
	}
}

// lockers sets lib up for one run and returns the LockFunc of each of the
// goroutines: wait if blocking (b fails if the Lib has none), else try, or
// wait where the Lib has no try.
func lockers(b *testing.B, lib Lib, goroutines int, blocking bool) []LockFunc {
	ls := lib.Setup(b)
	locks := make([]LockFunc, goroutines)
	for i := range locks {
		try, wait := ls(i)
		switch {
		case blocking || try == nil:
			locks[i] = wait
		default:
			locks[i] = try
		}
		if locks[i] == nil {
			b.Fatalf("%s has no way to wait", lib.Name)
		}
	}
	return locks
}

// cycles runs total acquire+release cycles shared by one goroutine per
// lock; key(i, n) names the key of goroutine i in cycle n, numbered from
// first. It returns the time they took, with latencies each cycle's, sorted,
// and the first error (which stops every goroutine).
func cycles(locks []LockFunc, total, first int, key func(i, n int) string, latencies bool) (time.Duration, []time.Duration, error) {
	ctx, f := newFailure(context.Background())
	defer f.cancel()
	var (
		next atomic.Int64
		lat  = make([][]time.Duration, len(locks))
		wg   sync.WaitGroup
	)
	start := time.Now()
	for i, lock := range locks {
		wg.Go(func() {
			for !f.failed.Load() {
				n := int(next.Add(1)) - 1
				if n >= total {
					return
				}
				t0 := time.Now()
				release, err := lock(ctx, key(i, first+n))
				if err == nil {
					err = release()
				}
				if err != nil {
					f.set(i, err)
					return
				}
				if latencies {
					lat[i] = append(lat[i], time.Since(t0))
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	return el, slices.Sorted(slices.Values(slices.Concat(lat...))), f.err
}

// handoffResult is one run of handoffs: its wall time, the acquisitions
// made, the waits, sorted, and the first error.
type handoffResult struct {
	elapsed time.Duration
	count   int
	waits   []time.Duration
	err     error
}

// handoffs runs n acquisitions of key by one goroutine per wait function,
// each holder keeping the lock for hold. Without barging a goroutine that
// released does not try again until another one has acquired, and a wait
// runs from the start of the previous holder's release to the acquisition
// (the first acquisition has none); goroutines already waiting when the
// nth acquisition happens still acquire, so count may exceed n by up to
// one less than the goroutines. With barging every goroutine loops freely
// and a wait is one call of its wait function.
func handoffs(ctx context.Context, waits []LockFunc, key string, n int, hold time.Duration, barging bool) handoffResult {
	ctx, f := newFailure(ctx)
	defer f.cancel()
	if barging {
		return freeForAll(ctx, f, waits, key, n, hold)
	}
	var (
		mu       sync.Mutex
		turn     = sync.NewCond(&mu)
		holder   = -1 // the last goroutine to acquire
		released time.Time
		left     = n
		count    = 0
		lat      = make([]time.Duration, 0, n)
		wg       sync.WaitGroup
	)
	stop := func(i int, err error) {
		f.set(i, err)
		mu.Lock()
		left = 0
		turn.Broadcast()
		mu.Unlock()
	}
	start := time.Now()
	for i, wait := range waits {
		wg.Go(func() {
			for {
				mu.Lock()
				for holder == i && left > 0 {
					turn.Wait()
				}
				if left <= 0 {
					mu.Unlock()
					return
				}
				mu.Unlock()
				release, err := wait(ctx, key)
				if err != nil {
					stop(i, err)
					return
				}
				mu.Lock()
				if !released.IsZero() {
					lat = append(lat, time.Since(released))
				}
				holder = i
				left--
				count++
				turn.Broadcast()
				mu.Unlock()
				if hold > 0 {
					time.Sleep(hold)
				}
				mu.Lock()
				released = time.Now()
				mu.Unlock()
				if err := release(); err != nil {
					stop(i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	slices.Sort(lat)
	return handoffResult{el, count, lat, f.err}
}

// freeForAll is handoffs with barging.
func freeForAll(ctx context.Context, f *failure, waits []LockFunc, key string, n int, hold time.Duration) handoffResult {
	var (
		left atomic.Int64
		lat  = make([][]time.Duration, len(waits))
		wg   sync.WaitGroup
	)
	left.Store(int64(n))
	start := time.Now()
	for i, wait := range waits {
		wg.Go(func() {
			for !f.failed.Load() && left.Add(-1) >= 0 {
				t0 := time.Now()
				release, err := wait(ctx, key)
				if err != nil {
					f.set(i, err)
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
				if hold > 0 {
					time.Sleep(hold)
				}
				if err := release(); err != nil {
					f.set(i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	waited := slices.Sorted(slices.Values(slices.Concat(lat...)))
	return handoffResult{el, len(waited), waited, f.err}
}

// failure keeps the first error of a run's goroutines, and cancels the
// run's context when it happens so that no goroutine waits on.
type failure struct {
	once   sync.Once
	failed atomic.Bool
	err    error // read after the goroutines ended
	cancel context.CancelFunc
}

func newFailure(parent context.Context) (context.Context, *failure) {
	ctx, cancel := context.WithCancel(parent)
	return ctx, &failure{cancel: cancel}
}

// set records err of goroutine i if it is the first.
func (f *failure) set(i int, err error) {
	f.once.Do(func() {
		f.err = fmt.Errorf("goroutine %d: %w", i, err)
		f.failed.Store(true)
		f.cancel()
	})
}

// libTag names the Lib in place li of an interleaved run inside its keys:
// two digits, so every Lib's keys are as long as every other's.
func libTag(li int) string { return fmt.Sprintf("L%02d", li) }
