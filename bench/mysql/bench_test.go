// Package bench compares fencelock's MySQL/MariaDB backend with the raw
// statements a table lock is built on, against a real server
// (FENCELOCK_TEST_MYSQL).
//
//	go test -run '^$' -bench . -benchtime 3s ./bench/mysql
//
// Uncontended: acquire+release of a fresh lock by one goroutine, and by 16
// goroutines on distinct keys; Reacquire: each goroutine re-takes its own
// key. Both interleave the raw statements, the backend alone and the
// fencelock client in rounds of 64 operations each (b.N rounds), so all
// three see the same background load, and report each one's ops/s and its
// ratio to raw. Scale: one client holds 1,000 and 10,000 leases through
// three renewal intervals.
//
// fencelock is opened as a user of URLs gets it: fencelock.Open(ctx, URL,
// nil) with the test server's URL and only table= added (a fresh table per
// run), so its pool and TTL are the defaults. The raw statements run on a
// pool of 16 connections, one per goroutine of the widest run.
package bench

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
)

// ttl is the backend-only lease's TTL: fencelock's default, which the
// clients get from the URL.
const ttl = 15 * time.Second

func serverURL(b *testing.B) string { return benchkit.ServerURL(b, "FENCELOCK_TEST_MYSQL") }

func withParam(u, param string) string {
	if strings.Contains(u, "?") {
		return u + "&" + param
	}
	return u + "?" + param
}

// dbOf opens a database/sql pool of n connections on the URL's server, as
// Open would configure the driver, closed when b ends.
func dbOf(b *testing.B, raw string, n int) *sql.DB {
	u, err := url.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := mysql.DriverConfig(u)
	if err != nil {
		b.Fatal(err)
	}
	c, err := gomysql.NewConnector(cfg)
	if err != nil {
		b.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	b.Cleanup(func() { db.Close() })
	return db
}

// The raw statements: one autocommit upsert that takes a free or expired
// key with a per-key token, and one owner-checked delete. No stored
// procedure, no counter row, no lock delay, no metadata: the limit of a
// lock built on an upsert, with the same InnoDB commit per acquire.
const (
	rawTable = "CREATE TABLE %s (lock_key VARBINARY(512) NOT NULL PRIMARY KEY, owner VARBINARY(512) NOT NULL, " +
		"token BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE = InnoDB"
	// The assignments run left to right: token and owner are decided
	// while expires_at is still the old one, which is set last.
	rawAcquire = `INSERT INTO %s (lock_key, owner, token, expires_at) VALUES (?, ?, 1, UTC_TIMESTAMP(6) + INTERVAL 15 SECOND)
  ON DUPLICATE KEY UPDATE
    token = IF(expires_at <= UTC_TIMESTAMP(6), LAST_INSERT_ID(token + 1), token),
    owner = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner),
    expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)`
	rawRelease = `DELETE FROM %s WHERE lock_key = ? AND owner = ?`
)

// rawConns is the raw statements' pool size: one connection for each of
// the 16 goroutines of the widest run.
const rawConns = 16

// rawLib runs the raw statements on a pool of rawConns connections;
// waiting spins on the upsert with no pause (the ceiling).
func rawLib(name string) benchkit.Lib {
	return benchkit.Lib{Name: name, Setup: func(b *testing.B) benchkit.Lockers {
		ctx := context.Background()
		db := dbOf(b, serverURL(b), rawConns)
		table := "bench_raw_" + benchkit.RandomHex()
		if _, err := db.ExecContext(ctx, fmt.Sprintf(rawTable, table)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table) })
		acquire, release := fmt.Sprintf(rawAcquire, table), fmt.Sprintf(rawRelease, table)
		return func(i int) (try, wait benchkit.LockFunc) {
			owner := "raw-" + strconv.Itoa(i)
			try = func(ctx context.Context, key string) (func() error, error) {
				res, err := db.ExecContext(ctx, acquire, key, owner)
				if err != nil {
					return nil, err
				}
				// 1: inserted, 2: taken over, 0: held (nothing changed).
				if n, err := res.RowsAffected(); err != nil {
					return nil, err
				} else if n == 0 {
					return nil, benchkit.ErrHeld
				}
				return func() error { _, err := db.ExecContext(ctx, release, key, owner); return err }, nil
			}
			return try, benchkit.Poll(try, 0, 0)
		}
	}}
}

// fencelockURL returns the URL a user would write for a fresh fencelock
// table (the test server's URL plus table=), whose tables and procedures
// are dropped when b ends. Nothing else is tuned.
func fencelockURL(b *testing.B) string {
	table := "bench_" + benchkit.RandomHex()
	u := withParam(serverURL(b), "table="+table)
	db := dbOf(b, serverURL(b), 1)
	b.Cleanup(func() {
		for _, s := range []string{"DROP TABLE IF EXISTS `" + table + "`, `" + table + "_tokens`",
			"DROP PROCEDURE IF EXISTS `" + table + "_acquire`", "DROP PROCEDURE IF EXISTS `" + table + "_rotate`"} {
			db.ExecContext(context.Background(), s)
		}
	})
	return u
}

// backendLib is the backend's Acquire and Release (fencelock.OpenBackend
// of the same URL), one backend (and pool) shared by the goroutines.
var backendLib = benchkit.BackendLib("backend", true, ttl, func(b *testing.B) func() (driver.Backend, error) {
	u := fencelockURL(b)
	return func() (driver.Backend, error) {
		be, _, err := fencelock.OpenBackend(context.Background(), u)
		return be, err
	}
})

// fencelockLib is the fencelock client as a URL user gets it,
// fencelock.Open(ctx, URL, nil), shared by the goroutines.
var fencelockLib = benchkit.FencelockLib("fencelock", true, func(b *testing.B) func() (*fencelock.Client, error) {
	u := fencelockURL(b)
	return func() (*fencelock.Client, error) { return fencelock.Open(context.Background(), u, nil) }
})

// interleaved runs the raw statements, the backend alone and the
// fencelock client in turns of 64 acquire+release, by 1 and by 16
// goroutines.
func interleaved(b *testing.B, opts ...benchkit.Option) {
	libs := []benchkit.Lib{rawLib("raw"), backendLib, fencelockLib}
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			benchkit.Interleaved(b, g, 64, libs, append(opts, benchkit.Rate("ops/s"))...)
		})
	}
}

// BenchmarkUncontended: acquire+release of distinct, fresh keys by 1 and
// by 16 goroutines: the raw upsert+delete, the backend alone, and the
// whole fencelock client (lease, timers, renewal scheduling).
func BenchmarkUncontended(b *testing.B) { interleaved(b, benchkit.FreshKeys()) }

// BenchmarkReacquire: one goroutine per worker acquires and releases its
// own key over and over (for fencelock the row already exists; raw
// deletes and re-inserts).
func BenchmarkReacquire(b *testing.B) { interleaved(b) }

// BenchmarkScale: one client (fencelock.OpenBackend of the URL a user
// would write, its defaults: TTL 15s, renewal every 5s) holds 1,000 and
// 10,000 leases for three renewal intervals, and reports the renewal
// round trips per interval, the client's and the server's CPU, and that
// no lease was lost. Run it with -benchtime 1x.
func BenchmarkScale(b *testing.B) {
	benchkit.Scale(b, []int{1000, 10000}, 3, func(b *testing.B) (driver.Backend, *fencelock.Options) {
		be, o, err := fencelock.OpenBackend(context.Background(), fencelockURL(b))
		if err != nil {
			b.Fatal(err)
		}
		return be, o
	}, benchkit.ServerCPU(benchkit.TestenvCPU("mysql")))
}
