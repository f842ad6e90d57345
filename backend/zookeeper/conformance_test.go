package zookeeper

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
	raw := os.Getenv("FENCELOCK_TEST_ZOOKEEPER")
	if raw == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("FENCELOCK_TEST_ZOOKEEPER not set (on CI every backend is tested)")
		}
		t.Skip("FENCELOCK_TEST_ZOOKEEPER not set; start a server with: eval \"$(scripts/testenv up zookeeper)\"")
	}
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

// repoRoot walks up from the working directory to the directory holding go.work.
func repoRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("go.work not found above the working directory")
		}
		dir = up
	}
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
	if state := os.Getenv("FENCELOCK_TESTENV_STATE"); state != "" {
		root := repoRoot(t)
		h.Restart = func(ctx context.Context) error {
			cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "testenv"), "restart", "zookeeper")
			cmd.Env = append(os.Environ(), "FENCELOCK_TESTENV_STATE="+state)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Logf("testenv restart zookeeper: %s", out)
			}
			return err
		}
	}
	conformance.Run(t, h)
}
