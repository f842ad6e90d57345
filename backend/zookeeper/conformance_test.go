package zookeeper

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
)

// testTTL is the lease TTL of the suite; the test sessions use the same
// timeout, as the harness requires (tickTime 200ms allows it). 3s rather
// than 2s: on a 2-core machine shared with other servers' fsyncs, a
// renewal (one multi transaction for a batch) sometimes took 0.5s.
const testTTL = 3 * time.Second

// runID makes this run's znodes unique, so runs can share a server.
var runID = func() string {
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	return hex.EncodeToString(rnd[:])
}()

// testURL returns FENCELOCK_TEST_ZOOKEEPER with a session timeout and a
// prefix unique to this run, or skips (fails on CI) without it.
func testURL(t testing.TB) string {
	t.Helper()
	raw := conformance.ServerURL(t, "FENCELOCK_TEST_ZOOKEEPER")
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("FENCELOCK_TEST_ZOOKEEPER: %v", err)
	}
	q := u.Query()
	if q.Get("session_timeout") == "" {
		q.Set("session_timeout", testTTL.String())
	}
	q.Set("prefix", "fencelock-test-"+runID)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestConformance(t *testing.T) {
	u := testURL(t)
	h := conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) { return Open(ctx, u) },
		TTL:  testTTL,
		// A dead process sends no more pings: cut the TCP connection and
		// refuse to reconnect, so the server expires the session after its
		// timeout (closing the session would delete its znodes at once).
		Crash: func(b driver.Backend) { b.(*Backend).crash() },
	}
	h.Restart = conformance.TestenvRestart("zookeeper")
	conformance.Run(t, h)
}
