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
	}.Check(t)
}

// On an etcd stopped after Open, the calls of deadstore.Outage end within
// their bounds naming the refused connection, and succeed again once the
// server is back; so does the backend's own Acquire within the lease TTL
// (no request waits for the connection to be ready, the lease keep-alive
// tries once). With gRPC's wait-for-ready the keep-alive of the session's
// lease retried for ever, and TryAcquire(context.Background()) never
// returned.
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
		Cause: deadstore.NamesRefusal,
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
		}.Check(t, func() error {
			_, err := b.Acquire(context.Background(), lockReq("backend", "o1"))
			return err
		})
	})
	o.Run(ctx, t)
}
