// Package deadstore holds the checks the backends' tests share for a
// store that cannot be reached: Open of an address where nothing listens
// (RefusedOpen), and a server that stops after Open (Outage), each call
// ending within its bound and naming the cause. A backend's test keeps
// what is its own: how it starts and stops its server (OwnServer starts a
// private one with internal/testenv, so that stopping it disturbs no other
// test), its URL, and which error names the cause for its driver.
//
// It imports the standard library and the root module's packages only,
// never a driver, so that every backend module may use it.
package deadstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testenv"
)

// refused is what a check wants by default: the cause of an error when
// nothing listens.
const refused = "the refused connection"

// RefusingAddr returns a loopback host:port where nothing listens: a
// connection to it is refused.
func RefusingAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// stackMarks picks the goroutines Within logs on a hang: fencelock's and
// the drivers'.
var stackMarks = []string{"fencelock", "jackc", "go-redis", "go-zookeeper", "go.etcd.io", "mongo-driver"}

// Within runs f on a goroutine and returns its result and how long it
// took once it returns, or fails the test (logging the stacks of the
// goroutines in fencelock or a driver) if it has not returned within d:
// the bound of a call is what is tested, and a call that hangs must not
// hang the test.
func Within[T any](t testing.TB, what string, d time.Duration, f func() (T, error)) (T, error, time.Duration) {
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
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.v, r.err, time.Since(start)
	case <-timer.C:
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		for _, g := range strings.Split(b.String(), "\n\n") {
			for _, m := range stackMarks {
				if strings.Contains(g, m) {
					t.Log(g)
					break
				}
			}
		}
		t.Fatalf("%s has not returned after %v", what, d)
		panic("unreachable")
	}
}

// NamesRefusal reports whether err's message names a refused connection,
// the cause a caller needs to see.
func NamesRefusal(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection refused")
}

// IsRefusal reports whether err is a refused connection both as errors.Is
// (syscall.ECONNREFUSED) and as text.
func IsRefusal(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) && NamesRefusal(err)
}

// OwnServer starts the testenv server name (label names it in messages:
// "etcd", "ZooKeeper", "PostgreSQL") of the test's own, in a temporary
// state dir on free ports, so that the test may stop, kill or pause it
// without disturbing the servers other tests share; it is stopped at the
// test's end. It returns the Env and the server's URL. Under -short, or
// where testenv cannot start the server, it skips (fails under CI=true).
//
// The state dir is not t.TempDir: a server that runs as another user (the
// postgres user) must reach it.
func OwnServer(t testing.TB, name, label string) (*testenv.Env, string) {
	t.Helper()
	a := "a " + label
	if strings.ContainsAny(label[:1], "aeiouAEIOU") {
		a = "an " + label
	}
	if testing.Short() {
		t.Skipf("short: starts %s server of its own", a)
	}
	tmp, err := os.MkdirTemp("", "fencelock-"+name+"-test-")
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
	e, _, err := testenv.Up(ctx, testenv.Config{CI: testenv.IsCI(), Log: &log}, name)
	if err != nil {
		t.Fatalf("starting %s: %v\n%s", a, err, log.String())
	}
	t.Cleanup(func() {
		if _, err := e.Down(context.Background()); err != nil {
			t.Errorf("stopping the test's %s: %v", label, err)
		}
	})
	u := e.URL(name)
	if u == "" {
		if testenv.IsCI() {
			t.Fatalf("testenv started no %s\n%s", label, log.String())
		}
		t.Skipf("testenv could not start %s here\n%s", a, log.String())
	}
	return e, u
}

// RefusedOpen checks that Open of an address where nothing listens fails
// within Bound with an error for which Refused holds.
type RefusedOpen struct {
	// Open opens the backend (or client) on a refusing address.
	Open func(ctx context.Context) (io.Closer, error)
	// Timeout is the context Open is given; zero means a minute.
	Timeout time.Duration
	// Bound is how soon Open must report the refusal.
	Bound time.Duration
	// Refused reports whether Open's error names the cause.
	Refused func(error) bool
	// Want says what Refused checks, for the failure message; empty
	// means "the refused connection".
	Want string
}

// Check runs Open and checks its error and how long it took.
func (r RefusedOpen) Check(t testing.TB) {
	t.Helper()
	timeout := r.Timeout
	if timeout == 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	b, err, took := Within(t, "Open", max(30*time.Second, 2*r.Bound), func() (io.Closer, error) { return r.Open(ctx) })
	if err == nil {
		b.Close()
		t.Fatal("Open succeeded on a port where nothing listens")
	}
	t.Logf("Open after %v: %v", took, err)
	if !r.Refused(err) {
		t.Errorf("Open's error is not %s: %v", cmp.Or(r.Want, refused), err)
	}
	if took > r.Bound {
		t.Errorf("Open took %v to report a refused connection (want under %v)", took, r.Bound)
	}
}

// Call checks that a call on a store that cannot be reached fails, within
// its bound, with an error that names the cause.
type Call struct {
	// What names the call in messages.
	What string
	// Times is how many times the call is made, one after the other; zero
	// means once.
	Times int
	// Hang is how long the test waits for a call before it fails with the
	// goroutines' stacks.
	Hang time.Duration
	// Bound, if not zero, is how soon each call must fail.
	Bound time.Duration
	// Cause reports whether a call's error names the cause.
	Cause func(error) bool
	// Want says what Cause checks, for the failure message; empty means
	// "the refused connection".
	Want string
	// FirstMayDiffer lets the first call fail with another error: it may
	// meet a pooled connection the stop broke rather than a refusal.
	FirstMayDiffer bool
}

// Check makes the call f Times times and checks each.
func (c Call) Check(t testing.TB, f func() error) {
	t.Helper()
	n, want := max(c.Times, 1), cmp.Or(c.Want, refused)
	for i := range n {
		what := c.What
		if n > 1 {
			what = fmt.Sprintf("%s #%d", c.What, i+1)
		}
		_, err, took := Within(t, what, c.Hang, func() (struct{}, error) { return struct{}{}, f() })
		t.Logf("%s after %v: %v", what, took, err)
		switch {
		case err == nil:
			t.Errorf("%s succeeded after %v on a server that is down; want %s", what, took, want)
		case i == 0 && c.FirstMayDiffer:
		case !c.Cause(err):
			t.Errorf("%s after %v: %v; want %s", what, took, err, want)
		}
		if c.Bound > 0 && took > c.Bound {
			t.Errorf("%s took %v to report a failed connection (want under %v)", what, took, c.Bound)
		}
	}
}

// AcquireDeadline is the deadline of the Acquire that Outage checks.
const AcquireDeadline = 3 * time.Second

// Outage checks a client whose server stopped after Open: TryAcquire
// without a deadline returns within TTL + ReleaseTimeout + Slack, with an
// error that is not ErrNotAcquired and names the cause; Acquire with a
// 3s deadline returns within the deadline + ReleaseTimeout + Slack, with
// an error that matches context.DeadlineExceeded and names the cause; and,
// if Start is set, once the server is started again Acquire succeeds
// (failing fast does not outlast the outage).
type Outage struct {
	// Client is the client whose server is down (see Stop).
	Client *fencelock.Client
	// TTL and ReleaseTimeout are the client's Options.
	TTL, ReleaseTimeout time.Duration
	// Slack is the scheduling slack allowed past a bound.
	Slack time.Duration
	// Cause reports whether an error names the cause; Want says what it
	// checks (empty: "the refused connection").
	Cause func(error) bool
	Want  string
	// TryAcquireCause, if set, replaces Cause for TryAcquire, with
	// TryAcquireWant: its first request may meet the connection the
	// server closed, not a refused one.
	TryAcquireCause func(error) bool
	TryAcquireWant  string
	// Start, if set, starts the server again for the ServerBack check.
	Start func(ctx context.Context) error
}

// Stop makes o.Client on b with o's TTL and ReleaseTimeout (closed at the
// test's end), acquires the key "held" with it, so that a session, a
// lease and pooled connections exist for the outage to break, and then
// stops the server with stop.
func (o *Outage) Stop(ctx context.Context, t testing.TB, b fencelock.Backend, stop func(ctx context.Context) error) {
	t.Helper()
	c, err := fencelock.New(b, &fencelock.Options{TTL: o.TTL, ReleaseTimeout: o.ReleaseTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	o.Client = c
	if _, err := c.Acquire(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	if err := stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// Run runs the checks as the subtests TryAcquire, AcquireDeadline and, if
// o.Start is set, ServerBack.
func (o Outage) Run(ctx context.Context, t *testing.T) {
	t.Helper()
	t.Run("TryAcquire", o.TryAcquire)
	t.Run("AcquireDeadline", o.AcquireDeadline)
	if o.Start != nil {
		t.Run("ServerBack", func(t *testing.T) { o.ServerBack(ctx, t) })
	}
}

// TryAcquire checks TryAcquire(context.Background()).
func (o Outage) TryAcquire(t *testing.T) {
	t.Helper()
	cause, want := o.Cause, "an error naming "+cmp.Or(o.Want, refused)
	if o.TryAcquireCause != nil {
		cause, want = o.TryAcquireCause, o.TryAcquireWant
	}
	Call{
		What:  "TryAcquire(context.Background())",
		Hang:  o.TTL + o.ReleaseTimeout + o.Slack,
		Cause: func(err error) bool { return !errors.Is(err, fencelock.ErrNotAcquired) && cause(err) },
		Want:  want + ", not ErrNotAcquired",
	}.Check(t, func() error {
		_, err := o.Client.TryAcquire(context.Background(), "try")
		return err
	})
}

// AcquireDeadline checks Acquire with a 3s deadline.
func (o Outage) AcquireDeadline(t *testing.T) {
	t.Helper()
	Call{
		What:  fmt.Sprintf("Acquire with a %v deadline", AcquireDeadline),
		Hang:  AcquireDeadline + o.ReleaseTimeout + o.Slack,
		Cause: func(err error) bool { return errors.Is(err, context.DeadlineExceeded) && o.Cause(err) },
		Want:  "the deadline joined with " + cmp.Or(o.Want, refused),
	}.Check(t, func() error {
		dctx, dcancel := context.WithTimeout(context.Background(), AcquireDeadline)
		defer dcancel()
		_, err := o.Client.Acquire(dctx, "wait")
		return err
	})
}

// ServerBack starts the server again with o.Start and checks that the
// client acquires and releases a key: it reconnects.
func (o Outage) ServerBack(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := o.Start(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := o.Client.Acquire(ctx, "after")
	if err != nil {
		t.Fatalf("Acquire once the server is back: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
