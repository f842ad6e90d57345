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
// fencelock is opened as a user of URLs gets it: fencelock.Open(ctx, URL,
// nil) with the server's URL as it is (the default prefix); the raw
// transactions and concurrency.Mutex use a clientv3 client
// on the same endpoints.
//
// Three shapes: one goroutine uncontended (acquire+release of one key),
// 16 goroutines on distinct keys, and 8 goroutines contending for one key
// (handoffs/s, the wait of each handoff at p50 and p99, and the CPU the
// client process and the etcd server burned, in % of one core).
package etcdbench

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/etcd"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
)

const ttl = 10 * time.Second

func client(b *testing.B) *clientv3.Client {
	b.Helper()
	u, err := url.Parse(benchkit.ServerURL(b, "FENCELOCK_BENCH_ETCD", "FENCELOCK_TEST_ETCD"))
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

// raw is what every etcd lock costs at least: a put-if-absent transaction
// on a lease granted once (and kept alive), and a delete guarded by the create revision.
// Waiting spins without backoff (the ceiling).
var raw = benchkit.Lib{Name: "raw", Setup: func(b *testing.B) benchkit.Lockers {
	cli := client(b)
	lease, err := cli.Grant(context.Background(), int64(ttl/time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Revoke(context.Background(), lease.ID) })
	// Kept alive like a real lock's lease, for runs longer than its TTL.
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	if _, err := cli.KeepAlive(ctx, lease.ID); err != nil {
		b.Fatal(err)
	}
	try := func(ctx context.Context, key string) (func() error, error) {
		k := "/raw/" + key
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, "x", clientv3.WithLease(lease.ID))).Commit()
		if err != nil {
			return nil, err
		}
		if !resp.Succeeded {
			return nil, benchkit.ErrHeld
		}
		rev := resp.Header.Revision
		return func() error {
			_, err := cli.Txn(context.Background()).If(clientv3.Compare(clientv3.CreateRevision(k), "=", rev)).
				Then(clientv3.OpDelete(k)).Commit()
			return err
		}, nil
	}
	return benchkit.Same(try, benchkit.Poll(try, 0, 0))
}}

// fencelockURL returns the URL a user would write: the server's URL as it
// is, so the backend runs under the default prefix ("/fencelock/") a URL
// user gets, with key names as long as theirs. Runs do not share keys:
// every benchmark's keys start with a fresh benchkit.UniqueKey. Everything
// else (TTL, timeouts) is the URL's default too.
func fencelockURL(b *testing.B) string {
	return benchkit.ServerURL(b, "FENCELOCK_BENCH_ETCD", "FENCELOCK_TEST_ETCD")
}

// fencelockLib is the fencelock client as a URL user gets it,
// fencelock.Open(ctx, URL, nil): shared, or one per goroutine, each with
// its own etcd connection, lease and watches, as separate processes would
// have.
func fencelockLib(name string, shared bool) benchkit.Lib {
	return benchkit.FencelockLib(name, shared, func(b *testing.B) func() (*fencelock.Client, error) {
		u := fencelockURL(b)
		return func() (*fencelock.Client, error) { return fencelock.Open(context.Background(), u, nil) }
	})
}

// backendOnly calls the backend's Acquire and Release directly
// (fencelock.OpenBackend of the same URL), one backend per goroutine.
var backendOnly = benchkit.BackendLib("fencelock-backend-only", false, ttl, func(b *testing.B) func() (driver.Backend, error) {
	u := fencelockURL(b)
	return func() (driver.Backend, error) {
		be, _, err := fencelock.OpenBackend(context.Background(), u)
		return be, err
	}
})

// mutex is concurrency.Mutex on a Session per goroutine that is reused
// (creating a session costs a lease grant, as much as a lock).
var mutex = benchkit.Lib{Name: "concurrency.Mutex", Setup: func(b *testing.B) benchkit.Lockers {
	cli := client(b)
	return func(int) (try, wait benchkit.LockFunc) {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttl/time.Second)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		lock := func(blocking bool) benchkit.LockFunc {
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
	}
}}

// backendOnlyShared is backendOnly with one backend (one connection)
// for every goroutine, as raw and the fencelock client have. backendOnly's
// sixteen gRPC connections cost the client about 1.8 times the CPU per
// grant of one shared connection (BenchmarkInterleaved's counting pass:
// every request its own write and read, with no batching of concurrent
// requests into one), for the same requests, proposals and fsyncs.
var backendOnlyShared = benchkit.BackendLib("fencelock-backend-shared", true, ttl, func(b *testing.B) func() (driver.Backend, error) {
	u := fencelockURL(b)
	return func() (driver.Backend, error) {
		be, _, err := fencelock.OpenBackend(context.Background(), u)
		return be, err
	}
})

var libs = []benchkit.Lib{raw, fencelockLib("fencelock", true), backendOnly, backendOnlyShared, mutex}

// BenchmarkUncontended: one goroutine, acquire and release one key.
func BenchmarkUncontended(b *testing.B) { benchkit.Uncontended(b, libs) }

// BenchmarkDistinct16: 16 goroutines, each acquiring and releasing its own
// key.
func BenchmarkDistinct16(b *testing.B) { benchkit.Distinct(b, 16, libs) }

// BenchmarkContended8: 8 goroutines take turns on one key; b.N is the
// number of handoffs. A goroutine that released the lock does not try
// again until another one has taken it (no barging). With hold=1ms every
// other goroutine is already waiting in its library's acquire when the
// lock is released. The handoff wait is the time from the start of the
// holder's release to the next holder's return from acquire. raw spins
// without backoff: the ceiling, at the cost of the CPU it burns; raw-queue
// is the queue + watch strategy on the raw operations (the store's best
// raw strategy without spinning)
// (client-cpu-% and server-cpu-% are % of one core; the server's is known
// when scripts/testenv started it).
func BenchmarkContended8(b *testing.B) {
	var server benchkit.CPUFunc
	if os.Getenv("FENCELOCK_BENCH_ETCD") == "" {
		server = benchkit.TestenvCPU("etcd")
	}
	benchkit.Contended(b, 8, []benchkit.Lib{raw, rawQueue, fencelockLib("fencelock-1client", true), fencelockLib("fencelock-8clients", false), mutex},
		benchkit.Holds(0, time.Millisecond), benchkit.ServerCPU(server))
}
