package postgres_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// testURL returns the test server's URL, or skips (fails on CI).
func testURL(t testing.TB) string {
	t.Helper()
	u := testenv.URL(t, "FENCELOCK_TEST_POSTGRES")
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
