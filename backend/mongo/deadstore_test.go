package mongo_test

import (
	"context"
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/deadstore"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// releaseTimeout is Options.ReleaseTimeout's default: the engine's
// documented overrun after a call's bound; slack is scheduling slack.
const releaseTimeout, slack = 5 * time.Second, 2 * time.Second

// TestOpenOnRefusedPortFailsWithCause: Open of a URL where nothing
// listens returns within its context's deadline plus the overrun, with
// the refused connection as its cause (errors.Is ECONNREFUSED, and the
// message says so).
func TestOpenOnRefusedPortFailsWithCause(t *testing.T) {
	const timeout = 3 * time.Second
	u := "mongodb://" + deadstore.RefusingAddr(t) + "/?database=fencelock_test"
	deadstore.RefusedOpen{
		Open:    func(ctx context.Context) (io.Closer, error) { return mongolock.Open(ctx, u) },
		Timeout: timeout,
		Bound:   timeout + releaseTimeout + slack,
		Refused: func(err error) bool {
			return errors.Is(err, syscall.ECONNREFUSED) && errors.Is(err, mongolock.ErrUnreachable)
		},
		Want: "ErrUnreachable and ECONNREFUSED",
	}.Check(t)
}

// TestCallsOnVanishedServerEndWithinBound: a client opened through a
// proxy whose listener and connections then vanish (a server stopped
// after Open) gets TryAcquire (no deadline) back within the TTL plus the
// overrun, and Acquire with a 3s deadline back by the deadline plus the
// overrun, each with the refused connection as its cause.
func TestCallsOnVanishedServerEndWithinBound(t *testing.T) {
	eachServer(t, testCallsOnVanishedServerEndWithinBound)
}

func testCallsOnVanishedServerEndWithinBound(t *testing.T, _ server, raw string) {
	const ttl = 3 * time.Second
	p := newProxy(t, raw)
	c, err := fencelock.Open(context.Background(), withParams(t, viaProxy(t, p, raw), "database", testDatabase, "collection", freshCollection(t, raw)), &fencelock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "vanish/warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.Close()

	deadstore.Outage{
		Client: c, TTL: ttl, ReleaseTimeout: releaseTimeout, Slack: slack,
		Cause: func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) },
		// Its first command meets the connection the server closed; the
		// ones after, the refused ones.
		TryAcquireCause: func(err error) bool {
			return errors.Is(err, mongolock.ErrUnreachable) && (errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, io.EOF))
		},
		TryAcquireWant: "ErrUnreachable caused by a closed or refused connection",
	}.Run(context.Background(), t)
}
