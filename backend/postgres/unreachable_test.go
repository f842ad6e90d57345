package postgres_test

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
)

// ownServer starts a PostgreSQL of the test's own with internal/testenv
// (a temporary state dir, a free port), so that the test may stop it
// without disturbing the server other tests share, and stops it at the
// end. Without PostgreSQL it skips (fails under CI=true).
func ownServer(t *testing.T) (*testenv.Env, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("short: starts a PostgreSQL server of its own")
	}
	// Not t.TempDir: the server runs as the postgres user, which must
	// reach its state dir.
	tmp, err := os.MkdirTemp("", "fencelock-pg-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log strings.Builder
	e, _, err := testenv.Up(ctx, testenv.Config{CI: testenv.IsCI(), Log: &log}, "postgres")
	if err != nil {
		t.Fatalf("starting a PostgreSQL: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		if _, err := e.Down(context.Background()); err != nil {
			t.Errorf("stopping the test's PostgreSQL: %v", err)
		}
	})
	u := e.URL("postgres")
	if u == "" {
		if testenv.IsCI() {
			t.Fatalf("testenv started no PostgreSQL\n%s", log.String())
		}
		t.Skipf("testenv could not start a PostgreSQL here\n%s", log.String())
	}
	return e, u
}

// refusingURL returns a PostgreSQL URL on a loopback port where nothing
// listens: a connection to it is refused.
func refusingURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "postgres://fencelock@" + addr + "/fencelock?sslmode=disable"
}

// within runs f on a goroutine and returns its result once it returns, or
// fails the test (with the stacks of the goroutines in fencelock or pgx)
// if it has not returned within d: the bound of a call is what is tested,
// and a call that hangs must not hang the test.
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
			if strings.Contains(g, "fencelock") || strings.Contains(g, "jackc") {
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
// that the connection was refused.
func TestOpenRefusedConnectionFailsAtOnce(t *testing.T) {
	u := refusingURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err, took := within(t, "Open", 30*time.Second, func() (*postgres.Backend, error) { return postgres.Open(ctx, u) })
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
}

// A server that stops after Open makes every call end within its bound
// and name the cause: one backend request (Acquire, and Watch, which
// connects for LISTEN) fails within a second, TryAcquire without a
// deadline returns within the lease TTL (plus the release budget), and
// Acquire with a deadline returns by the deadline plus the release
// budget, with an error that matches the deadline and names the refused
// connection.
func TestServerStoppedAfterOpenCallsEndWithTheCause(t *testing.T) {
	e, u := ownServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := postgres.Open(ctx, u)
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
	// The pools hold connections that the stop breaks.
	if _, err := c.Acquire(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	if err := e.Stop(ctx, "postgres"); err != nil {
		t.Fatal(err)
	}

	const slack = time.Second
	t.Run("Backend.Acquire", func(t *testing.T) {
		for i := range 3 { // a broken pooled connection, then new connections
			_, err, took := within(t, "Backend.Acquire(context.Background())", ttl+slack, func() (driver.Grant, error) {
				return b.Acquire(context.Background(), driver.AcquireRequest{Key: "backend", Owner: "o1", TTL: ttl})
			})
			if err == nil {
				t.Fatalf("Backend.Acquire #%d succeeded on a stopped server", i+1)
			}
			if i > 0 && !refusal(err) { // the first may meet the closed connection
				t.Errorf("Backend.Acquire #%d after %v: %v; want the refused connection", i+1, took, err)
			}
			if took > time.Second {
				t.Errorf("Backend.Acquire #%d took %v to report a failed connection (want under 1s)", i+1, took)
			}
		}
	})
	t.Run("Watch", func(t *testing.T) {
		_, err, took := within(t, "Watch(context.Background())", ttl+slack, func() (<-chan struct{}, error) {
			return b.Watch(context.Background(), "watched")
		})
		if !refusal(err) {
			t.Errorf("Watch after %v: %v; want the refused connection", took, err)
		}
		if took > time.Second {
			t.Errorf("Watch took %v to report a refused connection (want under 1s)", took)
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

// The waiting paths of LISTEN have bounds on a server that stops
// answering (paused: the kernel still accepts connections, nothing
// answers): a LISTEN session that hears nothing pings, and ends when the
// ping goes unanswered, closing its subscribers' channels so that
// waiters poll (it waited for as long as the kernel kept the socket); and
// a Watch that finds another Watch connecting returns when its own
// context ends (it waited for the other's).
func TestListenBoundsOnUnansweringServer(t *testing.T) {
	e, u := ownServer(t)
	const ping = 500 * time.Millisecond
	postgres.SetListenPingEvery(t, ping)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	session, err := postgres.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	connecting, err := postgres.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer connecting.Close()
	ch, err := session.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Pause(ctx, "postgres"); err != nil {
		t.Fatal(err)
	}
	// Resumed before the backends close and the server stops: with the
	// server still paused, those took a minute.
	defer func() {
		if err := e.Resume(context.Background(), "postgres"); err != nil {
			t.Error(err)
		}
	}()

	t.Run("SessionEnds", func(t *testing.T) {
		_, _, took := within(t, "the end of a LISTEN session on a paused server", 2*ping+2*time.Second, func() (struct{}, error) {
			for range ch { // at most one wake-up, then closed
			}
			return struct{}{}, nil
		})
		t.Logf("the Watch channel was closed %v after the pause", took)
	})

	t.Run("WatchWaitingForAnotherConnect", func(t *testing.T) {
		actx, acancel := context.WithCancel(ctx)
		first := make(chan error, 1)
		go func() {
			_, err := connecting.Watch(actx, "k")
			first <- err
		}()
		defer func() {
			acancel()
			<-first
		}()
		for !postgres.ListenConnecting(connecting) {
			select {
			case err := <-first:
				t.Fatalf("the first Watch returned %v on a paused server", err)
			case <-time.After(time.Millisecond):
			}
		}
		const deadline = 300 * time.Millisecond
		_, err, took := within(t, "a Watch while another connects", deadline+2*time.Second, func() (<-chan struct{}, error) {
			wctx, wcancel := context.WithTimeout(ctx, deadline)
			defer wcancel()
			return connecting.Watch(wctx, "k2")
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Watch with a %v deadline while another connects: %v after %v; want the deadline", deadline, err, took)
		}
	})
}
