package benchkit

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// memoryLib is fencelock on a fresh in-process memory store per run.
func memoryLib(name string, shared bool) Lib {
	return FencelockLib(name, shared, func(*testing.B) func() (*fencelock.Client, error) {
		store := memory.NewStore()
		return func() (*fencelock.Client, error) {
			return fencelock.New(store.Backend(), &fencelock.Options{TTL: 10 * time.Second})
		}
	})
}

// memoryBackendLib is BackendLib on a fresh memory store per run.
var memoryBackendLib = BackendLib("backend-only", false, 10*time.Second, func(*testing.B) func() (driver.Backend, error) {
	store := memory.NewStore()
	return func() (driver.Backend, error) { return store.Backend(), nil }
})

// mapLib is a lock on a map: try fails with ErrHeld, wait is Poll with the
// given backoff.
func mapLib(name string, minBackoff, maxBackoff time.Duration) Lib {
	return Lib{Name: name, Setup: func(*testing.B) Lockers {
		var (
			mu   sync.Mutex
			held = map[string]bool{}
		)
		try := func(_ context.Context, key string) (func() error, error) {
			mu.Lock()
			defer mu.Unlock()
			if held[key] {
				return nil, ErrHeld
			}
			held[key] = true
			return func() error {
				mu.Lock()
				delete(held, key)
				mu.Unlock()
				return nil
			}, nil
		}
		return Same(try, Poll(try, minBackoff, maxBackoff))
	}}
}

// checked wraps lib so that every acquisition checks mutual exclusion per
// key and, with turns, that no goroutine acquires twice in a row (the
// harness's no-barging promise); a violation fails the acquisition.
func checked(lib Lib, turns bool) Lib {
	return Lib{Name: lib.Name, Setup: func(b *testing.B) Lockers {
		ls := lib.Setup(b)
		var (
			mu     sync.Mutex
			holder = map[string]int{} // key → goroutine holding it
			last   = map[string]int{} // key → goroutine that held it last
		)
		check := func(i int, lock LockFunc) LockFunc {
			if lock == nil {
				return nil
			}
			return func(ctx context.Context, key string) (func() error, error) {
				release, err := lock(ctx, key)
				if err != nil {
					return nil, err
				}
				mu.Lock()
				defer mu.Unlock()
				if h, ok := holder[key]; ok {
					return nil, fmt.Errorf("goroutine %d acquired %s held by goroutine %d", i, key, h)
				}
				if l, ok := last[key]; turns && ok && l == i {
					return nil, fmt.Errorf("goroutine %d acquired %s twice in a row", i, key)
				}
				holder[key], last[key] = i, i
				return func() error {
					mu.Lock()
					delete(holder, key)
					mu.Unlock()
					return release()
				}, nil
			}
		}
		return func(i int) (LockFunc, LockFunc) {
			try, wait := ls(i)
			return check(i, try), check(i, wait)
		}
	}}
}

// bench runs f as a benchmark of n iterations and returns its result; N is
// 0 if it failed.
func bench(t *testing.T, n int, f func(b *testing.B)) testing.BenchmarkResult {
	t.Helper()
	bt := flag.Lookup("test.benchtime")
	old := bt.Value.String()
	if err := bt.Value.Set(strconv.Itoa(n) + "x"); err != nil {
		t.Fatal(err)
	}
	defer bt.Value.Set(old)
	return testing.Benchmark(f)
}

func wantMetrics(t *testing.T, name string, r testing.BenchmarkResult, metrics ...string) {
	t.Helper()
	if r.N == 0 {
		t.Fatalf("%s failed", name)
	}
	for _, m := range metrics {
		if _, ok := r.Extra[m]; !ok {
			t.Errorf("%s: no metric %q in %v", name, m, r.Extra)
		}
	}
}

var throughputLibs = []Lib{
	memoryLib("fencelock", true),
	memoryLib("fencelock-clients", false),
	memoryBackendLib,
	mapLib("map", 0, 0),
}

func TestThroughputLoops(t *testing.T) {
	for _, lib := range throughputLibs {
		for _, g := range []int{1, 4} {
			for _, fresh := range []bool{false, true} {
				c := newConfig([]Option{Rate("ops/s")})
				c.fresh = fresh
				name := fmt.Sprintf("%s/goroutines=%d/fresh=%v", lib.Name, g, fresh)
				r := bench(t, 50, func(b *testing.B) { c.distinct(b, g, checked(lib, false)) })
				wantMetrics(t, name, r, "ops/s", "p50-µs")
			}
		}
	}
}

func TestContended(t *testing.T) {
	const hold = 2 * time.Millisecond
	libs := []Lib{
		memoryLib("fencelock-1client", true),
		memoryLib("fencelock-4clients", false),
		mapLib("spin", 0, 0),
		mapLib("poll", 100*time.Microsecond, time.Millisecond),
	}
	var served atomic.Int64
	cpu := func() (time.Duration, bool) { return time.Duration(served.Add(1)) * time.Millisecond, true }
	c := newConfig([]Option{Unit(time.Millisecond), ServerCPU(cpu), PerHandoff("calls/handoff", func() (float64, error) {
		return float64(served.Load()), nil
	})})
	for _, lib := range libs {
		for _, barging := range []bool{false, true} {
			c.barging = barging
			name := fmt.Sprintf("%s/barging=%v", lib.Name, barging)
			r := bench(t, 40, func(b *testing.B) { c.contended(b, 4, hold, checked(lib, !barging)) })
			wantMetrics(t, name, r, "handoffs/s", "p50-wait-ms", "p99-wait-ms", "max-wait-ms", "server-cpu-%", "calls/handoff")
			if runtime.GOOS == "linux" {
				wantMetrics(t, name, r, "client-cpu-%", "client-cpu-us/handoff")
			}
			// The holds follow one another: at most one handoff per hold.
			if rate := r.Extra["handoffs/s"]; rate > float64(time.Second/hold) {
				t.Errorf("%s: %.0f handoffs/s with a %v hold", name, rate, hold)
			}
		}
	}
}

func TestContendedNeedsWait(t *testing.T) {
	r := bench(t, 1, func(b *testing.B) { newConfig(nil).contended(b, 2, 0, memoryBackendLib) })
	if r.N != 0 {
		t.Error("Contended ran a Lib that cannot wait")
	}
}

func TestInterleaved(t *testing.T) {
	libs := []Lib{mapLib("raw", 0, 0), memoryLib("fencelock", true), memoryBackendLib}
	r := bench(t, 5, func(b *testing.B) { Interleaved(b, 4, 40, libs, FreshKeys()) })
	wantMetrics(t, "Interleaved", r, "raw-acq+rel/s", "fencelock-acq+rel/s", "fencelock/raw", "backend-only/raw")

	contenders := []Lib{mapLib("poll", 50*time.Microsecond, time.Millisecond), memoryLib("fencelock", false)}
	r = bench(t, 3, func(b *testing.B) { InterleavedContended(b, 4, 20, contenders, Barging(), Unit(time.Millisecond)) })
	wantMetrics(t, "InterleavedContended", r, "poll-handoffs/s", "fencelock-handoffs/s", "fencelock/poll",
		"poll-p50-wait-ms", "fencelock-p99-wait-ms")
}

// TestInterleavedKeysSameLength checks that Interleaved gives every Lib
// keys of one length, whatever its name, and no key to two Libs: a longer
// key name costs a store time (on Redis at 16 goroutines, 64 bytes cost
// raw 0.04–0.06 of its rate), which a ratio would charge to the library.
func TestInterleavedKeysSameLength(t *testing.T) {
	var (
		mu   sync.Mutex
		seen = map[string]map[string]bool{} // Lib name → keys it locked
	)
	recording := func(name string) Lib {
		lib := mapLib(name, 0, 0)
		return Lib{Name: name, Setup: func(b *testing.B) Lockers {
			ls := lib.Setup(b)
			return func(i int) (LockFunc, LockFunc) {
				try, _ := ls(i)
				return func(ctx context.Context, key string) (func() error, error) {
					mu.Lock()
					if seen[name] == nil {
						seen[name] = map[string]bool{}
					}
					seen[name][key] = true
					mu.Unlock()
					return try(ctx, key)
				}, nil
			}
		}}
	}
	for _, fresh := range []bool{false, true} {
		clear(seen)
		libs := []Lib{recording("raw"), recording("a-library-with-a-much-longer-name"), recording("x")}
		var opts []Option
		if fresh {
			opts = append(opts, FreshKeys())
		}
		bench(t, 2, func(b *testing.B) { Interleaved(b, 3, 6, libs, opts...) })
		// Fresh keys number the cycles, and every Lib runs the same cycle
		// numbers: the same lengths (which goroutine takes which cycle
		// varies, so compared as sets).
		owner := map[string]string{}
		var want []int
		for name, keys := range seen {
			var lengths []int
			for k := range keys {
				lengths = append(lengths, len(k))
				if o, ok := owner[k]; ok && o != name {
					t.Errorf("fresh=%v: key %q locked by both %s and %s", fresh, k, o, name)
				}
				owner[k] = name
			}
			slices.Sort(lengths)
			lengths = slices.Compact(lengths)
			if want == nil {
				want = lengths
			} else if !slices.Equal(lengths, want) {
				t.Errorf("fresh=%v: %s's keys are %v bytes long, another Lib's %v", fresh, name, lengths, want)
			}
		}
		if len(seen) != len(libs) {
			t.Errorf("fresh=%v: %d of %d Libs locked anything", fresh, len(seen), len(libs))
		}
	}
}

// TestSubBenchmarks runs the exported loops as a benchmark would, with
// their sub-benchmark levels.
func TestSubBenchmarks(t *testing.T) {
	libs := []Lib{mapLib("raw", 0, 0), memoryLib("fencelock", true)}
	r := bench(t, 10, func(b *testing.B) {
		Uncontended(b, libs)
		Distinct(b, 4, libs)
		Contended(b, 3, libs, Holds(0, 100*time.Microsecond))
		Contended(b, 3, libs, Barging())
	})
	if r.N == 0 {
		t.Fatal("failed")
	}
}

func TestPercentile(t *testing.T) {
	d := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0, 1}, {50, 6}, {90, 10}, {99, 10}, {100, 10}} {
		if got := Percentile(d, c.p); got != c.want {
			t.Errorf("Percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if d[0] != 5 {
		t.Error("Percentile sorted its argument")
	}
	if Percentile(nil, 50) != 0 {
		t.Error("Percentile of nothing is not 0")
	}
	if UniqueKey() == UniqueKey() {
		t.Error("UniqueKey repeats")
	}
}

func TestTestenvCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	self, ok := readStat(strconv.Itoa(os.Getpid()))
	if !ok {
		t.Fatal("cannot read /proc/self/stat")
	}
	state := t.TempDir()
	t.Setenv("FENCELOCK_TESTENV_STATE", state)
	if TestenvCPU("x") != nil {
		t.Error("TestenvCPU without a pid file")
	}
	write := func(start int64) {
		if err := os.MkdirAll(state+"/x", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(state+"/x/pid", fmt.Appendf(nil, "%d %d\n", os.Getpid(), start), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(self.start)
	for end := time.Now().Add(30 * time.Millisecond); time.Now().Before(end); { // burn some CPU
		_ = UniqueKey()
	}
	if d, ok := TestenvCPU("x")(); !ok || d <= 0 {
		t.Errorf("TestenvCPU of this process = %v, %v", d, ok)
	}
	write(self.start + 1)
	if _, ok := TestenvCPU("x")(); ok {
		t.Error("TestenvCPU of a process started at another time")
	}
}

// TestScale holds 10 and 200 leases on the memory backend with a short
// TTL: every lease is renewed every interval, in a number of batch calls
// that does not grow with the number of leases.
func TestScale(t *testing.T) {
	open := func(*testing.B) (driver.Backend, *fencelock.Options) {
		return memory.NewStore().Backend(), &fencelock.Options{TTL: 600 * time.Millisecond}
	}
	for _, n := range []int{10, 200} {
		name := fmt.Sprintf("leases=%d", n)
		r := bench(t, 1, func(b *testing.B) { newConfig(nil).scale(b, n, 3, open) })
		wantMetrics(t, name, r, "renew-calls/interval", "renewed/interval", "client-cpu-%", "acquire-s", "lost")
		if got := r.Extra["renewed/interval"]; got < float64(n)*0.6 {
			t.Errorf("%s: %.1f renewed per interval, want about %d", name, got, n)
		}
		// The engine batches every lease due within half an interval: at
		// most about two calls per interval, whatever the count.
		if got := r.Extra["renew-calls/interval"]; got > 4 {
			t.Errorf("%s: %.1f renewal calls per interval, want O(1) (≤ 4)", name, got)
		}
	}
}
