package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ServerURL returns the URL of a test server from the environment variable
// env (for fencelock's own backends FENCELOCK_TEST_POSTGRES, _REDIS, _ETCD,
// _ZOOKEEPER, _MONGO, set by scripts/testenv or by a developer pointing at
// their own server). When it is unset the test is skipped locally, but fails
// under CI=true: in CI a missing server is an error, never a skip.
func ServerURL(t testing.TB, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		if ci := os.Getenv("CI"); ci == "true" || ci == "1" {
			t.Fatalf("%s is not set: under CI every backend's server must be running (scripts/testenv up)", env)
		}
		t.Skipf("%s is not set: start a server with `eval \"$(scripts/testenv up)\"` or point %s at your own", env, env)
	}
	return u
}

// TestenvRestart returns a Harness.Restart that kills the named server
// (kill -9) and starts it again with its data, using scripts/testenv — or
// nil when the server was not started by that script
// (FENCELOCK_TESTENV_STATE unset), since a developer's own server must not
// be killed.
func TestenvRestart(name string) func(ctx context.Context) error {
	state := os.Getenv("FENCELOCK_TESTENV_STATE")
	if state == "" {
		return nil
	}
	return func(ctx context.Context) error {
		root, err := repoRoot()
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "testenv"), "restart", name)
		cmd.Env = os.Environ()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("scripts/testenv restart %s: %w\n%s", name, err, out)
		}
		return nil
	}
}

// repoRoot walks up from the working directory to the directory holding
// go.work.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("conformance: go.work not found above the working directory")
		}
		dir = parent
	}
}
