package etcd

import (
	"context"
	"errors"
	"net"
	"net/url"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testenv"
)

// ownServer starts an etcd of the test's own with internal/testenv (a
// temporary state dir, free ports), so that the test may stop it without
// disturbing the server other tests share, and stops it at the end. It
// returns the Env and the server's URL with a fresh key prefix. Without
// the etcd test server it skips (fails under CI=true).
func ownServer(t *testing.T) (*testenv.Env, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("short: starts an etcd server of its own")
	}
	t.Setenv("TMPDIR", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log strings.Builder
	e, _, err := testenv.Up(ctx, testenv.Config{CI: testenv.IsCI(), Log: &log}, "etcd")
	if err != nil {
		t.Fatalf("starting an etcd: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		if _, err := e.Down(context.Background()); err != nil {
			t.Errorf("stopping the test's etcd: %v", err)
		}
	})
	raw := e.URL("etcd")
	if raw == "" {
		if testenv.IsCI() {
			t.Fatalf("testenv started no etcd\n%s", log.String())
		}
		t.Skipf("testenv could not start an etcd here\n%s", log.String())
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/fencelock-unreachable/"
	return e, u.String()
}

// refusingURL returns an etcd URL on a loopback port where nothing
// listens: a connection to it is refused.
func refusingURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "etcd://" + addr + "/fencelock-refused/"
}

// within runs f on a goroutine and returns its error once it returns, or
// fails the test (with the stacks of the backend's goroutines) if it has
// not returned within d: the bound of a call is what is tested, and a
// call that hangs must not hang the test.
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
			if strings.Contains(g, "fencelock") {
				t.Log(g)
			}
		}
		t.Fatalf("%s has not returned after %v", what, d)
		panic("unreachable")
	}
}

// refusal reports whether err names a refused connection, the cause a
// caller needs to see.
func refusal(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection refused")
}

// Open on an address where nothing listens fails at once, saying that the
// connection was refused: not after the dial timeout with a bare "context
// deadline exceeded" (gRPC's wait-for-ready hid the refusal).
func TestOpenRefusedConnectionFailsAtOnce(t *testing.T) {
	u := refusingURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err, took := within(t, "Open", 30*time.Second, func() (*Backend, error) { return Open(ctx, u) })
	if err == nil {
		b.Close()
		t.Fatal("Open succeeded on a port where nothing listens")
	}
	t.Logf("after %v: %v", took, err)
	if !refusal(err) {
		t.Errorf("Open's error does not name the refusal: %v", err)
	}
	if took > 2*time.Second {
		t.Errorf("Open took %v to report a refused connection (want well under the 5s dial timeout)", took)
	}
}

// A server that stops after Open makes every call end within its bound
// and name the cause: TryAcquire without a deadline returns within the
// lease TTL (plus the release budget), and so does the backend's own
// Acquire (it does not block past its context: no request waits for the
// connection to be ready, the lease keep-alive tries once); Acquire with a
// deadline returns by the deadline plus the release budget, with an error
// that matches the deadline and names the refused connection. With
// gRPC's wait-for-ready the keep-alive of the session's lease retried for
// ever, and TryAcquire(context.Background()) never returned.
func TestServerStoppedAfterOpenCallsEndWithTheCause(t *testing.T) {
	e, u := ownServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := Open(ctx, u)
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
	// A lease of the session exists: the next acquisition keeps it alive
	// (the request that hung) rather than granting one.
	l, err := c.Acquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	_ = l
	if err := e.Stop(ctx, "etcd"); err != nil {
		t.Fatal(err)
	}

	const slack = time.Second
	t.Run("Backend.Acquire", func(t *testing.T) {
		_, err, took := within(t, "Backend.Acquire(context.Background())", ttl+slack, func() (any, error) {
			return b.Acquire(context.Background(), lockReq("backend", "o1"))
		})
		t.Logf("after %v: %v", took, err)
		if err == nil || !refusal(err) {
			t.Errorf("Backend.Acquire after %v: %v; want an error naming the refused connection", took, err)
		}
	})
	t.Run("TryAcquire", func(t *testing.T) {
		_, err, took := within(t, "TryAcquire(context.Background())", ttl+release+slack, func() (*fencelock.Lease, error) {
			return c.TryAcquire(context.Background(), "try")
		})
		t.Logf("after %v: %v", took, err)
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
		t.Logf("after %v: %v", took, err)
		if !errors.Is(err, context.DeadlineExceeded) || !refusal(err) {
			t.Errorf("Acquire with a %v deadline after %v: %v; want the deadline joined with the refused connection", deadline, took, err)
		}
	})
	// Failing fast does not outlast the outage: once the server is back,
	// the client reconnects and calls succeed again.
	t.Run("ServerBack", func(t *testing.T) {
		if err := e.Start(ctx, "etcd"); err != nil {
			t.Fatal(err)
		}
		l, err := c.Acquire(ctx, "after")
		if err != nil {
			t.Fatalf("Acquire once the server is back: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
