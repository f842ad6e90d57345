//go:build unix

package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/testenv"
)

// TestRealBackends runs the built binary against every real store named
// by the FENCELOCK_TEST_<NAME> variables (see docs/testenv.md): run, status,
// list --json, --no-wait, release --force and the lost-lease exit status,
// the way an operator would use them.
func TestRealBackends(t *testing.T) {
	for _, name := range []string{"POSTGRES", "REDIS", "ETCD", "ZOOKEEPER", "MONGO"} {
		t.Run(strings.ToLower(name), func(t *testing.T) {
			smoke(t, testenv.URL(t, "FENCELOCK_TEST_"+name))
		})
	}
}

func smoke(t *testing.T, url string) {
	f := newFixture(t)
	f.url = url
	var rnd [4]byte
	rand.Read(rnd[:])
	prefix := "fencelock-cli-test-" + hex.EncodeToString(rnd[:]) + "/"
	key := prefix + "job"

	// A plain run: the command sees its token, fencelock exits with its
	// status.
	stdout, stderr, code := f.run("run", "--ttl", "3s", key, "--", "sh", "-c", `echo "$FENCELOCK_TOKEN"; exit 3`)
	if code != 3 {
		t.Fatalf("run: exit %d; want 3\n%s", code, stderr)
	}
	first, err := strconv.ParseUint(strings.TrimSpace(stdout), 10, 64)
	if err != nil || first == 0 {
		t.Fatalf("run: command printed token %q", stdout)
	}

	// A holder, inspected and contended.
	out := filepath.Join(f.dir, "trap")
	h, info := f.holder(key, out, "--ttl", "3s")
	tok, _ := strconv.ParseUint(strings.Fields(info)[1], 10, 64)
	if tok <= first {
		t.Errorf("second holder's token %d not above the first's %d", tok, first)
	}
	stdout, stderr, code = f.run("status", "--json", key)
	var st lockJSON
	if err := json.Unmarshal([]byte(stdout), &st); err != nil || code != 0 || !st.Held || st.Token != tok {
		t.Fatalf("status --json: exit %d, %q, %v; want held with token %d\n%s", code, stdout, err, tok, stderr)
	}
	stdout, stderr, code = f.run("list", "--json", prefix)
	var locks []lockJSON
	if err := json.Unmarshal([]byte(stdout), &locks); err != nil || code != 0 || len(locks) != 1 || locks[0].Key != key {
		t.Fatalf("list --json: exit %d, %q, %v\n%s", code, stdout, err, stderr)
	}
	if _, stderr, code = f.run("run", "--no-wait", key, "--", "true"); code != exitNotAcquired {
		t.Fatalf("run --no-wait on a held key: exit %d; want %d\n%s", code, exitNotAcquired, stderr)
	}

	// Take it away: the holder stops its command and exits 79.
	stdout, stderr, code = f.run("release", "--force", key)
	switch {
	case code == 0:
		if !strings.Contains(stdout, "removed the lock") {
			t.Errorf("release --force said %q", stdout)
		}
		if code := waitExit(t, h, 60*time.Second); code != exitLeaseLost {
			t.Fatalf("holder exit %d after release --force; want %d", code, exitLeaseLost)
		}
		if got, err := os.ReadFile(out); err == nil {
			t.Fatalf("holder's command marker %q: after the loss it was given time to handle SIGTERM; want SIGKILL at once", got)
		}
	case code == exitUnavailable && strings.Contains(stderr, "not supported"):
		t.Logf("backend cannot force-release: %s", stderr)
		h.Process.Signal(syscall.SIGTERM)
		if code := waitExit(t, h, 60*time.Second); code != 42 {
			t.Fatalf("holder exit %d after SIGTERM; want the command's 42", code)
		}
	default:
		t.Fatalf("release --force: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, stderr, code = f.run("status", key); code != exitFree {
		t.Fatalf("status after the holder ended: exit %d; want %d\n%s", code, exitFree, stderr)
	}
}

// TestDemoOnEveryStore runs `fencelock demo --url` on every real store
// and on a file directory: the paused holder's late write is refused by
// the fence on the user's own store too, and the demo's key is gone
// afterwards.
func TestDemoOnEveryStore(t *testing.T) {
	urls := map[string]string{"file": "file://" + t.TempDir()}
	for _, name := range []string{"POSTGRES", "REDIS", "ETCD", "ZOOKEEPER", "MONGO"} {
		urls[strings.ToLower(name)] = testenv.URL(t, "FENCELOCK_TEST_"+name)
	}
	for name, url := range urls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			stdout, stderr, code := f.run("demo", "--url", url)
			if code != 0 {
				t.Fatalf("demo --url: exit %d\n%s%s", code, stdout, stderr)
			}
			for _, want := range []string{"on your store", "REJECTED", "stale fencing token"} {
				if !strings.Contains(stdout, want) {
					t.Errorf("demo --url output lacks %q:\n%s", want, stdout)
				}
			}
			stdout, _, _ = f.run("list", "--url", url, "fencelock-demo/")
			if strings.TrimSpace(stdout) != "" {
				t.Errorf("demo left locks behind: %q", stdout)
			}
		})
	}
}
