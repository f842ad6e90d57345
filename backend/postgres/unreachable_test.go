package postgres_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/deadstore"
	"github.com/fencelock/fencelock/internal/testenv"
)

// ownServer starts a PostgreSQL of the test's own
// (deadstore.OwnServer), so that the test may stop or pause it without
// disturbing the server other tests share.
func ownServer(t *testing.T) (*testenv.Env, string) {
	t.Helper()
	return deadstore.OwnServer(t, "postgres", "PostgreSQL")
}

// Open on an address where nothing listens fails within a second, saying
// that the connection was refused.
func TestOpenRefusedConnectionFailsAtOnce(t *testing.T) {
	u := "postgres://fencelock@" + deadstore.RefusingAddr(t) + "/fencelock?sslmode=disable"
	deadstore.RefusedOpen{
		Open:    func(ctx context.Context) (io.Closer, error) { return postgres.Open(ctx, u) },
		Bound:   time.Second,
		Refused: deadstore.IsRefusal,
	}.Check(t)
}

// On a PostgreSQL stopped after Open, one backend request (Acquire, and
// Watch, which connects for LISTEN) fails within a second, and the calls
// of deadstore.Outage within their bounds, each naming the refused
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
	o := &deadstore.Outage{
		TTL: 2 * time.Second, ReleaseTimeout: time.Second, Slack: time.Second,
		Cause: deadstore.IsRefusal,
	}
	// The pools hold connections that the stop breaks.
	o.Stop(ctx, t, b, func(ctx context.Context) error { return e.Stop(ctx, "postgres") })

	t.Run("Backend.Acquire", func(t *testing.T) {
		deadstore.Call{
			What:           "Backend.Acquire(context.Background())",
			Times:          3, // a broken pooled connection, then new connections
			Hang:           o.TTL + o.Slack,
			Bound:          time.Second,
			Cause:          deadstore.IsRefusal,
			FirstMayDiffer: true, // it may meet the closed connection
		}.Check(t, func() error {
			_, err := b.Acquire(context.Background(), driver.AcquireRequest{Key: "backend", Owner: "o1", TTL: o.TTL})
			return err
		})
	})
	t.Run("Watch", func(t *testing.T) {
		deadstore.Call{
			What:  "Watch(context.Background())",
			Hang:  o.TTL + o.Slack,
			Bound: time.Second,
			Cause: deadstore.IsRefusal,
		}.Check(t, func() error {
			_, err := b.Watch(context.Background(), "watched")
			return err
		})
	})
	o.Run(ctx, t)
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
		_, _, took := deadstore.Within(t, "the end of a LISTEN session on a paused server", 2*ping+2*time.Second, func() (struct{}, error) {
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
		_, err, took := deadstore.Within(t, "a Watch while another connects", deadline+2*time.Second, func() (<-chan struct{}, error) {
			wctx, wcancel := context.WithTimeout(ctx, deadline)
			defer wcancel()
			return connecting.Watch(wctx, "k2")
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Watch with a %v deadline while another connects: %v after %v; want the deadline", deadline, err, took)
		}
	})
}
