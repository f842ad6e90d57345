package redis_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/deadstore"
)

// refusingAddr returns a loopback address where nothing listens
// (deadstore.RefusingAddr).
func refusingAddr(t *testing.T) string { return deadstore.RefusingAddr(t) }

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
			deadstore.RefusedOpen{
				Open:    func(ctx context.Context) (io.Closer, error) { return fencelockredis.Open(ctx, u) },
				Bound:   time.Second,
				Refused: deadstore.IsRefusal,
			}.Check(t)
		})
	}
}

// On a Redis killed after Open, one backend request fails within a
// second (a refused connection is not dialled again and again inside it),
// and the calls of deadstore.Outage within their bounds, each naming the
// refused connection.
func TestServerStoppedAfterOpenCallsEndWithTheCause(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := fencelockredis.Open(ctx, s.url())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	o := &deadstore.Outage{
		TTL: 2 * time.Second, ReleaseTimeout: time.Second, Slack: time.Second,
		Cause: deadstore.IsRefusal,
	}
	// The pool holds connections that the stop (kill -9) breaks.
	o.Stop(ctx, t, b, func(context.Context) error { s.kill(); return nil })

	t.Run("Backend.Acquire", func(t *testing.T) {
		deadstore.Call{
			What:  "Backend.Acquire(context.Background())",
			Times: 3, // a broken pooled connection, then new dials
			Hang:  o.TTL + o.Slack,
			Bound: time.Second,
			Cause: deadstore.IsRefusal,
		}.Check(t, func() error {
			_, err := b.Acquire(context.Background(), driver.AcquireRequest{Key: "backend", Owner: "o1", TTL: o.TTL})
			return err
		})
	})
	o.Run(ctx, t)
}
