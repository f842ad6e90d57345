// Package benchkit is the harness the benchmark modules under bench/ share,
// so that every backend and its competitors are measured by the same loops
// and report the same metrics.
//
// A Lib is one lock implementation (the raw store operations, a competitor
// library, a fencelock variant) reduced to LockFuncs. The shapes:
//
//   - Uncontended: one goroutine acquires and releases one key
//     (throughput, p50 latency).
//   - Distinct: n goroutines, each acquiring and releasing its own key.
//   - Contended: n goroutines take turns on one key (handoffs/s, the wait
//     of a handoff at p50, p99 and max, the CPU of the client process and,
//     where known, of the server, and counters per handoff).
//   - Interleaved and InterleavedContended: every Lib in alternating turns
//     within one run, so that on a shared, noisy machine all of them meet
//     the same load; they report each one's rate and its ratio to the first.
//
// Options adapt metric names and units to those each backend's
// documentation already uses, so that numbers stay comparable.
//
//	var libs = []benchkit.Lib{raw, benchkit.FencelockLib("fencelock", true, open)}
//
//	func BenchmarkUncontended(b *testing.B) { benchkit.Uncontended(b, libs) }
package benchkit

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
)

// LockFunc acquires key, with one attempt or blocking as its role says, and
// returns the function that releases it.
type LockFunc func(ctx context.Context, key string) (release func() error, err error)

// Lockers returns the lock functions of goroutine i (counted from 0) of a
// run: try makes one attempt and fails if the key is held; wait blocks until
// the lock is held or ctx ends. Either may be nil if the library cannot do
// it: the throughput loops then use wait, and Contended needs wait.
type Lockers func(i int) (try, wait LockFunc)

// Lib is one lock implementation under test.
type Lib struct {
	// Name names the Lib's sub-benchmark, or its metrics in the
	// interleaved benchmarks.
	Name string
	// Setup prepares one run (one sub-benchmark): the connections, tables
	// and clients its goroutines share, released with b.Cleanup. It returns
	// the Lockers, which the loops call once for each goroutine. Both run
	// on the benchmark's goroutine before the timer starts, so they may
	// call b.Fatal or b.Skip.
	Setup func(b *testing.B) Lockers
}

// ErrHeld is what a Lib's one-attempt LockFunc returns when the key is held
// by someone else and the library has no error of its own for it; Poll
// retries on it.
var ErrHeld = errors.New("benchkit: lock held")

// Same returns Lockers that give every goroutine the same try and wait.
func Same(try, wait LockFunc) Lockers {
	return func(int) (LockFunc, LockFunc) { return try, wait }
}

// Poll turns a one-attempt try into a blocking LockFunc that repeats try
// while it returns ErrHeld. Between attempts it sleeps a backoff that starts
// at minBackoff and doubles up to maxBackoff, half of it random; with
// minBackoff 0 it spins without pause (the ceiling of a polling lock, at the
// cost of the CPU it burns).
func Poll(try LockFunc, minBackoff, maxBackoff time.Duration) LockFunc {
	return func(ctx context.Context, key string) (func() error, error) {
		backoff := minBackoff
		for {
			release, err := try(ctx, key)
			if !errors.Is(err, ErrHeld) {
				return release, err
			}
			if backoff <= 0 {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				continue
			}
			t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
			backoff = min(2*backoff, maxBackoff)
		}
	}
}

// FencelockLib is a Lib of fencelock clients: try is Client.TryAcquire,
// wait is Client.Acquire, release is Lease.Release. open prepares one run
// (store connections, tables) and returns the function that opens a
// client; with shared, one client serves all goroutines of the run,
// otherwise each goroutine has its own, as separate processes would.
// Clients are closed when the run ends. Every lease is admitted by a
// fencelock.Fence the run's goroutines share: a fencing token that does
// not increase fails the benchmark.
func FencelockLib(name string, shared bool, open func(b *testing.B) func() (*fencelock.Client, error)) Lib {
	return Lib{Name: name, Setup: func(b *testing.B) Lockers {
		var fence fencelock.Fence
		clients := each(b, shared, open(b), func(c *fencelock.Client) error { return c.Close() })
		return func(i int) (try, wait LockFunc) {
			c := clients(i)
			return fenced(&fence, c.TryAcquire), fenced(&fence, c.Acquire)
		}
	}}
}

func fenced(fence *fencelock.Fence, acquire func(context.Context, string, ...fencelock.AcquireOption) (*fencelock.Lease, error)) LockFunc {
	return func(ctx context.Context, key string) (func() error, error) {
		l, err := acquire(ctx, key)
		if err != nil {
			return nil, err
		}
		release := func() error { return l.Release(context.Background()) }
		if err := fence.Admit(key, l); err != nil {
			_ = release()
			return nil, fmt.Errorf("fence refused a holder: %w", err)
		}
		return release, nil
	}
}

// BackendLib is a Lib that calls a fencelock backend's Acquire and Release
// directly, without the engine (no lease object, renewal scheduling, loss
// watch or local-validity timers): it separates the backend's cost from
// the engine's. It has no wait. open prepares one run and returns the
// function that opens a backend; with shared, one backend serves all
// goroutines of the run, otherwise each has its own. Backends are closed
// when the run ends.
func BackendLib(name string, shared bool, ttl time.Duration, open func(b *testing.B) func() (driver.Backend, error)) Lib {
	return Lib{Name: name, Setup: func(b *testing.B) Lockers {
		backends := each(b, shared, open(b), driver.Backend.Close)
		return func(i int) (try, wait LockFunc) {
			be, owner := backends(i), "bench-"+strconv.Itoa(i)+"-"+RandomHex()
			return func(ctx context.Context, key string) (func() error, error) {
				g, err := be.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl})
				if err != nil {
					return nil, err
				}
				return func() error { return be.Release(ctx, g) }, nil
			}, nil
		}
	}}
}

// each returns the function that gives goroutine i its value: one opened
// now for all of them if shared, else a new one for every call. Every value
// is closed when b's run ends.
func each[T any](b *testing.B, shared bool, open func() (T, error), close func(T) error) func(int) T {
	get := func() T {
		v, err := open()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = close(v) })
		return v
	}
	if !shared {
		return func(int) T { return get() }
	}
	v := get()
	return func(int) T { return v }
}

// ServerURL returns the value of the first of the environment variables
// that is set (a benchmark's own server first, then the test server). If
// none is, b is skipped locally and fails under CI=true, as
// testenv.URL does for tests.
func ServerURL(b *testing.B, vars ...string) string {
	b.Helper()
	for _, v := range vars {
		if u := os.Getenv(v); u != "" {
			return u
		}
	}
	// None set: skip locally, fail under CI, like every backend test.
	return testenv.URL(b, vars[len(vars)-1])
}

// UniqueKey returns a key no other run uses: "bench-" and 8 random hex
// digits.
func UniqueKey() string { return "bench-" + RandomHex() }

// RandomHex returns 8 random hex digits, for names that must be unique to
// one run (tables, collections, prefixes).
func RandomHex() string {
	var r [4]byte
	_, _ = crand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// Percentile returns the p-th percentile (0 to 100) of d without changing
// d, and 0 if d is empty.
func Percentile(d []time.Duration, p float64) time.Duration {
	return pick(slices.Sorted(slices.Values(d)), p)
}

// pick is Percentile of sorted durations.
func pick(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(float64(len(sorted))*p/100))]
}
