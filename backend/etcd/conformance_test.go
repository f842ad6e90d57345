package etcd

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
)

// testURL returns the etcd URL from FENCELOCK_TEST_ETCD with a fresh key
// prefix, so test runs can share a server. It skips the test (fails it on
// CI) when the variable is unset.
func testURL(t testing.TB) string {
	t.Helper()
	raw := os.Getenv("FENCELOCK_TEST_ETCD")
	if raw == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("FENCELOCK_TEST_ETCD is not set (etcd://127.0.0.1:PORT); run: eval \"$(scripts/testenv up etcd)\"")
		}
		t.Skip("FENCELOCK_TEST_ETCD is not set (etcd://127.0.0.1:PORT); run: eval \"$(scripts/testenv up etcd)\"")
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("FENCELOCK_TEST_ETCD: %v", err)
	}
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	u.Path = "/fencelock-test-" + hex.EncodeToString(rnd[:]) + "/"
	return u.String()
}

// repoRoot walks up from the working directory to the directory holding
// go.work.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.work not found above the working directory")
		}
		dir = parent
	}
}

// restartHook restarts the test server when it was started by
// scripts/testenv (FENCELOCK_TESTENV_STATE set), else nil.
func restartHook(t testing.TB) func(ctx context.Context) error {
	if os.Getenv("FENCELOCK_TESTENV_STATE") == "" {
		return nil
	}
	root := repoRoot(t)
	return func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "testenv"), "restart", "etcd")
		cmd.Dir = root
		cmd.Env = os.Environ()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("testenv restart etcd: %s", out)
		}
		return err
	}
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
		Restart: restartHook(t),
	})
}
