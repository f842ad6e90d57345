package testenv

import (
	"context"
	"os"
	"testing"
)

// URL returns the URL of a test server from the environment variable env
// (FENCELOCK_TEST_POSTGRES, _REDIS, ..., set by Up or by a developer
// pointing at their own server). When it is unset the test is skipped,
// but under CI=true it fails: in CI a missing server is an error, never a
// skip.
func URL(t testing.TB, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		if IsCI() {
			t.Fatalf("%s is not set: under CI every backend's server must be running (out=$(scripts/testenv up) && eval \"$out\")", env)
		}
		t.Skipf("%s is not set: start the servers with out=$(scripts/testenv up) && eval \"$out\", or point %s at your own", env, env)
	}
	return u
}

// Restart returns a Harness.Restart for the conformance suite: it kills
// the named server with SIGKILL (a crash) and starts it again with its
// port and data, in-process, returning once it serves. It returns nil
// when the server does not belong to the state dir of
// FENCELOCK_TESTENV_STATE (unset, or a developer's own server named by
// the server's variable), since a server testenv did not start must never
// be killed.
func Restart(name string) func(ctx context.Context) error {
	e, err := FromEnv()
	if err != nil {
		return nil
	}
	if v := os.Getenv(EnvVar(name)); v != "" && !e.Owns(name, v) {
		return nil
	}
	return func(ctx context.Context) error { return e.Restart(ctx, name) }
}
