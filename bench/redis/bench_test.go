// Package redisbench compares fencelock's Redis backend with the raw Redis
// operations (the limit) and with github.com/bsm/redislock and
// github.com/go-redsync/redsync/v4, in one run:
//
//	eval "$(scripts/testenv up redis)"
//	cd bench/redis && go test -run '^$' -bench . -benchtime 3s
//
// FENCELOCK_BENCH_REDIS, if set, names the server instead of
// FENCELOCK_TEST_REDIS: the test server fsyncs every write (appendfsync
// always), so its numbers measure the disk more than the lock.
//
// Three shapes: one goroutine uncontended (acquire+release of one key),
// 16 goroutines on distinct keys, and 8 goroutines contending for one key
// (handoffs/s, the wait of each acquisition at p50 and p99, and the CPU
// the client process and the Redis server burned, in % of one core).
package redisbench

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
)

const ttl = 10 * time.Second

func client(b *testing.B) *goredis.Client {
	b.Helper()
	u := os.Getenv("FENCELOCK_BENCH_REDIS")
	if u == "" {
		u = os.Getenv("FENCELOCK_TEST_REDIS")
	}
	if u == "" {
		b.Skip("neither FENCELOCK_BENCH_REDIS nor FENCELOCK_TEST_REDIS is set")
	}
	opt, err := goredis.ParseURL(u)
	if err != nil {
		b.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	b.Cleanup(func() { rdb.Close() })
	return rdb
}

func unique() string {
	var r [4]byte
	_, _ = crand.Read(r[:])
	return "bench-" + hex.EncodeToString(r[:])
}

// A lib is one lock implementation: acquire blocks until held (or fails
// once, for try), release gives the lock back.
type lib struct {
	name string
	// setup returns try (one attempt) and wait (blocking) acquirers for
	// goroutine i; both return the release function.
	setup func(b *testing.B, rdb *goredis.Client, i int) (try, wait func(ctx context.Context, key string) (func() error, error))
}

var errHeld = errors.New("held")

var compareAndDelete = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func token() string {
	var r [16]byte
	_, _ = crand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// raw is SET NX PX and a compare-and-delete script: what every Redis lock
// costs at least. Waiting spins without backoff (the ceiling).
var raw = lib{"raw", func(b *testing.B, rdb *goredis.Client, _ int) (try, wait func(context.Context, string) (func() error, error)) {
	try = func(ctx context.Context, key string) (func() error, error) {
		tok := token()
		ok, err := rdb.SetNX(ctx, key, tok, ttl).Result()
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errHeld
		}
		return func() error { return compareAndDelete.Run(ctx, rdb, []string{key}, tok).Err() }, nil
	}
	wait = func(ctx context.Context, key string) (func() error, error) {
		for {
			rel, err := try(ctx, key)
			if !errors.Is(err, errHeld) {
				return rel, err
			}
		}
	}
	return try, wait
}}

func fencelockLib(name string, shared bool) lib {
	var (
		mu      sync.Mutex
		clients = map[*testing.B]*fencelock.Client{} // the shared client of each run
	)
	return lib{name, func(b *testing.B, rdb *goredis.Client, _ int) (try, wait func(context.Context, string) (func() error, error)) {
		mu.Lock()
		defer mu.Unlock()
		cl := clients[b]
		if !shared || cl == nil {
			be, err := fencelockredis.New(context.Background(), rdb, &fencelockredis.Options{Prefix: "bench", SkipChecks: true, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			cl, err = fencelock.New(be, &fencelock.Options{TTL: ttl})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				cl.Close()
				mu.Lock()
				delete(clients, b)
				mu.Unlock()
			})
			if shared {
				clients[b] = cl
			}
		}
		release := func(l *fencelock.Lease) func() error {
			return func() error { return l.Release(context.Background()) }
		}
		try = func(ctx context.Context, key string) (func() error, error) {
			l, err := cl.TryAcquire(ctx, key)
			if err != nil {
				return nil, err
			}
			return release(l), nil
		}
		wait = func(ctx context.Context, key string) (func() error, error) {
			l, err := cl.Acquire(ctx, key)
			if err != nil {
				return nil, err
			}
			return release(l), nil
		}
		return try, wait
	}}
}

// redislock waits with LinearBackoff(10ms) (its README suggests 100ms).
var redislockLib = lib{"redislock", func(b *testing.B, rdb *goredis.Client, _ int) (try, wait func(context.Context, string) (func() error, error)) {
	rl := redislock.New(rdb)
	obtain := func(opt *redislock.Options) func(context.Context, string) (func() error, error) {
		return func(ctx context.Context, key string) (func() error, error) {
			l, err := rl.Obtain(ctx, key, ttl, opt)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(context.Background()) }, nil
		}
	}
	return obtain(nil), obtain(&redislock.Options{RetryStrategy: redislock.LinearBackoff(10 * time.Millisecond)})
}}

// redsync waits with its default retry delay (random 50–250ms), with
// unlimited tries.
var redsyncLib = lib{"redsync", func(b *testing.B, rdb *goredis.Client, _ int) (try, wait func(context.Context, string) (func() error, error)) {
	rs := redsync.New(redsyncgoredis.NewPool(rdb))
	lock := func(tries int) func(context.Context, string) (func() error, error) {
		return func(ctx context.Context, key string) (func() error, error) {
			m := rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(tries))
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() error { _, err := m.UnlockContext(context.Background()); return err }, nil
		}
	}
	return lock(1), lock(1 << 30)
}}

// backendOnly calls the backend's Acquire and Release directly, without
// the engine (no lease, renewal scheduling or local-validity timers): it
// separates the backend's cost from the engine's. It cannot wait.
var backendOnly = lib{"fencelock-backend-only", func(b *testing.B, rdb *goredis.Client, i int) (try, wait func(context.Context, string) (func() error, error)) {
	be, err := fencelockredis.New(context.Background(), rdb, &fencelockredis.Options{Prefix: "bench", SkipChecks: true, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	owner := "bench-" + strconv.Itoa(i)
	try = func(ctx context.Context, key string) (func() error, error) {
		g, err := be.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl})
		if err != nil {
			return nil, err
		}
		return func() error { return be.Release(ctx, g) }, nil
	}
	return try, nil
}}

var libs = []lib{raw, fencelockLib("fencelock", true), backendOnly, redislockLib, redsyncLib}

// BenchmarkUncontended: one goroutine, acquire and release one key.
func BenchmarkUncontended(b *testing.B) {
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			rdb := client(b)
			try, _ := l.setup(b, rdb, 0)
			ctx := context.Background()
			key := unique()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				t0 := time.Now()
				rel, err := try(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := rel(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			el := time.Since(start)
			b.ReportMetric(float64(b.N)/el.Seconds(), "acq+rel/s")
			b.ReportMetric(float64(pct(lat, 50).Microseconds()), "p50-µs")
		})
	}
}

// BenchmarkDistinct16: 16 goroutines, each acquiring and releasing its own
// key.
func BenchmarkDistinct16(b *testing.B) {
	const g = 16
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			rdb := client(b)
			base := unique()
			var next atomic.Int64
			b.SetParallelism((g + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1))
				try, _ := l.setup(b, rdb, i)
				key := base + "-" + strconv.Itoa(i)
				ctx := context.Background()
				for pb.Next() {
					rel, err := try(ctx, key)
					if err != nil {
						b.Error(err)
						return
					}
					if err := rel(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "acq+rel/s")
		})
	}
}

// BenchmarkContended8: 8 goroutines take turns on one key; b.N is the
// number of handoffs. A goroutine that released the lock does not try
// again until another one has taken it (no barging: otherwise a poller's
// releaser simply takes the lock back, and nothing is handed off). With
// hold=0 the holder releases at once, so the previous holder, just
// admitted again, often arrives right after the release and wins with its
// first, immediate attempt (a ping-pong between two goroutines that
// flatters pollers); with hold=1ms every other goroutine is already
// waiting in its library's acquire when the lock is released. The
// handoff wait is the time from the start of the holder's release to the
// next holder's return from acquire. raw spins without backoff: the
// ceiling, at the cost of the CPU it burns (client-cpu-% and server-cpu-%
// are % of one core).
func BenchmarkContended8(b *testing.B) {
	for _, hold := range []time.Duration{0, time.Millisecond} {
		b.Run("hold="+hold.String(), func(b *testing.B) { contended(b, hold) })
	}
}

func contended(b *testing.B, hold time.Duration) {
	const g = 8
	for _, l := range []lib{raw, fencelockLib("fencelock-1client", true), fencelockLib("fencelock-8clients", false), redislockLib, redsyncLib} {
		b.Run(l.name, func(b *testing.B) {
			rdb := client(b)
			waits := make([]func(context.Context, string) (func() error, error), g)
			for i := range g {
				_, waits[i] = l.setup(b, rdb, i)
			}
			key := unique()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			var (
				mu       sync.Mutex
				turn     = sync.NewCond(&mu)
				holder   = -1 // last goroutine to acquire
				released time.Time
				left     = b.N
				lat      = make([]time.Duration, 0, b.N)
				wg       sync.WaitGroup
			)
			srv0 := serverCPU(b, rdb)
			cpu0 := processCPU()
			b.ResetTimer()
			start := time.Now()
			for i := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
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
						rel, err := waits[i](ctx, key)
						if err != nil {
							b.Error(err)
							mu.Lock()
							left = 0
							turn.Broadcast()
							mu.Unlock()
							return
						}
						mu.Lock()
						if !released.IsZero() {
							lat = append(lat, time.Since(released))
						}
						holder = i
						left--
						turn.Broadcast()
						mu.Unlock()
						if hold > 0 {
							time.Sleep(hold)
						}
						mu.Lock()
						released = time.Now()
						mu.Unlock()
						if err := rel(); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			cpu := processCPU() - cpu0
			srv := serverCPU(b, rdb) - srv0
			b.ReportMetric(float64(b.N)/el.Seconds(), "handoffs/s")
			b.ReportMetric(float64(pct(lat, 50).Microseconds()), "p50-wait-µs")
			b.ReportMetric(float64(pct(lat, 99).Microseconds()), "p99-wait-µs")
			b.ReportMetric(100*cpu.Seconds()/el.Seconds(), "client-cpu-%")
			b.ReportMetric(100*srv.Seconds()/el.Seconds(), "server-cpu-%")
		})
	}
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU reads used_cpu_user + used_cpu_sys from INFO cpu.
func serverCPU(b *testing.B, rdb *goredis.Client) time.Duration {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// quiet drops the backend's "settings not checked" warning.
var quiet = slog.New(slog.DiscardHandler)
