package mysql_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/driver"
)

const secret = "Sup3rS3cret"

// A URL Open cannot use is an *InvalidOptionError that says what to fix,
// before any connection, and never shows the password.
func TestOpenRefusesBadURLsNamingTheFix(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct{ url, want string }{
		{"mysql://u:" + secret + "@127.0.0.1:1/db?table=a&table=b", `"table"`},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?charset=utf8mb4&charset=latin1", "more than once"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?password=" + secret + "&password=x", "USER:PASSWORD@"},
		{"mysql://u@127.0.0.1:1/db?password=" + secret, "USER:PASSWORD@"},
		{"mysql://127.0.0.1:1/db?user=u", "USER:PASSWORD@"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?table=1bad", "digit"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?table=" + strings.Repeat("t", 49), "48"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?tls=maybe", "skip-verify"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?tls=false&tls_ca=/x", "tls=true"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?tls_cert=/c", "tls_key"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?tls_ca=/nonexistent/ca.pem", "cannot be read"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?max_open_conns=0", "positive"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?create_table=perhaps", "create_table"},
		{"mysql://u:" + secret + "@127.0.0.1:1/", "database"},
		{"mysql://u:" + secret + "@/db", "socket="},
		{"mysql://u:" + secret + "@db.example/db?socket=/run/mysqld/mysqld.sock", "localhost"},
		{"mysql://u:" + secret + "@127.0.0.1:99999/db", "port"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?timeout=soon", "driver"},
		{"postgres://u:" + secret + "@127.0.0.1:1/db", "mysql or mariadb"},
		// url.URL.Query drops these pairs: the table was ignored.
		{"mysql://u:" + secret + "@127.0.0.1:1/db?table=a-b;drop", "%3B"},
		{"mysql://u:" + secret + "@127.0.0.1:1/db?table=t&password=" + secret + "%zz", "%25"},
	} {
		_, err := mysql.Open(ctx, c.url)
		var ie *driver.InvalidOptionError
		if !errors.As(err, &ie) {
			t.Errorf("Open(%s) = %v; want *driver.InvalidOptionError", driver.RedactURL(c.url), err)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%s) = %v; want it to name %q", driver.RedactURL(c.url), err, c.want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%s) shows the password: %v", driver.RedactURL(c.url), err)
		}
	}
}

// fencelock.Open refuses a query it cannot parse whole, before the
// backend sees it, instead of dropping the pair (and with it table=).
func TestFencelockOpenRefusesUnparsableQuery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, u := range []string{
		"mysql://u:" + secret + "@127.0.0.1:1/db?table=a;b",
		"mariadb://u:" + secret + "@127.0.0.1:1/db?ttl=5s&password=" + secret + "%zz",
	} {
		_, err := fencelock.Open(ctx, u, nil)
		var ie *driver.InvalidOptionError
		if !errors.As(err, &ie) || !strings.Contains(err.Error(), "percent-encode") {
			t.Errorf("fencelock.Open(%s) = %v; want an *InvalidOptionError saying to percent-encode", driver.RedactURL(u), err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("fencelock.Open(%s) shows the password: %v", driver.RedactURL(u), err)
		}
	}
}

// A parameter that neither fencelock nor the driver knows reaches the
// server as a session variable; the server refuses it, and Open returns
// an *InvalidOptionError naming it, without the password.
func TestOpenUnknownParameterRefusedByServer(t *testing.T) {
	base := testURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := mysql.Open(ctx, withParams(t, base, "no_such_secret", secret))
	var ie *driver.InvalidOptionError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "no_such_secret") {
		t.Fatalf("Open with no_such_secret=…: %v; want *driver.InvalidOptionError naming it", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the error shows the password: %v", err)
	}
	// A session variable the server knows is set.
	b, err := mysql.Open(ctx, withParams(t, base, "table", uniqueTable(t, base), "innodb_lock_wait_timeout", "7"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var v int
	if err := b.DB().QueryRowContext(ctx, "SELECT @@innodb_lock_wait_timeout").Scan(&v); err != nil || v != 7 {
		t.Errorf("innodb_lock_wait_timeout = %d, %v; want 7 from the URL", v, err)
	}
}

// A wrong password is refused by the server, and neither it nor the URL's
// password appears in the error; both schemes open through fencelock.Open.
func TestSchemesOpenAndPasswordRedacted(t *testing.T) {
	base := testURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	table := uniqueTable(t, base)
	for _, scheme := range mysql.Schemes {
		u := strings.Replace(withParams(t, base, "table", table), "mysql://", scheme+"://", 1)
		c, err := fencelock.Open(ctx, u, nil)
		if err != nil {
			t.Fatalf("fencelock.Open(%s): %v", u, err)
		}
		c.Close()
	}
	bad := strings.Replace(base, "mysql://fencelock@", "mysql://fencelock:"+secret+"@", 1)
	_, err := mysql.Open(ctx, bad)
	if err == nil {
		t.Fatal("Open with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the error shows the password: %v", err)
	}
	var me *gomysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1045 || !strings.Contains(err.Error(), "check the URL's user and password") {
		t.Errorf("Open with a wrong password: %v; want the server's *mysql.MySQLError 1045, saying what to check", err)
	}
	// A database that does not exist: say to create it.
	u, _ := url.Parse(base)
	u.Path = "/no_such_database_here"
	_, err = mysql.Open(ctx, u.String())
	if !errors.As(err, &me) || me.Number != 1049 || !strings.Contains(err.Error(), "CREATE DATABASE") {
		t.Errorf("Open of a missing database: %v; want the server's *mysql.MySQLError 1049, saying to create it", err)
	}
}

// New works on a pool of the caller's, which Close leaves open.
func TestNewOnCallersPoolLeavesItOpen(t *testing.T) {
	base := testURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db := rawDB(t, base)
	defer db.Close()
	b, err := mysql.New(ctx, db, &mysql.Options{Table: uniqueTable(t, base)})
	if err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Second})
	if err != nil || g.Token == 0 {
		t.Fatalf("Acquire: %+v, %v", g, err)
	}
	b.Close()
	if err := db.PingContext(ctx); err != nil {
		t.Errorf("the caller's pool after Close: %v; want it open", err)
	}
	if _, err := mysql.New(ctx, nil, nil); err == nil {
		t.Error("New with a nil pool succeeded")
	}
}
