package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
)

// DefaultMaxOpenConns returns the pool size that Open uses when the URL has
// no max_open_conns: max(16, 4 × GOMAXPROCS). A lock statement keeps its
// connection for a round trip and a commit's log flush, during which
// neither CPU is busy, so the pool is sized above the CPU count. Call it to
// size a pool of your own for New.
func DefaultMaxOpenConns() int { return max(16, 4*runtime.GOMAXPROCS(0)) }

// Backend is a fencelock backend on a MySQL or MariaDB InnoDB table. It
// implements driver.Backend and the optional driver.BatchRenewer,
// driver.ForceReleaser, driver.TokenFloorer, driver.Guarantor and
// driver.Describer. It is safe for concurrent use.
type Backend struct {
	db       *sql.DB
	owned    bool // Close closes db (Open made it)
	n        names
	q        queries
	server   string // "MariaDB 10.11.6" or "MySQL 8.0.36"
	warnings []string
	closed   atomic.Bool
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// New returns a Backend on a pool the caller owns: Close never closes db.
// Unless opts.SkipCreate is set it creates the tables and procedures that
// are missing or outdated; otherwise it checks that they exist. It refuses
// a lock table that is not InnoDB (no row locks, no transactions). A nil
// opts means defaults.
//
// Give the pool's DSN interpolateParams=true (one round trip per
// statement instead of a prepare, an execute and a close), as Open does.
func New(ctx context.Context, db *sql.DB, opts *Options) (*Backend, error) {
	if db == nil {
		return nil, &driver.InvalidOptionError{Option: "db", Value: "nil", Reason: "a *sql.DB (driver github.com/go-sql-driver/mysql) is required"}
	}
	n, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	b := &Backend{db: db, n: n, q: buildQueries(n)}
	if err := b.setup(ctx, !o.SkipCreate); err != nil {
		return nil, err
	}
	return b, nil
}

// setup creates or checks the tables and procedures, and reads the server
// settings that weaken the guarantees.
func (b *Backend) setup(ctx context.Context, create bool) error {
	var (
		version, comment, charset string
		autocommit                int
	)
	if err := b.db.QueryRowContext(ctx, "SELECT VERSION(), @@version_comment, @@autocommit, @@character_set_client").
		Scan(&version, &comment, &autocommit, &charset); err != nil {
		return err
	}
	b.server = serverName(version, comment)
	if err := checkSession(autocommit, charset); err != nil {
		return err
	}
	ok, why, err := b.current(ctx)
	if err != nil {
		return err
	}
	if !ok {
		if !create {
			return fmt.Errorf("mysql: %s and SkipCreate is set: run the DDL from mysql.Schema(%q)", why, b.n.rawTable)
		}
		if err := b.createSchema(ctx); err != nil {
			return fmt.Errorf("mysql: creating %s: %w", b.n.rawTable, err)
		}
	}
	for _, t := range []string{b.n.rawTable, b.n.rawTokens} {
		engine, err := b.engineOf(ctx, t)
		if err != nil {
			return err
		}
		if !strings.EqualFold(engine, "InnoDB") {
			return &driver.InvalidOptionError{Option: "Table", Value: t,
				Reason: fmt.Sprintf("engine %s, not InnoDB: without row locks and transactions two owners could hold a key; run ALTER TABLE `%s` ENGINE = InnoDB", engine, t)}
		}
	}
	s, err := b.readSettings(ctx)
	if err != nil {
		return err
	}
	b.warnings = s.warnings()
	return nil
}

// unsafeCharsets are the client character sets in which a multibyte
// character can end in the byte of a backslash (0x5C): the driver's
// interpolated parameters escape a quote with a backslash, which such a
// character swallows, so a key could end its string literal early and
// the rest of it run as SQL. The driver refuses their collations with
// interpolateParams, but not a charset= or a session variable.
var unsafeCharsets = map[string]bool{"big5": true, "cp932": true, "gb2312": true, "gbk": true, "sjis": true, "gb18030": true}

// checkSession refuses a connection whose session settings break the
// statements: autocommit off (a renewal, release or token floor would
// report success without committing, and keep its row locked in an idle
// pooled connection) or a client character set unsafe for interpolated
// parameters. It runs before any DDL, so a refused Open stores nothing.
func checkSession(autocommit int, charset string) error {
	if autocommit != 1 {
		return &driver.InvalidOptionError{Option: "autocommit", Value: strconv.Itoa(autocommit),
			Reason: "the connection does not commit each statement, so a renewal, release or token floor would report success without committing and keep its row locked: remove autocommit=0 from the URL or DSN (or the server's init_connect), or set autocommit = 1 on the server"}
	}
	if unsafeCharsets[strings.ToLower(charset)] {
		return &driver.InvalidOptionError{Option: "charset", Value: charset,
			Reason: "a multibyte character set whose characters may end in a backslash byte makes interpolated parameters unsafe (a key could end its string literal early): use charset=utf8mb4; the lock tables' columns are binary, so the charset changes nothing fencelock stores"}
	}
	return nil
}

// serverName is "MariaDB 10.11.6" or "MySQL 8.0.36" from VERSION() and
// @@version_comment.
func serverName(version, comment string) string {
	v, _, _ := strings.Cut(version, "-")
	if strings.Contains(strings.ToLower(version+" "+comment), "mariadb") {
		return "MariaDB " + v
	}
	return "MySQL " + v
}

// current reports whether both tables exist and both procedures are of
// this version, and if not, what is missing.
func (b *Backend) current(ctx context.Context) (bool, string, error) {
	var tables int
	if err := b.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (?, ?)`, b.n.rawTable, b.n.rawTokens).Scan(&tables); err != nil {
		return false, "", err
	}
	if tables != 2 {
		return false, fmt.Sprintf("table %s or %s does not exist", b.n.rawTable, b.n.rawTokens), nil
	}
	var procs int
	if err := b.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.ROUTINES
  WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME IN (?, ?) AND ROUTINE_COMMENT = ?`,
		b.n.rawAcquire, b.n.rawRotate, "fencelock "+procVersion).Scan(&procs); err != nil {
		return false, "", err
	}
	if procs != 2 {
		return false, fmt.Sprintf("procedure %s or %s is missing or of another version (want %s)", b.n.rawAcquire, b.n.rawRotate, procVersion), nil
	}
	return true, "", nil
}

// createSchema runs the DDL on one connection, holding a named lock so
// that concurrent creators do not drop each other's procedures.
func (b *Backend) createSchema(ctx context.Context) error {
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	lock := "fencelock ddl " + b.n.rawTable
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 10)", lock).Scan(&got); err != nil {
		return err
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("another process held the DDL lock %q for 10s", lock)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(?)", lock)
	// Another process may have finished while this one waited.
	if ok, _, err := b.current(ctx); err != nil || ok {
		return err
	}
	for _, stmt := range b.n.statements() {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

func (b *Backend) engineOf(ctx context.Context, table string) (string, error) {
	var engine sql.NullString
	err := b.db.QueryRowContext(ctx, `SELECT ENGINE FROM information_schema.TABLES
  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, table).Scan(&engine)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("mysql: table %s does not exist", table)
	}
	if err != nil {
		return "", err
	}
	return engine.String, nil
}

// DB returns the pool (the caller's, for New).
func (b *Backend) DB() *sql.DB { return b.db }

// DDL returns the DDL for the tables and procedures this backend uses (see
// Schema).
func (b *Backend) DDL() string { return b.n.ddl() }

func (b *Backend) check(ctx context.Context) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return ctx.Err()
}

// MySQL's ER_DUP_ENTRY and ER_LOCK_DEADLOCK.
const (
	errDuplicate = 1062
	errDeadlock  = 1213
)

// acquireAgain reports whether an acquire that failed with err is asked
// again: the procedure's transaction was rolled back whole (nothing was
// taken, no token drawn), and the server's answer is to try again.
func acquireAgain(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == errDuplicate || me.Number == errDeadlock)
}

// acquireTries bounds how often Acquire asks again (see acquireAgain).
const acquireTries = 4

// Acquire implements driver.Backend with one call of the acquire
// procedure: one round trip, one transaction on the server, so a client
// that pauses or dies mid-call holds no row lock. Two first acquires of a
// new key race on its INSERT; the loser's duplicate-key error is answered
// by asking again, which finds the winner's row. Acquires lock a key's
// row and the token counter's, so InnoDB may end one of two concurrent
// acquires (or an acquire and another transaction on the table) as a
// deadlock's victim; it is asked again too, a few times at most.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	var (
		ok         bool
		tok        uint64
		owner      []byte
		rem, delay int64
	)
	args := []any{[]byte(req.Key), []byte(req.Owner), backendkit.Micros(req.TTL), backendkit.OrNil(req.Metadata), backendkit.Micros(req.LockDelay)}
	err := b.db.QueryRowContext(ctx, b.q.acquire, args...).Scan(&ok, &tok, &owner, &rem, &delay)
	for try := 1; try < acquireTries && acquireAgain(err) && ctx.Err() == nil; try++ {
		err = b.db.QueryRowContext(ctx, b.q.acquire, args...).Scan(&ok, &tok, &owner, &rem, &delay)
	}
	switch {
	case err != nil:
		return driver.Grant{}, err
	case !ok && delay > 0:
		return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Token: driver.Token(tok)}, LockDelay: backendkit.FromMicros(delay)}
	case !ok:
		return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Owner: string(owner), Token: driver.Token(tok), Remaining: backendkit.FromMicros(rem)}}
	}
	return driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(tok)}, nil
}

// Renew implements driver.Backend with one owner-, token- and
// expiry-checked UPDATE (never an upsert); with Rotate, one call of the
// rotate procedure, which draws the new token in the same transaction.
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	if req.Rotate {
		var tok uint64
		err := b.db.QueryRowContext(ctx, b.q.rotate, []byte(g.Key), []byte(g.Owner), uint64(g.Token), backendkit.Micros(req.TTL), req.SetMetadata, backendkit.OrNil(req.Metadata)).Scan(&tok)
		if err != nil {
			return driver.Grant{}, err
		}
		if tok == 0 {
			return driver.Grant{}, driver.ErrNotHeld
		}
		g.Token = driver.Token(tok)
		return g, nil
	}
	res, err := b.db.ExecContext(ctx, b.q.renew, backendkit.Micros(req.TTL), req.SetMetadata, backendkit.OrNil(req.Metadata), req.SetMetadata,
		[]byte(g.Key), []byte(g.Owner), uint64(g.Token))
	if err != nil {
		return driver.Grant{}, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return driver.Grant{}, err
	} else if n == 0 {
		return driver.Grant{}, driver.ErrNotHeld
	}
	return g, nil
}

// Release implements driver.Backend: it marks the row free (the row stays)
// with one owner-, token- and expiry-checked UPDATE.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	res, err := b.db.ExecContext(ctx, b.q.release, []byte(g.Key), []byte(g.Owner), uint64(g.Token))
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// ForceRelease implements driver.ForceReleaser: it frees key whoever holds
// it. The holder is read first and the row freed only if it still has
// that holder's token, so the Info returned is the holder that was
// removed. The holder finds out at its next renewal.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Owner == "" {
		return driver.Info{Key: key}, err
	}
	res, err := b.db.ExecContext(ctx, b.q.release, []byte(key), []byte(info.Owner), uint64(info.Token))
	if err != nil {
		return driver.Info{}, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return driver.Info{}, err
	} else if n == 0 {
		// Released, expired or taken over since: nobody was removed by
		// this call.
		return driver.Info{Key: key}, nil
	}
	info.Metadata = nil
	return info, nil
}

// Inspect implements driver.Backend. Remaining is computed by the server.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	var (
		owner, md []byte
		tok       uint64
		rem       int64
	)
	err := b.db.QueryRowContext(ctx, b.q.inspect, []byte(key)).Scan(&owner, &tok, &rem, &md)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.Info{Key: key}, nil
	}
	if err != nil {
		return driver.Info{}, err
	}
	return driver.Info{Key: key, Owner: string(owner), Token: driver.Token(tok), Remaining: backendkit.FromMicros(rem), Metadata: backendkit.OrNil(md)}, nil
}

// likePrefix is a LIKE pattern (escape character '!') for the keys that
// start with prefix.
func likePrefix(prefix string) []byte {
	r := strings.NewReplacer("!", "!!", "%", "!%", "_", "!_")
	return []byte(r.Replace(prefix) + "%")
}

// List implements driver.Backend. Keys come back in byte order.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	rows, err := b.db.QueryContext(ctx, b.q.list, likePrefix(prefix))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []driver.Info
	for rows.Next() {
		var (
			key, owner, md []byte
			tok            uint64
			rem            int64
		)
		if err := rows.Scan(&key, &owner, &tok, &rem, &md); err != nil {
			return nil, err
		}
		out = append(out, driver.Info{Key: string(key), Owner: string(owner), Token: driver.Token(tok), Remaining: backendkit.FromMicros(rem), Metadata: backendkit.OrNil(md)})
	}
	return out, rows.Err()
}

// MinSweepAge is the smallest age Sweep accepts.
const MinSweepAge = time.Minute

// Sweep deletes rows that have been free (expired or released) for longer
// than olderThan, and returns how many it deleted. Tokens stay monotonic:
// they come from the counter table, which Sweep does not touch. olderThan
// must be at least MinSweepAge. Run it from a periodic job (the backend
// starts no timers of its own). With a lock delay, keep olderThan above
// the longest delay the clients use: a swept row's unreleased end is
// forgotten, and with it the rest of its delay.
func (b *Backend) Sweep(ctx context.Context, olderThan time.Duration) (int64, error) {
	if err := b.check(ctx); err != nil {
		return 0, err
	}
	if olderThan < MinSweepAge {
		return 0, &driver.InvalidOptionError{Option: "Sweep age", Value: olderThan.String(), Reason: "must be at least " + MinSweepAge.String()}
	}
	res, err := b.db.ExecContext(ctx, b.q.sweep, backendkit.Micros(olderThan))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Describe implements driver.Describer.
func (b *Backend) Describe() driver.Description {
	return driver.Description{
		Name:          "mysql",
		Fencing:       "one counter row per table (" + b.n.rawTokens + "), drawn in the grant's own InnoDB transaction; never reset by release, expiry or sweeping, durable across restarts with innodb_flush_log_at_trx_commit=1 (and sync_binlog=1 with a binary log)",
		Clock:         "server (UTC_TIMESTAMP(6) of " + b.server + ")",
		Liveness:      "TTL (expires_at, judged by the server's clock)",
		Scope:         driver.ScopeStore,
		Failover:      "durable on one server; a replica promoted after asynchronous (or semi-synchronous that fell back to asynchronous) replication may lack the latest grants and counter values",
		LossDetection: driver.LossByRenewal,
		Warnings:      append([]string(nil), b.warnings...),
	}
}

// Close closes the pool that Open created. It never closes a pool passed
// to New. It does not release locks: the engine does that first.
func (b *Backend) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	if b.owned {
		return b.db.Close()
	}
	return nil
}
