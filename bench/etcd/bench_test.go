// Package etcdbench compares fencelock's etcd backend with the raw etcd
// transactions a lock needs at least (the limit) and with
// go.etcd.io/etcd/client/v3/concurrency's Mutex, in one run:
//
//	eval "$(scripts/testenv up etcd)"
//	cd bench/etcd && go test -run '^$' -bench . -benchtime 3s
//
// FENCELOCK_BENCH_ETCD, if set, names the server instead of
// FENCELOCK_TEST_ETCD.
//
// Three shapes: one goroutine uncontended (acquire+release of one key),
// 16 goroutines on distinct keys, and 8 goroutines contending for one key
// (handoffs/s, the wait of each handoff at p50 and p99, and the CPU the
// client process and the etcd server burned, in % of one core).
package etcdbench

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
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

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/fencelock/fencelock"
	fencelocketcd "github.com/fencelock/fencelock/backend/etcd"
	"github.com/fencelock/fencelock/driver"
)

const ttl = 10 * time.Second

func client(b *testing.B) *clientv3.Client {
	b.Helper()
	raw := os.Getenv("FENCELOCK_BENCH_ETCD")
	if raw == "" {
		raw = os.Getenv("FENCELOCK_TEST_ETCD")
	}
	if raw == "" {
		b.Skip("neither FENCELOCK_BENCH_ETCD nor FENCELOCK_TEST_ETCD is set")
	}
	u, err := url.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(u.Host, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	return cli
}

func unique() string {
	var r [4]byte
	_, _ = crand.Read(r[:])
	return "bench-" + hex.EncodeToString(r[:])
}

// A lib is one lock implementation: try makes one attempt, wait blocks
// until held; both return the release function.
type lib struct {
	name  string
	setup func(b *testing.B, cli *clientv3.Client, i int) (try, wait func(ctx context.Context, key string) (func() error, error))
}

var errHeld = errors.New("held")

// raw is what every etcd lock costs at least: a put-if-absent transaction
// on a lease granted once, and a delete guarded by the create revision.
// Waiting spins without backoff (the ceiling).
var raw = lib{"raw", func(b *testing.B, cli *clientv3.Client, _ int) (try, wait func(context.Context, string) (func() error, error)) {
	lease, err := cli.Grant(context.Background(), int64(ttl/time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Revoke(context.Background(), lease.ID) })
	try = func(ctx context.Context, key string) (func() error, error) {
		k := "/raw/" + key
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, "x", clientv3.WithLease(lease.ID))).Commit()
		if err != nil {
			return nil, err
		}
		if !resp.Succeeded {
			return nil, errHeld
		}
		rev := resp.Header.Revision
		return func() error {
			_, err := cli.Txn(context.Background()).If(clientv3.Compare(clientv3.CreateRevision(k), "=", rev)).
				Then(clientv3.OpDelete(k)).Commit()
			return err
		}, nil
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
	return lib{name, func(b *testing.B, cli *clientv3.Client, _ int) (try, wait func(context.Context, string) (func() error, error)) {
		mu.Lock()
		defer mu.Unlock()
		cl := clients[b]
		if !shared || cl == nil {
			be, err := fencelocketcd.New(context.Background(), cli, &fencelocketcd.Options{Prefix: "/fencelock-bench/"})
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

// backendOnly calls the backend's Acquire and Release directly, without
// the engine (no lease object, renewal scheduling, loss watch or
// local-validity timers): it separates the backend's cost from the
// engine's. It cannot wait.
var backendOnly = lib{"fencelock-backend-only", func(b *testing.B, cli *clientv3.Client, i int) (try, wait func(context.Context, string) (func() error, error)) {
	be, err := fencelocketcd.New(context.Background(), cli, &fencelocketcd.Options{Prefix: "/fencelock-bench/"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	owner := "bench-" + strconv.Itoa(i) + "-" + unique()
	try = func(ctx context.Context, key string) (func() error, error) {
		g, err := be.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl})
		if err != nil {
			return nil, err
		}
		return func() error { return be.Release(ctx, g) }, nil
	}
	return try, nil
}}

// mutex is concurrency.Mutex on a Session that is reused (creating a
// session costs a lease grant, as much as a lock).
var mutex = lib{"concurrency.Mutex", func(b *testing.B, cli *clientv3.Client, _ int) (try, wait func(context.Context, string) (func() error, error)) {
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl/time.Second)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	lock := func(blocking bool) func(context.Context, string) (func() error, error) {
		return func(ctx context.Context, key string) (func() error, error) {
			m := concurrency.NewMutex(s, "/mutex/"+key)
			var err error
			if blocking {
				err = m.Lock(ctx)
			} else {
				err = m.TryLock(ctx)
			}
			if err != nil {
				return nil, err
			}
			return func() error { return m.Unlock(context.Background()) }, nil
		}
	}
	return lock(false), lock(true)
}}

var libs = []lib{raw, fencelockLib("fencelock", true), backendOnly, mutex}

// BenchmarkUncontended: one goroutine, acquire and release one key.
func BenchmarkUncontended(b *testing.B) {
	for _, l := range libs {
		b.Run(l.name, func(b *testing.B) {
			cli := client(b)
			try, _ := l.setup(b, cli, 0)
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
			cli := client(b)
			base := unique()
			var next atomic.Int64
			b.SetParallelism((g + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1))
				try, _ := l.setup(b, cli, i)
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
// again until another one has taken it (no barging). With hold=1ms every
// other goroutine is already waiting in its library's acquire when the
// lock is released. The handoff wait is the time from the start of the
// holder's release to the next holder's return from acquire. raw spins
// without backoff: the ceiling, at the cost of the CPU it burns
// (client-cpu-% and server-cpu-% are % of one core).
func BenchmarkContended8(b *testing.B) {
	for _, hold := range []time.Duration{0, time.Millisecond} {
		b.Run("hold="+hold.String(), func(b *testing.B) { contended(b, hold) })
	}
}

func contended(b *testing.B, hold time.Duration) {
	const g = 8
	for _, l := range []lib{raw, fencelockLib("fencelock-1client", true), fencelockLib("fencelock-8clients", false), mutex} {
		b.Run(l.name, func(b *testing.B) {
			cli := client(b)
			waits := make([]func(context.Context, string) (func() error, error), g)
			for i := range g {
				_, waits[i] = l.setup(b, cli, i)
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
			srv0 := serverCPU()
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
			b.ReportMetric(float64(b.N)/el.Seconds(), "handoffs/s")
			b.ReportMetric(float64(pct(lat, 50).Microseconds()), "p50-wait-µs")
			b.ReportMetric(float64(pct(lat, 99).Microseconds()), "p99-wait-µs")
			b.ReportMetric(100*cpu.Seconds()/el.Seconds(), "client-cpu-%")
			if srv0 >= 0 {
				b.ReportMetric(100*(serverCPU()-srv0).Seconds()/el.Seconds(), "server-cpu-%")
			}
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

// serverCPU reads the etcd test server's CPU time from /proc, when
// scripts/testenv started it (its pid file); -1 if unknown.
func serverCPU() time.Duration {
	state := os.Getenv("FENCELOCK_TESTENV_STATE")
	if state == "" || os.Getenv("FENCELOCK_BENCH_ETCD") != "" {
		return -1
	}
	pid, err := os.ReadFile(state + "/etcd/pid")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(pid)) // "PID [start time]"
	if len(f) == 0 {
		return -1
	}
	stat, err := os.ReadFile("/proc/" + f[0] + "/stat")
	if err != nil {
		return -1
	}
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 13 {
		return -1
	}
	ut, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ
}
