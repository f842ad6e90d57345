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
// Open makes its own pools (Close closes them); New never closes the
// caller's pool. See
// https://github.com/fencelock/fencelock/blob/main/docs/backends/postgres.md
// for the guarantees, the caveats and the design: the table and its
// statements, fencing, connections and PgBouncer.
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
// pgx's defaults, except pool_max_conns, which defaults to
// DefaultPoolMaxConns()); one that neither this package nor pgx knows
// reaches the server as a setting, and Open fails with an *InvalidOptionError when the
// server does not know it either. fencelock.Open also accepts the engine's
// parameters (ttl, renew_interval, margin, rotate_every, owner,
// lock_delay, require) and
// removes them before this package sees the URL.
//
// No credential from the URL appears in an error or a log: URLs are shown
// through driver.RedactURL (the password, the values of password=,
// sslpassword=, passfile= and sslkey=, of any parameter whose name
// driver.IsSecretParam names, and the same inside listen_url become
// "xxxxx"), and pgx's errors are wrapped with driver.RedactError.
package postgres
