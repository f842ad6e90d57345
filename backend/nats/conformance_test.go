package nats

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
)

// testURL returns the URL in env (FENCELOCK_TEST_NATS by default) with a
// fresh bucket, so test runs can share a server. It skips the test
// (fails it on CI) when the variable is unset.
func testURL(t testing.TB, env ...string) string {
	t.Helper()
	name := "FENCELOCK_TEST_NATS"
	if len(env) > 0 {
		name = env[0]
	}
	raw := testenv.URL(t, name)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	q := u.Query()
	q.Set("bucket", "fencelock-test-"+hex.EncodeToString(rnd[:]))
	u.RawQuery = q.Encode()
	return u.String()
}

// crash makes b behave like a dead process: its connection is cut, so
// nothing it has not sent reaches the server, and nothing is released.
func (b *Backend) crash() {
	b.crashed.Store(true)
	b.closed.Store(true)
	b.nc.Close()
	b.w.stop()
}

func harness(u string, restart func(context.Context) error) conformance.Harness {
	return conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) { return Open(ctx, u) },
		// Per-message TTLs count whole seconds, at least one.
		TTL:     2 * time.Second,
		Crash:   func(b driver.Backend) { b.(*Backend).crash() },
		Restart: restart,
		// A renewal is one write per lease (JetStream has no
		// compare-and-set of several subjects), each synced to disk by
		// the test server: on a loaded two-core machine a thousand per
		// renewal interval do not all land in time. The case is about
		// holding many leases, not about the disk's write rate.
		Leases: 300,
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, harness(testURL(t), testenv.Restart("nats")))
}

// TestConformanceStockConfig runs the suite against a server with every
// setting at its default (scripts/testenv's nats-stock).
func TestConformanceStockConfig(t *testing.T) {
	conformance.Run(t, harness(testURL(t, "FENCELOCK_TEST_NATS_STOCK"), nil))
}
