package etcd

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

// testURL returns the etcd URL from FENCELOCK_TEST_ETCD with a fresh key
// prefix, so test runs can share a server. It skips the test (fails it on
// CI) when the variable is unset.
func testURL(t testing.TB) string {
	t.Helper()
	raw := testenv.URL(t, "FENCELOCK_TEST_ETCD")
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("FENCELOCK_TEST_ETCD: %v", err)
	}
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	u.Path = "/fencelock-test-" + hex.EncodeToString(rnd[:]) + "/"
	return u.String()
}

// crash makes b behave like a dead process: nothing is released, revoked
// or kept alive any more, and its watches stop. closed is set without
// cleanClose, so no clean-up of Close's runs. The connection of a client
// the backend owns is cut, as a dead process's is: what a call in flight
// has not sent yet never reaches etcd (a request already sent may still
// be applied, as a dead process's last packets may be), and every later
// request fails.
func (b *Backend) crash() {
	if b.own {
		_ = b.cli.ActiveConnection().Close()
	}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return
	}
	b.closed.Store(true)
	b.cancel()
	b.mu.Unlock()
	b.wg.Wait()
	if b.own {
		_ = b.cli.Close() // the rest of the client (Close returns early now)
	}
}

func TestConformance(t *testing.T) {
	u := testURL(t)
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) { return Open(ctx, u) },
		// etcd grants leases in whole seconds, at least 2s by default.
		TTL:     2 * time.Second,
		Crash:   func(b driver.Backend) { b.(*Backend).crash() },
		Restart: testenv.Restart("etcd"),
	})
}
