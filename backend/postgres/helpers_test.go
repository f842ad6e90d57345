package postgres_test

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

	"github.com/jackc/pgx/v5/pgxpool"
)

// testURL returns the test server's URL, or skips (fails on CI).
func testURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("FENCELOCK_TEST_POSTGRES")
	if u == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("FENCELOCK_TEST_POSTGRES is not set (CI=true): start a server with scripts/testenv up postgres")
		}
		t.Skip("FENCELOCK_TEST_POSTGRES is not set: run eval \"$(scripts/testenv up postgres)\" to test against a real PostgreSQL")
	}
	return u
}

// uniqueTable returns a table name unique to this run, dropped (with its
// sequence) when the test ends.
func uniqueTable(t testing.TB, base string) string {
	t.Helper()
	var b [4]byte
	_, _ = crand.Read(b[:])
	table := "fencelock_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pool, err := pgxpool.New(ctx, base)
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS "`+table+`"; DROP SEQUENCE IF EXISTS "`+table+`_token_seq"`); err != nil {
			t.Logf("cleanup: dropping %s: %v", table, err)
		}
	})
	return table
}

// withParams adds query parameters to a URL.
func withParams(t testing.TB, base string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// restartFunc returns a hook that kill -9s and restarts the testenv server,
// or nil when the server was not started by scripts/testenv.
func restartFunc(t testing.TB) func(ctx context.Context) error {
	if os.Getenv("FENCELOCK_TESTENV_STATE") == "" {
		return nil
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Log("go.work not found above the test directory: restart case disabled")
			return nil
		}
		dir = parent
	}
	root := dir
	return func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "testenv"), "restart", "postgres")
		cmd.Dir = root
		cmd.Env = os.Environ()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("testenv restart: %s", out)
		}
		return err
	}
}
