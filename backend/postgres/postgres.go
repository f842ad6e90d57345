package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultRenewPoolConns is the size of the renewal pool that Open creates
// (URL parameter renew_pool_max_conns).
const DefaultRenewPoolConns = 2

// DefaultPoolMaxConns returns the main pool's size that Open uses when the
// URL has no pool_max_conns: max(16, 4 × GOMAXPROCS), where pgx's own
// default is max(4, NumCPU).
//
// pgx sizes its default for CPU-bound work. A lock statement is not: its
// connection is busy for a whole round trip plus the server's commit (a WAL
// flush with synchronous_commit on), during which neither the client nor
// the server's CPU is the limit; concurrent commits also share one flush
// (group commit). With 16 goroutines on distinct keys and pgx's 4
// connections on 2 cores, fencelock reached 0.39× the raw statements'
// rate, queued on the pool (issue 20; see docs/performance.md). Connections are opened on
// demand (MinConns stays 0), so a process that takes few locks at a time
// opens few. Call it to size a pool of your own for New.
func DefaultPoolMaxConns() int32 {
	return int32(max(16, 4*runtime.GOMAXPROCS(0)))
}

// Backend is a fencelock backend on a PostgreSQL table. It implements
// driver.Backend and the optional driver.Watcher, driver.BatchRenewer,
// driver.ForceReleaser and driver.Describer. It is safe for concurrent use.
type Backend struct {
	pool      *pgxpool.Pool
	renewPool *pgxpool.Pool
	ownPools  []*pgxpool.Pool // closed by Close
	n         names
	q         queries
	warnings  []string
	// failoverSafe and failover are Describe's FailoverSafe and Failover
	// as the standbys were at Open (describeReplication); failover ""
	// means the default text.
	failoverSafe bool
	failover     string
	closed       atomic.Bool
	lis          *listener // nil when NoListen
	batches      coalescer
	rot          rotations
	held         heldHints
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.Watcher       = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// New returns a Backend on a pool the caller owns: Close never closes pool
// (or opts.RenewPool). Unless opts.SkipCreate is set it creates the table
// and sequence if they are missing; otherwise it checks that the table
// exists. A nil opts means defaults.
func New(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Backend, error) {
	if pool == nil {
		return nil, &driver.InvalidOptionError{Option: "pool", Value: "nil", Reason: "a *pgxpool.Pool is required"}
	}
	n, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	b := &Backend{pool: pool, renewPool: pool, n: n, q: buildQueries(n)}
	if o.RenewPool != nil {
		b.renewPool = o.RenewPool
	}
	if err := b.setup(ctx, !o.SkipCreate); err != nil {
		return nil, err
	}
	if !o.NoListen {
		cfg := o.ListenConfig
		if cfg == nil {
			cfg = pool.Config().ConnConfig
		}
		b.lis = newListener(cfg.Copy(), n)
	}
	return b, nil
}

// Open returns a Backend that owns its connections, from a PostgreSQL URL
// (postgres:// or postgresql://). Besides every connection parameter pgx
// understands (sslmode, pool_max_conns, application_name, …) the URL takes
// the ones below. Without pool_max_conns the main pool holds up to
// DefaultPoolMaxConns() connections (not pgx's default); besides it, a
// Backend has the renewal pool (renew_pool_max_conns, default 2, one kept
// idle) and one LISTEN connection.
//
//	schema=NAME               Options.Schema (default: search_path)
//	table=NAME                Options.Table (default fencelock_locks)
//	sequence=NAME             Options.Sequence
//	channel=NAME              Options.Channel
//	create_table=BOOL         false sets Options.SkipCreate (default true)
//	listen=BOOL               false sets Options.NoListen (default true)
//	listen_url=URL            a direct connection for LISTEN (URL-escaped)
//	renew_pool_max_conns=N    size of the dedicated renewal pool (default 2)
//
// A parameter that neither fencelock nor pgx knows is rejected (pgx sends
// unknown ones to the server as settings, which refuses unknown names).
// No credential from the URL (password, password= or sslpassword=
// parameters, listen_url's) appears in errors: see driver.RedactURL.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "cannot be parsed")
	}
	return OpenURL(ctx, u)
}

// OpenURL is Open for a parsed URL (scheme postgres or postgresql).
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	raw := u.String()
	scheme := strings.ToLower(u.Scheme)
	if scheme != "postgres" && scheme != "postgresql" {
		return nil, driver.InvalidURL(raw, "scheme must be postgres or postgresql")
	}
	if err := driver.CheckPorts(u); err != nil {
		return nil, err
	}
	p := driver.NewParams(u)
	o := Options{
		Schema:   p.String("schema", ""),
		Table:    p.String("table", ""),
		Sequence: p.String("sequence", ""),
		Channel:  p.String("channel", ""),
	}
	o.SkipCreate = !p.Bool("create_table", true)
	o.NoListen = !p.Bool("listen", true)
	listenURL := p.String("listen_url", "")
	renewConns := p.Int("renew_pool_max_conns", DefaultRenewPoolConns)
	rest := p.Rest()
	if err := p.Err(); err != nil {
		return nil, err
	}
	if renewConns < 0 {
		return nil, &driver.InvalidOptionError{Option: "URL parameter \"renew_pool_max_conns\"", Value: strconv.Itoa(renewConns), Reason: "must be 0 (share the main pool) or positive"}
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	u2 := *u
	u2.Scheme = "postgres"
	u2.RawQuery = rest.Encode()
	redacted := driver.RedactURL(raw)
	cfg, err := pgxpool.ParseConfig(u2.String())
	if err != nil {
		return nil, &driver.InvalidOptionError{Option: "URL", Value: redacted, Reason: "rejected by pgx: " + driver.RedactText(err.Error(), raw)}
	}
	if !rest.Has("pool_max_conns") {
		cfg.MaxConns = DefaultPoolMaxConns()
	}
	cfg.ConnConfig.BuildContextWatcherHandler = CancelRequestHandler
	if listenURL != "" {
		if _, err := url.Parse(listenURL); err != nil {
			return nil, &driver.InvalidOptionError{Option: "URL parameter \"listen_url\"", Value: driver.RedactURL(listenURL), Reason: "cannot be parsed"}
		}
		lc, err := pgx.ParseConfig(listenURL)
		if err != nil {
			return nil, &driver.InvalidOptionError{Option: "URL parameter \"listen_url\"", Value: driver.RedactURL(listenURL), Reason: "rejected by pgx: " + driver.RedactText(err.Error(), listenURL)}
		}
		o.ListenConfig = lc
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s: %w", redacted, driver.RedactError(err, raw))
	}
	b, err := New(ctx, pool, &o)
	if err != nil {
		pool.Close()
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42704" && strings.Contains(pe.Message, "configuration parameter") {
			return nil, &driver.InvalidOptionError{Option: "URL parameter", Value: redacted, Reason: "unknown to fencelock, pgx and the server: " + driver.RedactText(pe.Message, raw)}
		}
		return nil, fmt.Errorf("postgres: %s: %w", redacted, driver.RedactError(err, raw))
	}
	b.ownPools = []*pgxpool.Pool{pool}
	if renewConns > 0 {
		// Created once the table exists: its connections prepare the
		// renewal statements as they connect.
		rp, err := b.openRenewPool(ctx, cfg, int32(renewConns))
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("postgres: %s: %w", redacted, driver.RedactError(err, raw))
		}
		b.renewPool = rp
		b.ownPools = append(b.ownPools, rp)
	}
	return b, nil
}

// openRenewPool creates the renewal pool that Open owns. A renewal must
// never wait for a connection to be established: on a loaded server a
// fresh connection's first statement (a new server process, its catalog
// caches cold, the statement parsed) costs several times a warm one, and
// a lease's first renewal, or the first after a connection was dropped,
// would pay for it out of the lease's validity. So the pool keeps one
// connection idle at all times (pgxpool creates it in the background at
// once, and again whenever one is taken or lost), and every connection
// prepares the renewal statements before the pool hands it out.
func (b *Backend) openRenewPool(ctx context.Context, cfg *pgxpool.Config, conns int32) (*pgxpool.Pool, error) {
	rc := cfg.Copy()
	rc.MaxConns = conns
	rc.MinConns = 0
	rc.MinIdleConns = 1
	// A renewal past its deadline is abandoned at once (dropping the
	// socket): the lease is over locally anyway, and waiting for the
	// server's answer would delay the renewals queued behind it.
	rc.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	after := rc.AfterConnect
	rc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, c); err != nil {
				return err
			}
		}
		// Named by their SQL, so Query and QueryRow use them.
		for _, sql := range []string{b.q.renew, b.q.renewBatch} {
			if _, err := c.Prepare(ctx, sql, sql); err != nil {
				return err
			}
		}
		return nil
	}
	return pgxpool.NewWithConfig(ctx, rc)
}

// CancelRequestHandler is the pgconn context-watcher handler that Open
// configures, and that callers of New are advised to set on their pool's
// ConnConfig.BuildContextWatcherHandler. When a context ends during a
// statement it asks the server to cancel the statement and waits (up to
// cancelWait) for the server's answer, instead of pgx's default of closing
// the socket at once. With the default, a statement already sent may still
// run on the server after the call has returned the context's error, so an
// acquire abandoned by a cancelled waiter could take the lock after the
// engine's clean-up had looked for it (the record then lives until its
// TTL).
func CancelRequestHandler(pc *pgconn.PgConn) ctxwatch.Handler {
	return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: cancelWait}
}

// cancelWait is how long a statement whose context ended waits for the
// server to answer the cancel request before its socket is closed: a
// server that answers at all answers a cancel in milliseconds, and a
// stopped one must not hold every call (and its clean-up) past its bound
// for long. It is part of the small overrun a call may have after its
// deadline (docs/design.md, Bounds).
const cancelWait = 250 * time.Millisecond

// setup creates or checks the table and reads the server settings that
// weaken the guarantees.
func (b *Backend) setup(ctx context.Context, create bool) error {
	var exists bool
	if err := b.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL", b.n.table, b.n.seq).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if !create {
			return fmt.Errorf("postgres: table %s or sequence %s does not exist and SkipCreate is set: run the DDL from postgres.Schema", b.n.table, b.n.seq)
		}
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			// Concurrent CREATE … IF NOT EXISTS can fail with a unique
			// violation in the catalog: serialise creators.
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('fencelock ddl'))"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, b.n.ddl())
			return err
		}); err != nil {
			return fmt.Errorf("postgres: creating %s: %w", b.n.table, err)
		}
	} else if err := b.migrate(ctx, create); err != nil {
		return err
	}
	var fsync, syncCommit string
	if err := b.pool.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &syncCommit); err != nil {
		return err
	}
	if fsync == "off" {
		b.warnings = append(b.warnings, "fsync=off: a server crash can lose committed locks and sequence values; tokens may repeat after a crash")
	}
	if syncCommit == "off" {
		b.warnings = append(b.warnings, "synchronous_commit=off: a server crash can lose the last acknowledged acquisitions and their tokens; tokens may repeat after a crash")
	}
	return b.describeReplication(ctx, fsync, syncCommit)
}

// describeReplication reads the primary's standbys (pg_stat_replication)
// for Describe: FailoverSafe when every standby is synchronous and commits
// wait for it, a warning for each asynchronous one (judgeReplication).
func (b *Backend) describeReplication(ctx context.Context, fsync, syncCommit string) error {
	var standbys string
	if err := b.pool.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&standbys); err != nil {
		return err
	}
	reps, err := readStandbys(ctx, b.pool)
	if err != nil {
		return err
	}
	r := judgeReplication(fsync, syncCommit, standbys, reps)
	b.warnings = append(b.warnings, r.warnings...)
	b.failoverSafe = r.met
	if r.met {
		b.failover = "durable on one server, and on every standby before a commit returns: " + r.observed
	} else if len(reps) > 0 {
		b.failover = "a standby promoted after a failover may lack the latest grants and sequence values: " + r.observed
	}
	return nil
}

// metadataColumns are the columns added after the first version of the
// table (by the ALTER TABLE at the end of schema.sql).
var metadataColumns = []string{"metadata", "metadata_owner"}

// migrate adds the metadata columns to a table created before they
// existed. It looks first and alters only when a column is missing, since
// ALTER TABLE takes the table's ACCESS EXCLUSIVE lock even when it changes
// nothing; that lock is waited for at most 10s (lock_timeout), so a long
// transaction on the table makes Open fail rather than stall every lock
// operation queued behind the ALTER. With SkipCreate a missing column is an
// error naming the DDL to run.
func (b *Backend) migrate(ctx context.Context, create bool) error {
	var have int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute
  WHERE attrelid = to_regclass($1) AND attname = ANY($2) AND NOT attisdropped`, b.n.table, metadataColumns).Scan(&have); err != nil {
		return err
	}
	if have == len(metadataColumns) {
		return nil
	}
	if !create {
		return fmt.Errorf("postgres: table %s lacks the metadata columns (%s) and SkipCreate is set: run the DDL from postgres.Schema (its ALTER TABLE … ADD COLUMN IF NOT EXISTS adds them)", b.n.table, strings.Join(metadataColumns, ", "))
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('fencelock ddl'))"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, b.n.migration())
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: adding the metadata columns to %s: %w", b.n.table, err)
	}
	return nil
}

// Pool returns the main pool (the caller's, for New).
func (b *Backend) Pool() *pgxpool.Pool { return b.pool }

// DDL returns the DDL for the table and sequence this backend uses.
func (b *Backend) DDL() string { return b.n.ddl() }

func (b *Backend) check(ctx context.Context) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return ctx.Err()
}

// Acquire implements driver.Backend with an upsert that takes a free
// (expired or released) row or re-grants the same owner, and otherwise
// reports the holder, in one statement: acquireFree, unless this Backend's
// last attempt on the key found it held, then acquire (see heldHints). An
// answer of acquire's that the key is held but that it could not mark the
// row is asked again with acquireFree.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	var (
		ok, marked bool
		tok        int64
		owner      string
		rem, delay int64
	)
	args := []any{req.Key, req.Owner, backendkit.Micros(req.TTL), backendkit.OrNil(req.Metadata), backendkit.Micros(req.LockDelay)}
	q := b.q.acquireFree
	if b.held.has(req.Key) {
		q = b.q.acquire
	}
	err := b.pool.QueryRow(ctx, q, args...).Scan(&ok, &tok, &owner, &rem, &marked, &delay)
	if err == nil && !ok && !marked {
		// acquire found the key held at its snapshot, but the row changed
		// before it could be marked contended: a release that committed in
		// between sent no NOTIFY, so this answer would leave a waiter
		// asleep. acquireFree takes the row or marks it, under its lock.
		err = b.pool.QueryRow(ctx, b.q.acquireFree, args...).Scan(&ok, &tok, &owner, &rem, &marked, &delay)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Held, but the holder committed after this statement's snapshot.
		b.held.note(req.Key, true)
		return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
	case err != nil:
		return driver.Grant{}, err
	case !ok && delay > 0:
		// Ended without a release, less than the lock delay ago.
		b.held.note(req.Key, true)
		return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Token: driver.Token(tok)}, LockDelay: backendkit.FromMicros(delay)}
	case !ok:
		b.held.note(req.Key, true)
		return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Owner: owner, Token: driver.Token(tok), Remaining: backendkit.FromMicros(rem)}}
	}
	b.held.note(req.Key, false)
	return driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(tok)}, nil
}

// Renew implements driver.Backend with one owner- and token-checked UPDATE
// (never an upsert). With Rotate the token is taken from the sequence; with
// SetMetadata the same UPDATE replaces the metadata.
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	var tok int64
	cur := b.rot.current(g)
	err := b.renewPool.QueryRow(ctx, b.q.renew, cur.Key, cur.Owner, int64(cur.Token), backendkit.Micros(req.TTL), req.Rotate, req.SetMetadata, backendkit.OrNil(req.Metadata)).Scan(&tok)
	if errors.Is(err, pgx.ErrNoRows) {
		b.rot.forget(g)
		return driver.Grant{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Grant{}, err
	}
	b.rot.forget(g)
	g.Token = driver.Token(tok)
	return g, nil
}

// renewBatchOnce renews grants with one UPDATE … FROM unnest(…); a grant
// missing from the result is ErrNotHeld. A grant whose rotation its caller
// never saw is sent with the token its record has (see rotations).
func (b *Backend) renewBatchOnce(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	keys := make([]string, len(grants))
	owners := make([]string, len(grants))
	tokens := make([]int64, len(grants))
	for i, g := range grants {
		g = b.rot.current(g)
		keys[i], owners[i], tokens[i] = g.Key, g.Owner, int64(g.Token)
	}
	rows, err := b.renewPool.Query(ctx, b.q.renewBatch, keys, owners, tokens, backendkit.Micros(req.TTL), req.Rotate)
	if err != nil {
		return nil, err
	}
	got := make(map[grantID]int64, len(grants))
	var (
		key, owner    string
		oldTok, token int64
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &owner, &oldTok, &token}, func() error {
		got[grantID{key, owner, oldTok}] = token
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]driver.RenewResult, len(grants))
	for i, g := range grants {
		if t, ok := got[grantID{keys[i], owners[i], tokens[i]}]; ok {
			g.Token = driver.Token(t)
			out[i].Grant = g
		} else {
			out[i].Err = driver.ErrNotHeld
		}
	}
	return out, nil
}

// Release implements driver.Backend: it marks the row free (the row stays,
// so the next acquirer's token is drawn under the row's lock) and notifies
// waiters in the same statement.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	cur := b.rot.current(g)
	tag, err := b.pool.Exec(ctx, b.q.release, cur.Key, cur.Owner, int64(cur.Token), b.n.channel)
	if err != nil {
		return err
	}
	b.rot.forget(g)
	if tag.RowsAffected() == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// ForceRelease implements driver.ForceReleaser: it frees key whoever holds
// it and notifies waiters. The holder finds out at its next renewal.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	var (
		owner string
		tok   int64
		rem   int64
	)
	err := b.pool.QueryRow(ctx, b.q.forceRelease, key, b.n.channel).Scan(&owner, &tok, &rem, nil)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Info{Key: key}, nil
	}
	if err != nil {
		return driver.Info{}, err
	}
	return driver.Info{Key: key, Owner: owner, Token: driver.Token(tok), Remaining: backendkit.FromMicros(rem)}, nil
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
		owner string
		tok   int64
		rem   int64
		md    []byte
	)
	err := b.pool.QueryRow(ctx, b.q.inspect, key).Scan(&owner, &tok, &rem, &md)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Info{Key: key}, nil
	}
	if err != nil {
		return driver.Info{}, err
	}
	return driver.Info{Key: key, Owner: owner, Token: driver.Token(tok), Remaining: backendkit.FromMicros(rem), Metadata: backendkit.OrNil(md)}, nil
}

// List implements driver.Backend. Keys come back in byte order.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	rows, err := b.pool.Query(ctx, b.q.list, prefix)
	if err != nil {
		return nil, err
	}
	var (
		out        []driver.Info
		key, owner string
		tok, rem   int64
		md         []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &owner, &tok, &rem, &md}, func() error {
		out = append(out, driver.Info{Key: key, Owner: owner, Token: driver.Token(tok), Remaining: backendkit.FromMicros(rem), Metadata: backendkit.OrNil(md)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MinSweepAge is the smallest age Sweep accepts. See Sweep.
const MinSweepAge = time.Minute

// Sweep deletes rows that have been free (expired or released) for longer
// than olderThan, and returns how many it deleted. Tokens stay monotonic:
// they come from the sequence, which Sweep does not touch. olderThan must be
// at least MinSweepAge: a row is what orders a new holder's token after its
// predecessor's, so a row is kept long enough that no acquire statement
// still in flight can have drawn its token before the swept holder's.
// Run it from a periodic job (the backend starts no timers of its own).
// With a lock delay (driver.AcquireRequest.LockDelay), keep olderThan
// above the longest delay the clients use: a swept row's unreleased end
// is forgotten, and with it the rest of its delay.
func (b *Backend) Sweep(ctx context.Context, olderThan time.Duration) (int64, error) {
	if err := b.check(ctx); err != nil {
		return 0, err
	}
	if olderThan < MinSweepAge {
		return 0, &driver.InvalidOptionError{Option: "Sweep age", Value: olderThan.String(), Reason: "must be at least " + MinSweepAge.String()}
	}
	tag, err := b.pool.Exec(ctx, b.q.sweep, backendkit.Micros(olderThan))
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// Describe implements driver.Describer.
func (b *Backend) Describe() driver.Description {
	return driver.Description{
		Name:          "postgres",
		Fencing:       "global bigint sequence " + b.n.seq + ", drawn under the key's row lock; never reset by release, expiry or sweeping, durable across restarts (may skip ahead after a crash, never back)",
		Clock:         "server (now() of each statement)",
		Liveness:      "TTL (expires_at, judged by the server's clock)",
		Scope:         driver.ScopeStore,
		FailoverSafe:  b.failoverSafe,
		Failover:      cmp.Or(b.failover, "durable on one server (fsync and synchronous_commit on); a streaming replica promoted after asynchronous replication may lack the latest grants and sequence values"),
		LossDetection: driver.LossByRenewal,
		Warnings:      append([]string(nil), b.warnings...),
	}
}

// Close stops the LISTEN connection and closes the pools that Open
// created. It never closes a pool passed to New. It does not release
// locks: the engine does that first.
func (b *Backend) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	if b.lis != nil {
		b.lis.close()
	}
	var wg sync.WaitGroup
	for _, p := range b.ownPools {
		wg.Add(1)
		go func() { defer wg.Done(); p.Close() }()
	}
	wg.Wait()
	return nil
}
