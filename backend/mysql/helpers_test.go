package mysql_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/internal/testenv"
)

// testURL returns the test server's URL, or skips (fails on CI).
func testURL(t testing.TB) string {
	t.Helper()
	return testenv.URL(t, "FENCELOCK_TEST_MYSQL")
}

// uniqueTable returns a table name unique to this run, dropped (with its
// counter table and procedures) when the test ends.
func uniqueTable(t testing.TB, base string) string {
	t.Helper()
	var b [4]byte
	_, _ = crand.Read(b[:])
	table := "fl_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db := rawDB(t, base)
		defer db.Close()
		for _, s := range []string{
			"DROP TABLE IF EXISTS `" + table + "`", "DROP TABLE IF EXISTS `" + table + "_tokens`",
			"DROP PROCEDURE IF EXISTS `" + table + "_acquire`", "DROP PROCEDURE IF EXISTS `" + table + "_rotate`",
		} {
			if _, err := db.ExecContext(ctx, s); err != nil {
				t.Logf("cleanup: %s: %v", s, err)
			}
		}
	})
	return table
}

// rawDB opens a pool on the URL's server, as a user of New would.
func rawDB(t testing.TB, base string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsnOf(t, base))
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// dsnOf is the go-sql-driver DSN of a mysql:// URL without parameters.
func dsnOf(t testing.TB, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.DriverConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.FormatDSN()
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

// openTable opens a Backend on the test server with a table of its own,
// closed when the test ends. It returns the Backend, the server's URL
// and the table's name, and a context bounded by a minute.
func openTable(t *testing.T) (context.Context, *mysql.Backend, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	base := testURL(t)
	table := uniqueTable(t, base)
	b, err := mysql.Open(ctx, withParams(t, base, "table", table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return ctx, b, base, table
}
