package zookeeper

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/deadstore"
)

// within is deadstore.Within: it runs f and fails the test, with the
// goroutines' stacks, if f has not returned within d.
func within[T any](t *testing.T, what string, d time.Duration, f func() (T, error)) (T, error, time.Duration) {
	t.Helper()
	return deadstore.Within(t, what, d, f)
}

// Open on an address where nothing listens fails at once, saying that the
// connection was refused: not after connect_timeout with a message that
// only says no session was made.
func TestOpenRefusedConnectionFailsAtOnce(t *testing.T) {
	u := "zk://" + deadstore.RefusingAddr(t) + "?session_timeout=2s&prefix=fencelock-refused"
	deadstore.RefusedOpen{
		Open:    func(ctx context.Context) (io.Closer, error) { return Open(ctx, u) },
		Bound:   2 * time.Second,
		Refused: deadstore.NamesRefusal,
	}.Check(t)
}

// On a ZooKeeper stopped after Open, the backend's own Acquire with no
// deadline fails within the session timeout naming the refused
// connection, and so do the calls of deadstore.Outage within their bounds;
// they succeed again once the server is back. A request of go-zookeeper
// waits, whatever the caller's context, until its connection is back or a
// round of reconnection attempts has failed, and then fails with "could
// not connect to a server", not why.
func TestServerStoppedAfterOpenCallsEndWithTheCause(t *testing.T) {
	const ttl = 2 * time.Second
	e, u := ownServer(t, ttl)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	o := &deadstore.Outage{
		TTL: ttl, ReleaseTimeout: time.Second, Slack: time.Second,
		Cause: deadstore.NamesRefusal,
		Start: func(ctx context.Context) error { return e.Start(ctx, "zookeeper") },
	}
	o.Stop(ctx, t, b, func(ctx context.Context) error { return e.Stop(ctx, "zookeeper") })

	t.Run("Backend.Acquire", func(t *testing.T) {
		deadstore.Call{
			What:  "Backend.Acquire(context.Background())",
			Hang:  ttl + o.Slack,
			Cause: deadstore.NamesRefusal,
		}.Check(t, func() error {
			_, err := b.Acquire(context.Background(), driver.AcquireRequest{Key: "backend", Owner: "o1", TTL: ttl})
			return err
		})
	})
	// The round of reconnection attempts has failed (Backend.Acquire
	// reported the refusal): until a server accepts again, a request
	// fails at once, by its deadline, not at go-zookeeper's next round,
	// a second later, whatever its context says.
	t.Run("RequestsWhileDown", func(t *testing.T) {
		const deadline, slack = 100 * time.Millisecond, 400 * time.Millisecond
		deadstore.Call{
			What:  "Inspect with a 100ms deadline",
			Times: 3,
			Hang:  deadline + slack,
			Cause: deadstore.NamesRefusal,
		}.Check(t, func() error {
			dctx, dcancel := context.WithTimeout(context.Background(), deadline)
			defer dcancel()
			_, err := b.Inspect(dctx, "held")
			return err
		})
	})
	o.Run(ctx, t)
}
