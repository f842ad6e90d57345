// Package bench compares fencelock's PostgreSQL backend with the raw
// statements it is built on, against a real server (FENCELOCK_TEST_POSTGRES).
//
//	go test -run '^$' -bench . -benchtime 3s ./bench/postgres
//	FENCELOCK_BENCH_ASYNC_COMMIT=1 go test …   (synchronous_commit=off on every connection)
//
// Uncontended: acquire+release of a fresh lock by one goroutine, and by 16
// goroutines on distinct keys; Reacquire: each goroutine re-takes its own
// key. Both interleave the raw statements, the backend alone and the
// fencelock client in rounds of 64 operations each (b.N rounds), so all
// three see the same background load, and report each one's ops/s and its
// ratio to raw. Contended: 8
// clients (each with its own backend, as 8 processes would have) take
// turns on one key; reported as handoffs/s with the p50/p99/max wait of an
// acquisition, plus the client CPU and the server transactions spent per
// handoff, against 8 goroutines spinning on the raw upsert (the no-backoff
// ceiling).
//
// fencelock is opened as a user of URLs gets it: fencelock.Open(ctx, URL,
// nil) with the test server's URL and only table= added (a fresh table per
// run), so its pools and TTL are the defaults. The raw statements run on a
// pool of 16 connections, one per goroutine of the widest run: the server's
// limit, not pgx's default pool's.
//
// pglock is cirello.io/pglock with its defaults (20 s lease, heartbeat
// every 5 s, a row per lock, released by deleting it) on the driver it
// requires (lib/pq), a database/sql pool with as many connections as
// raw's. Its
// "record version number" is a value of a sequence that CYCLEs, checked
// by pglock's own statements only: nothing a resource could use as a
// fencing token (no order it promises across holders).
//
// With 16 goroutines the run also counts, untimed, per grant: the round
// trips of each library (benchkit.Counted, through a counting proxy) and
// the WAL the server wrote for them, from pg_stat_wal: wal_sync (the
// flushes to disk: what group commit saves) and wal_records.
// FENCELOCK_BENCH_POSTGRES, if set, names the server instead of
// FENCELOCK_TEST_POSTGRES.
package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"cirello.io/pglock"
	_ "github.com/lib/pq"
)

// ttl is the backend-only lease's TTL: fencelock's default, which the
// clients get from the URL.
const ttl = 15 * time.Second

func dsn(b *testing.B) string {
	u := benchkit.ServerURL(b, "FENCELOCK_BENCH_POSTGRES", "FENCELOCK_TEST_POSTGRES")
	if os.Getenv("FENCELOCK_BENCH_ASYNC_COMMIT") != "" {
		// Every connection, raw and fencelock alike, commits without
		// waiting for the WAL flush: measures statement and engine cost
		// instead of the disk.
		u = withParam(u, "synchronous_commit=off")
	}
	return u
}

func withParam(u, param string) string {
	if strings.Contains(u, "?") {
		return u + "&" + param
	}
	return u + "?" + param
}

// pool opens a pool on the server with pgx's defaults, closed when b ends
// (for set-up and the counters).
func pool(b *testing.B) *pgxpool.Pool { return poolOf(b, dsn(b)) }

func poolOf(b *testing.B, dsn string) *pgxpool.Pool {
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	return p
}

// The raw statements: the limit a lock built on an upsert can reach.
const (
	rawTable = `CREATE SEQUENCE %[1]s_seq;
CREATE TABLE %[1]s (key text COLLATE "C" PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL,
  locked_at timestamptz NOT NULL, expires_at timestamptz NOT NULL, CHECK (expires_at >= locked_at)) WITH (fillfactor = 70)`
	rawAcquire = `INSERT INTO %[1]s AS l (key, owner, token, locked_at, expires_at)
  VALUES ($1, $2, nextval('%[1]s_seq'), now(), now() + interval '15 seconds')
  ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token,
    locked_at = EXCLUDED.locked_at, expires_at = EXCLUDED.expires_at
  WHERE l.expires_at <= now()
  RETURNING token`
	rawRelease = `DELETE FROM %[1]s WHERE key = $1 AND owner = $2 AND token = $3`
)

// rawConns is the raw statements' pool size: one connection for each of
// the 16 goroutines of the widest run, so that raw is the server's limit,
// not a pool's.
const rawConns = 16

// rawLib runs the raw statements on a table of the same shape as
// fencelock's, on a pool of rawConns connections; waiting spins on the
// upsert with no pause (the ceiling).
func rawLib(name string) benchkit.Lib {
	return benchkit.Lib{Name: name, Setup: func(b *testing.B) benchkit.Lockers {
		ctx := context.Background()
		p := poolOf(b, withParam(dsn(b), "pool_max_conns="+strconv.Itoa(rawConns)))
		table := "bench_raw_" + benchkit.RandomHex()
		if _, err := p.Exec(ctx, fmt.Sprintf(rawTable, table)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			p.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %[1]s; DROP SEQUENCE IF EXISTS %[1]s_seq`, table))
		})
		acquire, release := fmt.Sprintf(rawAcquire, table), fmt.Sprintf(rawRelease, table)
		return func(i int) (try, wait benchkit.LockFunc) {
			owner := "raw-" + strconv.Itoa(i)
			try = func(ctx context.Context, key string) (func() error, error) {
				var tok int64
				err := p.QueryRow(ctx, acquire, key, owner).Scan(&tok)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil, benchkit.ErrHeld
				}
				if err != nil {
					return nil, err
				}
				return func() error { _, err := p.Exec(ctx, release, key, owner, tok); return err }, nil
			}
			return try, benchkit.Poll(try, 0, 0)
		}
	}}
}

// fencelockDSN returns the URL a user would write for a fresh fencelock
// table (the test server's URL plus table=), dropped when b ends. Nothing
// else is tuned: pools, TTL and renewal are the URL's defaults.
func fencelockDSN(b *testing.B) string {
	p := pool(b)
	table := "bench_" + benchkit.RandomHex()
	b.Cleanup(func() {
		p.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %[1]s; DROP SEQUENCE IF EXISTS %[1]s_token_seq`, table))
	})
	return withParam(dsn(b), "table="+table)
}

// backendLib is the backend's Acquire and Release (fencelock.OpenBackend
// of the same URL), one backend (and pool) shared by the goroutines.
var backendLib = benchkit.BackendLib("backend", true, ttl, func(b *testing.B) func() (driver.Backend, error) {
	d := fencelockDSN(b)
	return func() (driver.Backend, error) {
		be, _, err := fencelock.OpenBackend(context.Background(), d)
		return be, err
	}
})

// fencelockLib is the fencelock client as a URL user gets it,
// fencelock.Open(ctx, URL, nil): shared, or one per goroutine, each with
// its own backend, pools and LISTEN connection, as separate processes
// would have.
func fencelockLib(name string, shared bool) benchkit.Lib {
	return benchkit.FencelockLib(name, shared, func(b *testing.B) func() (*fencelock.Client, error) {
		d := fencelockDSN(b)
		return func() (*fencelock.Client, error) { return fencelock.Open(context.Background(), d, nil) }
	})
}

// noCoalesceLib is the fencelock client on the same URL with
// coalesce=off: every acquire and release alone, as before coalescing, in
// the same run (the lone caller's latency and the batching's gain).
var noCoalesceLib = benchkit.FencelockLib("fencelock-nocoalesce", true, func(b *testing.B) func() (*fencelock.Client, error) {
	d := withParam(fencelockDSN(b), "coalesce=off")
	return func() (*fencelock.Client, error) { return fencelock.Open(context.Background(), d, nil) }
})

// pglockLib is cirello.io/pglock with its defaults on a table of its own
// shape (pglock's CreateTable), on lib/pq (pglock.New refuses other
// drivers) and a database/sql pool of rawConns
// connections (database/sql keeps only 2 idle by default, so 16
// goroutines would open and close connections all the time): try is
// FailIfLocked, wait pglock's own (it sleeps the lease duration between
// attempts).
var pglockLib = benchkit.Lib{Name: "pglock", Setup: func(b *testing.B) benchkit.Lockers {
	db, err := sql.Open("postgres", dsn(b))
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(rawConns)
	db.SetMaxIdleConns(rawConns)
	b.Cleanup(func() { db.Close() })
	c, err := pglock.New(db, pglock.WithCustomTable("bench_pglock_"+benchkit.RandomHex()))
	if err != nil {
		b.Fatal(err)
	}
	if err := c.CreateTable(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.DropTable() })
	lock := func(opts ...pglock.LockOption) benchkit.LockFunc {
		return func(ctx context.Context, key string) (func() error, error) {
			l, err := c.AcquireContext(ctx, key, opts...)
			if errors.Is(err, pglock.ErrNotAcquired) {
				return nil, benchkit.ErrHeld
			}
			if err != nil {
				return nil, err
			}
			return func() error { return c.ReleaseContext(context.Background(), l) }, nil
		}
	}
	return benchkit.Same(lock(pglock.FailIfLocked()), lock())
}}

// walCounters are pg_stat_wal's wal_sync and wal_records, read on p (a
// pool on the server itself, not through the counting proxy). A backend
// adds its counts to the view at a transaction's end at most once a
// second, and an idle one only after PGSTAT_IDLE_INTERVAL (10 s), so the
// first counter's read waits at least 11 s and for both to settle (else
// one library's last counts land in the next one's), and the second
// returns what that read saw (benchkit reads counters in their order).
func walCounters(p *pgxpool.Pool) []benchkit.Counter {
	var records int64
	syncs := benchkit.Settled(func() (float64, error) {
		var s int64
		err := p.QueryRow(context.Background(), "SELECT wal_sync, wal_records FROM pg_stat_wal").Scan(&s, &records)
		return float64(s) + float64(records)/(1<<40), err // settled when both are
	}, 400*time.Millisecond, 11*time.Second, 20*time.Second)
	return []benchkit.Counter{
		{Name: "wal-syncs", Read: func() (float64, error) { v, err := syncs(); return float64(int64(v)), err }},
		{Name: "wal-records", Read: func() (float64, error) { return float64(records), nil }},
	}
}

// countedGrants is how many acquire+release cycles the untimed counting
// pass of the 16-goroutine workload runs per library.
const countedGrants = 640

// interleaved runs the raw statements, the backend alone, the fencelock
// client, the same with coalescing off and pglock in turns of 64
// acquire+release, by 1 and by 16 goroutines; with 16 it also counts round
// trips and WAL per grant (benchkit.Counted).
func interleaved(b *testing.B, opts ...benchkit.Option) {
	libs := []benchkit.Lib{rawLib("raw"), backendLib, fencelockLib("fencelock", true), noCoalesceLib, pglockLib}
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			o := append(slices.Clip(opts), benchkit.Rate("ops/s"))
			if g > 1 {
				direct := dsn(b)
				route := func(*testing.B) benchkit.Route {
					return benchkit.Route{Var: "FENCELOCK_BENCH_POSTGRES", URL: direct}
				}
				o = append(o, benchkit.Counted(countedGrants, route, walCounters(poolOf(b, direct))...))
			}
			benchkit.Interleaved(b, g, 64, libs, o...)
		})
	}
}

// BenchmarkUncontended: acquire+release of distinct, fresh keys by 1 and
// by 16 goroutines: the raw upsert+delete, the backend alone, and the
// whole fencelock client (lease, timers, renewal scheduling).
func BenchmarkUncontended(b *testing.B) { interleaved(b, benchkit.FreshKeys()) }

// BenchmarkReacquire: one goroutine per worker acquires and releases its
// own key over and over (for fencelock the row already exists: the ON
// CONFLICT path; raw deletes and re-inserts).
func BenchmarkReacquire(b *testing.B) { interleaved(b) }

// BenchmarkContended: 8 contenders on one key, b.N handoffs; every
// contender loops freely (a releaser may take the lock back) and the wait
// is one acquire call. raw-spin is the no-backoff ceiling: every contender
// retries at once; raw-notify waits for the release's NOTIFY (the store's
// best raw strategy without spinning). Beyond the waits and the CPU it
// reports the server transactions per handoff.
func BenchmarkContended(b *testing.B) {
	p := pool(b)
	xacts := func() (float64, error) {
		// pg_stat_database is updated lazily (on transaction end, flushed
		// at most every ~second): read it after a pause.
		time.Sleep(1100 * time.Millisecond)
		var n int64
		err := p.QueryRow(context.Background(), "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()").Scan(&n)
		return float64(n), err
	}
	benchkit.Contended(b, 8, []benchkit.Lib{rawLib("raw-spin"), rawNotifyLib("raw-notify"), fencelockLib("fencelock", false)},
		benchkit.Barging(), benchkit.Unit(time.Millisecond), benchkit.ServerCPU(benchkit.TestenvCPU("postgres")),
		benchkit.PerHandoff("server-xacts/handoff", xacts))
}
