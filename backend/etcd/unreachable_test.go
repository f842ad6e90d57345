package etcd

import (
	"context"
	"io"
	"net/url"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/deadstore"
	"github.com/fencelock/fencelock/internal/testenv"
)

// ownServer starts an etcd of the test's own (deadstore.OwnServer), so
// that the test may stop it without disturbing the server other tests
// share. It returns the Env and the server's URL with a fresh key prefix.
func ownServer(t *testing.T) (*testenv.Env, string) {
	t.Helper()
	e, raw := deadstore.OwnServer(t, "etcd", "etcd")
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/fencelock-unreachable/"
	return e, u.String()
}

// Open on an address where nothing listens fails at once, saying that the
// connection was refused: not after the dial timeout (5s) with a bare
// "context deadline exceeded" (gRPC's wait-for-ready hid the refusal).
func TestOpenRefusedConnectionFailsAtOnce(t *testing.T) {
	u := "etcd://" + deadstore.RefusingAddr(t) + "/fencelock-refused/"
	deadstore.RefusedOpen{
		Open:    func(ctx context.Context) (io.Closer, error) { return Open(ctx, u) },
		Bound:   2 * time.Second,
		Refused: deadstore.NamesRefusal,
		Want:    "the refused connection",
	}.Check(t)
}

// A server that stops after Open makes every call end within its bound
// and name the cause: TryAcquire without a deadline returns within the
// lease TTL (plus the release budget), and so does the backend's own
// Acquire (it does not block past its context: no request waits for the
// connection to be ready, the lease keep-alive tries once); Acquire with a
// deadline returns by the deadline plus the release budget, with an error
// that matches the deadline and names the refused connection. With
// gRPC's wait-for-ready the keep-alive of the session's lease retried for
// ever, and TryAcquire(context.Background()) never returned. Once the
// server is back, calls succeed again.
func TestServerStoppedAfterOpenCallsEndWithTheCause(t *testing.T) {
	e, u := ownServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	o := &deadstore.Outage{
		TTL: 2 * time.Second, ReleaseTimeout: time.Second, Slack: time.Second,
		Cause: deadstore.NamesRefusal, Want: "the refused connection",
		Start: func(ctx context.Context) error { return e.Start(ctx, "etcd") },
	}
	// A lease of the session exists ("held"): the next acquisition keeps
	// it alive (the request that hung) rather than granting one.
	o.Stop(ctx, t, b, func(ctx context.Context) error { return e.Stop(ctx, "etcd") })

	t.Run("Backend.Acquire", func(t *testing.T) {
		deadstore.Call{
			What:  "Backend.Acquire(context.Background())",
			Hang:  o.TTL + o.Slack,
			Cause: deadstore.NamesRefusal,
			Want:  "an error naming the refused connection",
		}.Check(t, func() error {
			_, err := b.Acquire(context.Background(), lockReq("backend", "o1"))
			return err
		})
	})
	o.Run(ctx, t)
}
