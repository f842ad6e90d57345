package nats

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/deadstore"
)

// notConnected reports whether err names the lost connection (requests
// fail at once while the client reconnects: nothing is buffered).
func notConnected(err error) bool {
	return err != nil && strings.Contains(err.Error(), "not connected to the server")
}

// On a NATS server stopped after Open, TryAcquire without a deadline and
// Acquire with one end within their bounds, naming the lost connection,
// and once the server is back the client acquires again (it reconnects).
func TestServerStoppedAfterOpenCallsEndWithTheCause(t *testing.T) {
	e, u := deadstore.OwnServer(t, "nats", "NATS")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := Open(ctx, u+"?bucket=outage")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	o := &deadstore.Outage{
		TTL: 2 * time.Second, ReleaseTimeout: time.Second, Slack: time.Second,
		Cause: notConnected, Want: "the lost connection",
		Start: func(ctx context.Context) error { return e.Start(ctx, "nats") },
	}
	o.Stop(ctx, t, b, func(ctx context.Context) error { return e.Stop(ctx, "nats") })
	o.Run(ctx, t)
}
