// Package zookeeper_test benchmarks fencelock's ZooKeeper backend against
// the raw store operations (create an EPHEMERAL|SEQUENTIAL znode, delete
// it: the limit) and against go-zookeeper's own zk.Lock.
//
//	eval "$(scripts/testenv up zookeeper)"
//	cd bench/zookeeper && go test -bench . -benchtime 3s
package zookeeper_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/zookeeper"
	"github.com/go-zookeeper/zk"
)

const sessTO = 10 * time.Second

type env struct {
	url     string
	servers []string
	root    string // for raw and zk.Lock
}

func setup(b *testing.B) env {
	raw := os.Getenv("FENCELOCK_TEST_ZOOKEEPER")
	if raw == "" {
		b.Skip("FENCELOCK_TEST_ZOOKEEPER not set")
	}
	u, err := url.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	id := hex.EncodeToString(rnd[:])
	q := u.Query()
	q.Set("session_timeout", sessTO.String())
	q.Set("prefix", "fencelock-bench-"+id)
	u.RawQuery = q.Encode()
	return env{url: u.String(), servers: strings.Split(u.Host, ","), root: "/bench-raw-" + id}
}

func (e env) conn(b *testing.B) *zk.Conn {
	c, _, err := zk.Connect(e.servers, sessTO, zk.WithLogInfo(false))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	// Wait for the session.
	for c.State() != zk.StateHasSession {
		time.Sleep(time.Millisecond)
	}
	return c
}

func (e env) client(b *testing.B) *fencelock.Client {
	c, err := fencelock.Open(context.Background(), e.url, &fencelock.Options{TTL: sessTO, Logger: benchLogger})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func ensure(b *testing.B, c *zk.Conn, p string) {
	cur := ""
	for _, seg := range strings.Split(p[1:], "/") {
		cur += "/" + seg
		if _, err := c.Create(cur, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
			b.Fatal(err)
		}
	}
}

// rawCycle is the store's limit: create an ephemeral sequential znode and
// delete it.
func rawCycle(b *testing.B, c *zk.Conn, parent string) {
	p, err := c.Create(parent+"/lock-", []byte("owner"), zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Delete(p, -1); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkUncontended: one goroutine, one key, acquire+release.
func BenchmarkUncontended(b *testing.B) {
	e := setup(b)
	b.Run("raw", func(b *testing.B) {
		c := e.conn(b)
		parent := e.root + "/unc"
		ensure(b, c, parent)
		for b.Loop() {
			rawCycle(b, c, parent)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	b.Run("zklock", func(b *testing.B) {
		c := e.conn(b)
		l := zk.NewLock(c, e.root+"/unc-lock", zk.WorldACL(zk.PermAll))
		for b.Loop() {
			if err := l.Lock(); err != nil {
				b.Fatal(err)
			}
			if err := l.Unlock(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	b.Run("fencelock", func(b *testing.B) {
		c := e.client(b)
		ctx := context.Background()
		for b.Loop() {
			l, err := c.Acquire(ctx, "unc")
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
}

// parallel runs n goroutines sharing b.N iterations of f(worker).
func parallel(b *testing.B, n int, f func(w int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				f(w)
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkDistinct16: 16 goroutines of one process (one session), each on
// its own key.
func BenchmarkDistinct16(b *testing.B) {
	e := setup(b)
	const n = 16
	b.Run("raw", func(b *testing.B) {
		c := e.conn(b)
		for w := range n {
			ensure(b, c, fmt.Sprintf("%s/d16/%d", e.root, w))
		}
		parallel(b, n, func(w int) { rawCycle(b, c, fmt.Sprintf("%s/d16/%d", e.root, w)) })
	})
	b.Run("zklock", func(b *testing.B) {
		c := e.conn(b)
		locks := make([]*zk.Lock, n)
		for w := range locks {
			locks[w] = zk.NewLock(c, fmt.Sprintf("%s/d16-lock/%d", e.root, w), zk.WorldACL(zk.PermAll))
		}
		parallel(b, n, func(w int) {
			if err := locks[w].Lock(); err != nil {
				b.Error(err)
				return
			}
			if err := locks[w].Unlock(); err != nil {
				b.Error(err)
			}
		})
	})
	b.Run("fencelock", func(b *testing.B) {
		c := e.client(b)
		ctx := context.Background()
		parallel(b, n, func(w int) {
			l, err := c.Acquire(ctx, fmt.Sprintf("d16/%d", w))
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
			}
		})
	})
}

// BenchmarkContended8: 8 contenders (each its own session, as separate
// processes would be) on one key; every acquisition is a hand-off.
func BenchmarkContended8(b *testing.B) {
	e := setup(b)
	const n = 8
	report := func(b *testing.B, waits [][]time.Duration) {
		var all []time.Duration
		for _, w := range waits {
			all = append(all, w...)
		}
		slices.Sort(all)
		if len(all) == 0 {
			return
		}
		b.ReportMetric(float64(len(all))/b.Elapsed().Seconds(), "handoffs/s")
		b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-wait-ms")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-wait-ms")
	}
	b.Run("zklock", func(b *testing.B) {
		locks := make([]*zk.Lock, n)
		for w := range locks {
			locks[w] = zk.NewLock(e.conn(b), e.root+"/c8-lock", zk.WorldACL(zk.PermAll))
		}
		waits := make([][]time.Duration, n)
		parallel(b, n, func(w int) {
			start := time.Now()
			if err := locks[w].Lock(); err != nil {
				b.Error(err)
				return
			}
			waits[w] = append(waits[w], time.Since(start))
			if err := locks[w].Unlock(); err != nil {
				b.Error(err)
			}
		})
		report(b, waits)
	})
	b.Run("fencelock", func(b *testing.B) {
		cs := make([]*fencelock.Client, n)
		for w := range cs {
			cs[w] = e.client(b)
		}
		ctx := context.Background()
		waits := make([][]time.Duration, n)
		parallel(b, n, func(w int) {
			start := time.Now()
			l, err := cs[w].Acquire(ctx, "c8")
			if err != nil {
				b.Error(err)
				return
			}
			waits[w] = append(waits[w], time.Since(start))
			if err := l.Release(ctx); err != nil {
				b.Error(err)
			}
		})
		report(b, waits)
	})
}

// BenchmarkInterleaved measures the ratios on a noisy machine: each
// iteration runs a round of `round` acquire+release cycles of each variant
// back to back (raw, zk.Lock, fencelock, single goroutine, one key each),
// and the reported ratios are medians over the rounds. Run it with
// -benchtime 15x or so.
func BenchmarkInterleaved(b *testing.B) {
	e := setup(b)
	const round = 100
	c := e.conn(b)
	parent := e.root + "/il"
	ensure(b, c, parent)
	lk := zk.NewLock(e.conn(b), e.root+"/il-lock", zk.WorldACL(zk.PermAll))
	fc := e.client(b)
	ctx := context.Background()
	var rz, rf, raw []float64
	for b.Loop() {
		t0 := time.Now()
		for range round {
			rawCycle(b, c, parent)
		}
		t1 := time.Now()
		for range round {
			if err := lk.Lock(); err != nil {
				b.Fatal(err)
			}
			if err := lk.Unlock(); err != nil {
				b.Fatal(err)
			}
		}
		t2 := time.Now()
		for range round {
			l, err := fc.Acquire(ctx, "il")
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		t3 := time.Now()
		dr, dz, df := t1.Sub(t0).Seconds(), t2.Sub(t1).Seconds(), t3.Sub(t2).Seconds()
		raw = append(raw, round/dr)
		rz = append(rz, dr/dz)
		rf = append(rf, dr/df)
	}
	med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	b.ReportMetric(med(raw), "raw-ops/s")
	b.ReportMetric(med(rz), "zklock/raw")
	b.ReportMetric(med(rf), "fencelock/raw")
}

// BenchmarkInterleavedContended alternates rounds of 8 contenders (own
// sessions) on one key with zk.Lock and with fencelock, and reports the
// median hand-off rate of each and their ratio, plus wait percentiles over
// all rounds.
func BenchmarkInterleavedContended(b *testing.B) {
	e := setup(b)
	const n, perWorker = 8, 25
	locks := make([]*zk.Lock, n)
	cs := make([]*fencelock.Client, n)
	for w := range n {
		locks[w] = zk.NewLock(e.conn(b), e.root+"/ilc-lock", zk.WorldACL(zk.PermAll))
		cs[w] = e.client(b)
	}
	ctx := context.Background()
	run := func(f func(w int) time.Duration) (float64, []time.Duration) {
		var mu sync.Mutex
		var waits []time.Duration
		var wg sync.WaitGroup
		start := time.Now()
		for w := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perWorker {
					d := f(w)
					mu.Lock()
					waits = append(waits, d)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return float64(n*perWorker) / time.Since(start).Seconds(), waits
	}
	var rz, rf, ratio []float64
	var wz, wf []time.Duration
	for b.Loop() {
		hz, w1 := run(func(w int) time.Duration {
			t := time.Now()
			if err := locks[w].Lock(); err != nil {
				b.Error(err)
				return 0
			}
			d := time.Since(t)
			locks[w].Unlock()
			return d
		})
		hf, w2 := run(func(w int) time.Duration {
			t := time.Now()
			l, err := cs[w].Acquire(ctx, "ilc")
			if err != nil {
				b.Error(err)
				return 0
			}
			d := time.Since(t)
			l.Release(ctx)
			return d
		})
		rz, rf, ratio = append(rz, hz), append(rf, hf), append(ratio, hf/hz)
		wz, wf = append(wz, w1...), append(wf, w2...)
	}
	med := func(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }
	pct := func(x []time.Duration, p int) float64 {
		slices.Sort(x)
		return float64(x[len(x)*p/100].Microseconds()) / 1000
	}
	b.ReportMetric(med(rz), "zklock-handoffs/s")
	b.ReportMetric(med(rf), "fencelock-handoffs/s")
	b.ReportMetric(med(ratio), "fencelock/zklock")
	b.ReportMetric(pct(wz, 50), "zklock-p50-ms")
	b.ReportMetric(pct(wz, 99), "zklock-p99-ms")
	b.ReportMetric(pct(wf, 50), "fencelock-p50-ms")
	b.ReportMetric(pct(wf, 99), "fencelock-p99-ms")
}

// benchLogger shows the engine's warnings (failed attempts, retries).
var benchLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
