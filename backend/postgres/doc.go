// Package postgres is fencelock's PostgreSQL backend, on
// github.com/jackc/pgx/v5 (pgxpool).
//
// Importing it registers the postgres:// and postgresql:// URL schemes with
// fencelock.Open:
//
//	import _ "github.com/fencelock/fencelock/backend/postgres"
//
//	c, err := fencelock.Open(ctx, "postgres://app@db/app?table=locks&ttl=15s", nil)
//
// or, on a pool the application already has (the backend never closes it):
//
//	b, err := postgres.New(ctx, pool, &postgres.Options{Table: "locks", RenewPool: renewPool})
//	c, err := fencelock.New(b, nil)
//
// # URLs
//
// Open, OpenURL and fencelock.Open take a libpq-style URL
//
//	postgres://[user[:password]@]host[:port][,host[:port]...]/dbname[?params]
//	postgresql://… (the same)
//
// for example
//
//	postgres://app:s3cret@db1:5432/app?sslmode=verify-full&table=locks&listen_url=postgres%3A%2F%2Fapp%40db1-direct%2Fapp
//
// Schemes are case-insensitive. Host, port (5432), user, password and
// database default as pgx has them, PG* environment variables included.
// Parameters of this package:
//
//   - schema: Options.Schema (default "": the search_path decides).
//   - table: Options.Table (default "fencelock_locks").
//   - sequence: Options.Sequence (default the table's name + "_token_seq").
//   - channel: Options.Channel, for release notifications (default the
//     table's name).
//   - create_table: false sets Options.SkipCreate (default true: create
//     the table and sequence if missing).
//   - listen: false sets Options.NoListen (default true: wait on
//     LISTEN/NOTIFY).
//   - listen_url: a URL-escaped URL of a direct connection for LISTEN, for
//     a pooler in transaction mode (default: the main URL's connection).
//   - renew_pool_max_conns: the size of a second pool that carries only
//     renewals (Options.RenewPool; default 2; 0 shares the main pool).
//
// Every other parameter goes to pgx (sslmode, sslrootcert,
// pool_max_conns, application_name, default_query_exec_mode, …, with
// pgx's defaults, except pool_max_conns: see Connections); one that neither this package nor pgx knows reaches the
// server as a setting, and Open fails with an *InvalidOptionError when the
// server does not know it either. fencelock.Open also accepts the engine's
// parameters (ttl, renew_interval, margin, rotate_every, owner) and
// removes them before this package sees the URL.
//
// No credential from the URL appears in an error or a log: URLs are shown
// through driver.RedactURL (the password, the values of password=,
// sslpassword=, passfile= and sslkey=, of any parameter whose name
// driver.IsSecretParam names, and the same inside listen_url become
// "xxxxx"), and pgx's errors are wrapped with driver.RedactError.
//
// # Design
//
// Locks live in one table (default fencelock_locks; DDL in schema.sql, also
// returned by Schema): key (text COLLATE "C", primary key), owner, token
// (bigint), locked_at and expires_at (timestamptz, CHECK expires_at >=
// locked_at), contended, metadata (bytea, the holder's payload) and
// metadata_owner (the owner that stored it: Inspect and List report the
// payload only while that owner holds the row), plus a bigint sequence that
// issues every fencing token. A table created by an earlier version gets
// the two metadata columns at Open, by the ALTER TABLE … ADD COLUMN IF NOT
// EXISTS at the end of the DDL, run only when a column is missing (with
// SkipCreate, Open fails and names the DDL to run instead). All
// times are the server's: now() of each statement. A client's clock is never
// sent or compared.
//
//   - Acquire is one statement: INSERT … ON CONFLICT (key) DO UPDATE that
//     takes the row if it is free (expires_at <= now()) or already ours,
//     RETURNING the token, and otherwise RETURNING the holder, its token
//     and its remaining time for the *driver.HeldError. A new or changed
//     owner gets nextval of the sequence; the same owner re-acquiring a
//     live row keeps its token (an idempotent retry). The new holder's
//     metadata is written by the same statement. A key that this
//     Backend's last attempt found held gets a form that answers a held
//     key from its snapshot without writing (a waiter's attempts are
//     read-only transactions); other keys get the bare upsert, the
//     cheapest for a free key, which marks a held row contended. If the
//     snapshot form finds the key held but the row changed before it
//     could mark it (a release committed in between), Acquire sends the
//     bare upsert too, so that the answer is decided under the row lock.
//   - Renew is an UPDATE checked by key, owner, token and expires_at > now()
//     (never an upsert, so a late renewal cannot resurrect a released lock);
//     with Rotate it also draws a new token from the sequence, and with
//     SetMetadata it also replaces the metadata (same statement, same
//     check). RenewBatch never changes metadata.
//   - RenewBatch is one UPDATE … FROM unnest($keys, $owners, $tokens).
//     Concurrent calls are coalesced (group commit), so a client's N leases
//     cost about one statement per round trip, not N. A call whose context
//     ends before its statement is sent is left out of it; a token rotated
//     for a call that had gone by the time the answer came is remembered,
//     so that call's retry with the token it holds still finds its record.
//   - Release marks the row free (expires_at moved back to locked_at, the
//     metadata cleared) if key, owner and token match and it has not
//     expired, and, if a contender marked the row, calls pg_notify(channel,
//     key) in the same statement. ForceRelease does the same for any
//     holder, and always notifies.
//   - Inspect and List compute the remaining time on the server
//     (expires_at − now()). List filters with starts_with(key, prefix): no
//     LIKE, nothing to escape.
//   - Watch LISTENs on the channel over one dedicated connection per
//     Backend (not a pool connection) and wakes the waiters of the released
//     key, so a contended handoff costs about one round trip. If that
//     connection drops, the waiters' channels are closed (the engine polls
//     with backoff) and the next Watch reconnects.
//
// # Fencing
//
// Tokens come from the sequence, never from token + 1 on the row, so they
// keep increasing after a row is deleted (by Sweep) and after a restart: a
// PostgreSQL sequence never goes back; after a crash it may skip ahead (it
// WAL-logs 32 values at a time), which only leaves a gap. Released rows are
// kept rather than deleted, so that every acquisition of a known key goes
// through the ON CONFLICT path, where the new token is drawn after the
// row's lock is taken: it is therefore above the token of any holder that
// committed before. (With DELETE on release, an INSERT that drew its token
// just before another client acquired and released the same key could
// commit a lower token afterwards.) Sweep deletes rows free for longer than
// an age of at least MinSweepAge, which keeps that window closed in
// practice.
//
// The guarantee holds for committed acquisitions on a server that does not
// lose committed transactions. With fsync=off or synchronous_commit=off
// a crash may lose acknowledged commits and the sequence values they drew,
// so a token may be issued twice; Describe reports both settings as
// warnings. After a failover to an asynchronous replica the same applies.
//
// # Connections
//
// Open creates two pools: the main pool for acquire, release, inspect and
// list, and a small renewal pool (renew_pool_max_conns, default 2, one
// connection kept idle) so that heartbeats are never queued behind a busy
// application; plus one LISTEN connection. The main pool's size is
// pool_max_conns if the URL sets it, otherwise DefaultPoolMaxConns(),
// max(16, 4 × GOMAXPROCS), not pgx's max(4, NumCPU): a lock statement
// keeps its connection for a round trip and a commit flush while neither
// CPU is busy, so with pgx's default 16 goroutines on 2 cores queued on 4
// connections and reached 0.39× the raw statements' rate. A Backend from
// Open therefore holds at most DefaultPoolMaxConns() + 2 + 1 server
// connections (19 with GOMAXPROCS ≤ 4); the main pool opens none in
// advance, only as concurrency needs them. Mind max_connections (100 by
// default) when many processes share a server, and set pool_max_conns
// lower there.
//
// With New, renewals use opts.RenewPool if set
// and otherwise the caller's pool: if the application can exhaust that
// pool for longer than the lease's local validity, renewals wait and the
// lease is lost. Give the backend a RenewPool of its own in that case.
//
// Everything except LISTEN is a single autocommit statement with no session
// state, so it works through PgBouncer in transaction pooling mode (with
// prepared statements: PgBouncer 1.21+ with max_prepared_statements, or
// default_query_exec_mode=exec / simple_protocol in the URL). LISTEN needs a
// direct connection to the server: set listen_url (Open) or ListenConfig
// (New), or disable it with listen=false / NoListen (waiters then poll).
//
// Open configures pgx to answer a cancelled context with a cancel request
// to the server (see CancelRequestHandler) rather than by dropping the
// socket, so a cancelled acquire has a definite outcome that the engine's
// clean-up can see. Set the same handler on a pool passed to New.
//
// # Caveats
//
//   - Expired rows are not removed automatically: run Sweep periodically if
//     keys are not reused (one row per distinct key ever locked).
//   - Keys and owners are text: NUL is impossible (driver.ValidateKey rejects
//     control characters). Keys are compared bytewise (COLLATE "C").
//   - Identifiers are double-quoted and therefore case-sensitive.
//   - Schema "" uses the connections' search_path: give every process the
//     same one, or set Schema.
package postgres
