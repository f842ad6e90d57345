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
// or kept alive any more, and its watches stop.
func (b *Backend) crash() {
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return
	}
	b.closed.Store(true)
	b.cancel()
	for _, s := range b.sessions {
		s.mu.Lock()
		s.id = 0
		s.mu.Unlock()
	}
	b.mu.Unlock()
	b.wg.Wait()
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
