package redis_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
)

// testURL returns the server under test, from FENCELOCK_TEST_REDIS.
func testURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("FENCELOCK_TEST_REDIS")
	if u == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("FENCELOCK_TEST_REDIS is not set (CI=true): start a server with scripts/testenv up redis")
		}
		t.Skip("FENCELOCK_TEST_REDIS not set: no Redis to test against (eval \"$(scripts/testenv up redis)\")")
	}
	return u
}

// uniquePrefix is a key prefix no other test run uses.
func uniquePrefix(t testing.TB) string {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return "fencelock-test-" + hex.EncodeToString(b[:])
}

// withPrefix adds prefix= to a URL.
func withPrefix(u, prefix string) string {
	sep := "?"
	for _, c := range u {
		if c == '?' {
			sep = "&"
		}
	}
	return u + sep + "prefix=" + prefix
}

// repoRoot walks up from the working directory to the dir holding go.work.
func repoRoot(t testing.TB) string {
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

// restartHook kills -9 and restarts the test server, when it was started by
// scripts/testenv.
func restartHook(t testing.TB) func(context.Context) error {
	if os.Getenv("FENCELOCK_TESTENV_STATE") == "" {
		return nil
	}
	root := repoRoot(t)
	return func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "testenv"), "restart", "redis")
		cmd.Dir = root
		cmd.Env = os.Environ()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("scripts/testenv restart redis: %v\n%s", err, out)
		}
		return nil
	}
}

func TestConformance(t *testing.T) {
	url := withPrefix(testURL(t), uniquePrefix(t))
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) {
			return fencelockredis.Open(ctx, url)
		},
		TTL:     time.Second,
		Restart: restartHook(t),
	})
}

// plain hides the optional capabilities, so the suite also covers the
// backend without notifications and batch renewal.
type plain struct{ driver.Backend }

func TestConformanceWithoutCapabilities(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	url := withPrefix(testURL(t), uniquePrefix(t))
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) {
			b, err := fencelockredis.Open(ctx, url)
			if err != nil {
				return nil, err
			}
			return plain{b}, nil
		},
		TTL: time.Second,
		// Without BatchRenewer every lease is renewed on its own round
		// trip: 1000 leases at TTL 1s is ~3000 renewals/s, more than two
		// shared cores manage under -race. The batched suite above holds
		// the full 1000.
		Leases: 200,
	})
}
