package zookeeper

import (
	"context"
	"errors"
	"net"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// refusingURL returns a ZooKeeper URL on a loopback port where nothing
// listens: a connection to it is refused.
func refusingURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "zk://" + addr + "?session_timeout=2s&prefix=fencelock-refused"
}

// within runs f on a goroutine and returns its result once it returns, or
// fails the test (with the stacks of the goroutines in fencelock) if it
// has not returned within d: the bound of a call is what is tested, and a
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
// connection was refused: not after connect_timeout with a message that
// only says no session was made.
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
		t.Errorf("Open took %v to report a refused connection (want well under connect_timeout)", took)
	}
}

// A server that stops after Open makes every call end within its bound
// and name the cause: the backend's own Acquire with no deadline returns
// within the session timeout, TryAcquire without a deadline within the
// lease TTL (plus the release budget); Acquire with a deadline returns by
// the deadline plus the release budget, with an error that matches the
// deadline and names the refused connection. A request of go-zookeeper
// waits, whatever the caller's context, until its connection is back or a
// round of reconnection attempts has failed, and then fails with "could
// not connect to a server", not why.
func TestServerStoppedAfterOpenCallsEndWithTheCause(t *testing.T) {
	const ttl, release = 2 * time.Second, time.Second
	e, u := ownServer(t, ttl)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	c, err := fencelock.New(b, &fencelock.Options{TTL: ttl, ReleaseTimeout: release})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Acquire(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	if err := e.Stop(ctx, "zookeeper"); err != nil {
		t.Fatal(err)
	}

	const slack = time.Second
	t.Run("Backend.Acquire", func(t *testing.T) {
		_, err, took := within(t, "Backend.Acquire(context.Background())", ttl+slack, func() (any, error) {
			return b.Acquire(context.Background(), driver.AcquireRequest{Key: "backend", Owner: "o1", TTL: ttl})
		})
		t.Logf("after %v: %v", took, err)
		if err == nil || !refusal(err) {
			t.Errorf("Backend.Acquire after %v: %v; want an error naming the refused connection", took, err)
		}
	})
	// The round of reconnection attempts has failed (Backend.Acquire
	// reported the refusal): until a server accepts again, a request
	// fails at once, by its deadline, not at go-zookeeper's next round,
	// a second later, whatever its context says.
	t.Run("RequestsWhileDown", func(t *testing.T) {
		const deadline, slack = 100 * time.Millisecond, 400 * time.Millisecond
		for i := range 3 {
			_, err, took := within(t, "Inspect with a 100ms deadline", deadline+slack, func() (driver.Info, error) {
				dctx, dcancel := context.WithTimeout(context.Background(), deadline)
				defer dcancel()
				return b.Inspect(dctx, "held")
			})
			t.Logf("Inspect %d after %v: %v", i, took, err)
			if err == nil || !refusal(err) {
				t.Errorf("Inspect %d after %v: %v; want an error naming the refused connection", i, took, err)
			}
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
		if err := e.Start(ctx, "zookeeper"); err != nil {
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
