package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/driver"
)

// tableExists reports whether the URL's database has table.
func tableExists(ctx context.Context, t *testing.T, db *sql.DB, table string) bool {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// A session whose settings break the statements is refused with an
// *InvalidOptionError naming the setting, before any DDL (nothing is
// created): autocommit off, under which a renewal, release or token floor
// reports success without committing and keeps its row lock in an idle
// pooled connection (a floor then blocks every grant of the table), and a
// client character set in which a multibyte character can swallow the
// backslash that escapes a quote, under which a key such as
// "中' OR 1=1 #" released every lock of the table.
func TestOpenRefusesSessionsThatBreakStatements(t *testing.T) {
	base := testURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := rawDB(t, base)
	defer db.Close()
	for _, c := range []struct{ param, value, want string }{
		{"autocommit", "0", "autocommit"},
		{"autocommit", "OFF", "autocommit"},
		{"charset", "gbk", "utf8mb4"},
		{"charset", "sjis", "utf8mb4"},
		{"character_set_client", "big5", "utf8mb4"},
	} {
		table := uniqueTable(t, base)
		b, err := mysql.Open(ctx, withParams(t, base, "table", table, c.param, c.value))
		if err == nil {
			b.Close()
		}
		var ie *driver.InvalidOptionError
		if !errors.As(err, &ie) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open with %s=%s: %v; want an *InvalidOptionError naming %q", c.param, c.value, err, c.want)
		}
		if tableExists(ctx, t, db, table) {
			t.Errorf("Open with %s=%s created table %s; want nothing stored", c.param, c.value, table)
		}
	}
}

// New refuses a caller's pool whose connections do not autocommit, as
// Open refuses the URL.
func TestNewRefusesPoolWithoutAutocommit(t *testing.T) {
	base := testURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sql.Open("mysql", dsnOf(t, base)+"&autocommit=0")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = mysql.New(ctx, db, &mysql.Options{Table: uniqueTable(t, base)})
	var ie *driver.InvalidOptionError
	if !errors.As(err, &ie) || ie.Option != "autocommit" {
		t.Fatalf("New on a pool with autocommit=0: %v; want an *InvalidOptionError for autocommit", err)
	}
}
