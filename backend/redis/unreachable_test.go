package redis_test

import (
	"context"
	"errors"
	"net"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
)

// refusingAddr returns a loopback address where nothing listens: a
// connection to it is refused.
func refusingAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// within runs f on a goroutine and returns its result once it returns, or
// fails the test (with the stacks of the goroutines in fencelock or
// go-redis) if it has not returned within d: the bound of a call is what
// is tested, and a call that hangs must not hang the test.
func within[T any](t *testing.T, what string, d time.Duration, f func() (T, error)) (T, error, time.Duration) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err, time.Since(start)
	case <-time.After(d):
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		for _, g := range strings.Split(b.String(), "\n\n") {
			if strings.Contains(g, "fencelock") || strings.Contains(g, "go-redis") {
				t.Log(g)
			}
		}
		t.Fatalf("%s has not returned after %v", what, d)
		panic("unreachable")
	}
}

// refusal reports whether err is a refused connection, as errors.Is and
// as text: the cause a caller needs to see.
func refusal(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) && strings.Contains(err.Error(), "connection refused")
}

// Open on an address where nothing listens fails within a second, saying
// that the connection was refused, for each kind of URL. go-redis's
// defaults (5 dials 100ms apart in each of 4 attempts with backoff) made a
// refused redis:// URL take about 2s.
func TestOpenRefusedConnectionFailsAtOnce(t *testing.T) {
	for _, tc := range []struct{ name, url string }{
		{"single", "redis://%s/0"},
		{"sentinel", "redis+sentinel://%s/mymaster"},
		{"cluster", "redis+cluster://%s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := strings.Replace(tc.url, "%s", refusingAddr(t), 1)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			b, err, took := within(t, "Open", 30*time.Second, func() (*fencelockredis.Backend, error) {
				return fencelockredis.Open(ctx, u)
			})
			if err == nil {
				b.Close()
				t.Fatal("Open succeeded on a port where nothing listens")
			}
			if !refusal(err) {
				t.Errorf("Open's error is not the refused connection: %v", err)
			}
			if took > time.Second {
				t.Errorf("Open took %v to report a refused connection (want under 1s)", took)
			}
		})
	}
}

// A server that stops after Open makes every call end within its bound
// and name the cause: one backend request fails within a second (a
// refused connection is not dialled again and again inside it),
// TryAcquire without a deadline returns within the lease TTL (plus the
// release budget), and Acquire with a deadline returns by the deadline
// plus the release budget, with an error that matches the deadline and
// names the refused connection.
func TestServerStoppedAfterOpenCallsEndWithTheCause(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := fencelockredis.Open(ctx, s.url())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	const ttl, release = 2 * time.Second, time.Second
	c, err := fencelock.New(b, &fencelock.Options{TTL: ttl, ReleaseTimeout: release})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// The pool holds connections that the stop breaks.
	l, err := c.Acquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	_ = l
	s.kill()

	const slack = time.Second
	t.Run("Backend.Acquire", func(t *testing.T) {
		for i := range 3 { // a broken pooled connection, then new dials
			_, err, took := within(t, "Backend.Acquire(context.Background())", ttl+slack, func() (driver.Grant, error) {
				return b.Acquire(context.Background(), driver.AcquireRequest{Key: "backend", Owner: "o1", TTL: ttl})
			})
			if !refusal(err) {
				t.Errorf("Backend.Acquire #%d after %v: %v; want the refused connection", i+1, took, err)
			}
			if took > time.Second {
				t.Errorf("Backend.Acquire #%d took %v to report a refused connection (want under 1s)", i+1, took)
			}
		}
	})
	t.Run("TryAcquire", func(t *testing.T) {
		_, err, took := within(t, "TryAcquire(context.Background())", ttl+release+slack, func() (*fencelock.Lease, error) {
			return c.TryAcquire(context.Background(), "try")
		})
		if err == nil || errors.Is(err, fencelock.ErrNotAcquired) || !refusal(err) {
			t.Errorf("TryAcquire after %v: %v; want an error naming the refused connection", took, err)
		}
	})
	t.Run("AcquireDeadline", func(t *testing.T) {
		const deadline = 3 * time.Second
		_, err, took := within(t, "Acquire with a 3s deadline", deadline+release+slack, func() (*fencelock.Lease, error) {
			dctx, dcancel := context.WithTimeout(context.Background(), deadline)
			defer dcancel()
			return c.Acquire(dctx, "wait")
		})
		if !errors.Is(err, context.DeadlineExceeded) || !refusal(err) {
			t.Errorf("Acquire with a %v deadline after %v: %v; want the deadline joined with the refused connection", deadline, took, err)
		}
	})
}
