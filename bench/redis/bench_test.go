// Package redisbench compares fencelock's Redis backend with the raw Redis
// operations (the limit) and with github.com/bsm/redislock and
// github.com/go-redsync/redsync/v4, in one run:
//
//	eval "$(scripts/testenv up redis)"
//	cd bench/redis && go test -run '^$' -bench . -benchtime 3s
//
// FENCELOCK_BENCH_REDIS, if set, names the server instead of
// FENCELOCK_TEST_REDIS: the test server fsyncs every write (appendfsync
// always), so its numbers measure the disk more than the lock; a server
// in its distribution's default persistence (RDB snapshots, no AOF:
// scripts/testenv's redis-stock, FENCELOCK_TEST_REDIS_STOCK) measures the
// scripts' CPU instead. bench/run runs both.
//
// fencelock is opened as a user of URLs gets it: fencelock.Open(ctx, URL,
// nil) with the server's URL as it is (the default prefix); the raw operations
// and the peers use a go-redis client parsed from the same URL (go-redis's
// default pool).
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
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
)

const ttl = 10 * time.Second

func client(b *testing.B) *goredis.Client {
	b.Helper()
	opt, err := goredis.ParseURL(benchkit.ServerURL(b, "FENCELOCK_BENCH_REDIS", "FENCELOCK_TEST_REDIS"))
	if err != nil {
		b.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	b.Cleanup(func() { rdb.Close() })
	return rdb
}

var compareAndDelete = goredis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func token() string {
	var r [16]byte
	_, _ = crand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// raw is SET NX PX and a compare-and-delete script: what every Redis lock
// costs at least. Waiting spins without backoff (the ceiling).
var raw = benchkit.Lib{Name: "raw", Setup: func(b *testing.B) benchkit.Lockers {
	rdb := client(b)
	try := func(ctx context.Context, key string) (func() error, error) {
		tok := token()
		ok, err := rdb.SetNX(ctx, key, tok, ttl).Result()
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, benchkit.ErrHeld
		}
		return func() error { return compareAndDelete.Run(ctx, rdb, []string{key}, tok).Err() }, nil
	}
	return benchkit.Same(try, benchkit.Poll(try, 0, 0))
}}

// fencelockURL returns the URL a user would write: the server's URL as it
// is, so the backend runs with the default prefix ("fencelock") a URL
// user gets, and key names as long as theirs (a longer prefix lengthens
// every name the scripts write: BenchmarkKeyLength). Runs do not share
// keys or counters: every benchmark's keys start with a fresh
// benchkit.UniqueKey. Everything else (pool, TTL, the settings check) is
// the URL's default too.
func fencelockURL(b *testing.B) string {
	return benchkit.ServerURL(b, "FENCELOCK_BENCH_REDIS", "FENCELOCK_TEST_REDIS")
}

// fencelockLib is the fencelock client as a URL user gets it,
// fencelock.Open(ctx, URL, nil): shared, or one per goroutine (each with
// its own connection pool and pub/sub connection, like separate
// processes).
func fencelockLib(name string, shared bool) benchkit.Lib {
	return benchkit.FencelockLib(name, shared, func(b *testing.B) func() (*fencelock.Client, error) {
		u := fencelockURL(b)
		return func() (*fencelock.Client, error) { return fencelock.Open(context.Background(), u, nil) }
	})
}

// noCoalesceLib is the fencelock client on the same URL with
// coalesce=off: every acquire and release alone, as before coalescing, in
// the same run (the lone caller's latency and the batching's gain).
var noCoalesceLib = benchkit.FencelockLib("fencelock-nocoalesce", true, func(b *testing.B) func() (*fencelock.Client, error) {
	u, err := url.Parse(fencelockURL(b))
	if err != nil {
		b.Fatal(err)
	}
	q := u.Query()
	q.Set("coalesce", "off")
	u.RawQuery = q.Encode()
	return func() (*fencelock.Client, error) { return fencelock.Open(context.Background(), u.String(), nil) }
})

// backendOnly calls the backend's Acquire and Release directly
// (fencelock.OpenBackend of the same URL), one backend per goroutine.
var backendOnly = benchkit.BackendLib("fencelock-backend-only", false, ttl, func(b *testing.B) func() (driver.Backend, error) {
	u := fencelockURL(b)
	return func() (driver.Backend, error) {
		be, _, err := fencelock.OpenBackend(context.Background(), u)
		return be, err
	}
})

// redislock waits with LinearBackoff(10ms) (its README suggests 100ms).
var redislockLib = benchkit.Lib{Name: "redislock", Setup: func(b *testing.B) benchkit.Lockers {
	rl := redislock.New(client(b))
	obtain := func(opt *redislock.Options) benchkit.LockFunc {
		return func(ctx context.Context, key string) (func() error, error) {
			l, err := rl.Obtain(ctx, key, ttl, opt)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(context.Background()) }, nil
		}
	}
	return benchkit.Same(obtain(nil), obtain(&redislock.Options{RetryStrategy: redislock.LinearBackoff(10 * time.Millisecond)}))
}}

// redsync waits with its default retry delay (random 50–250ms), with
// unlimited tries.
var redsyncLib = benchkit.Lib{Name: "redsync", Setup: func(b *testing.B) benchkit.Lockers {
	rs := redsync.New(redsyncgoredis.NewPool(client(b)))
	lock := func(tries int) benchkit.LockFunc {
		return func(ctx context.Context, key string) (func() error, error) {
			m := rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(tries))
			if err := m.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() error { _, err := m.UnlockContext(context.Background()); return err }, nil
		}
	}
	return benchkit.Same(lock(1), lock(1<<30))
}}

var libs = []benchkit.Lib{raw, fencelockLib("fencelock", true), noCoalesceLib, backendOnly, redislockLib, redsyncLib}

// BenchmarkUncontended: one goroutine, acquire and release one key.
func BenchmarkUncontended(b *testing.B) { benchkit.Uncontended(b, libs) }

// BenchmarkDistinct16: 16 goroutines, each acquiring and releasing its own
// key.
func BenchmarkDistinct16(b *testing.B) { benchkit.Distinct(b, 16, libs) }

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
// are % of one core); raw-notify waits for the release's PUBLISH (the
// store's best raw strategy without spinning).
func BenchmarkContended8(b *testing.B) {
	benchkit.Contended(b, 8, []benchkit.Lib{raw, rawNotify, fencelockLib("fencelock-1client", true), fencelockLib("fencelock-8clients", false), redislockLib, redsyncLib},
		benchkit.Holds(0, time.Millisecond), benchkit.ServerCPU(serverCPU(client(b))))
}

// serverCPU reads used_cpu_user + used_cpu_sys from INFO cpu.
func serverCPU(rdb *goredis.Client) benchkit.CPUFunc {
	return func() (time.Duration, bool) {
		info, err := rdb.Info(context.Background(), "cpu").Result()
		if err != nil {
			return 0, false
		}
		var total float64
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
		return time.Duration(total * float64(time.Second)), true
	}
}
