// Package mysql is fencelock's MySQL and MariaDB backend, on
// github.com/go-sql-driver/mysql and database/sql.
//
// Importing it registers the mysql:// and mariadb:// URL schemes with
// fencelock.Open:
//
//	import _ "github.com/fencelock/fencelock/backend/mysql"
//
//	c, err := fencelock.Open(ctx, "mysql://app@db/app?table=locks&ttl=15s", nil)
//
// or, on a pool the application already has (the backend never closes it):
//
//	b, err := mysql.New(ctx, db, &mysql.Options{Table: "locks"})
//	c, err := fencelock.New(b, nil)
//
// Locks live in an InnoDB table, one row per key; each acquire is one call
// of a stored procedure (one transaction on the server), each renewal and
// release one UPDATE; expiry is judged by the server's clock; fencing
// tokens come from a counter row drawn in the grant's own transaction.
// GET_LOCK is not used: it is tied to one connection, exclusive only and
// carries no token. See
// https://github.com/fencelock/fencelock/blob/main/docs/backends/mysql.md
// for the guarantees, the caveats (MariaDB is what is tested; MySQL 8
// differences) and the design.
//
// # URLs
//
// Open, OpenURL and fencelock.Open take a URL
//
//	mysql://[user[:password]@]host[:port]/database[?params]
//	mariadb://… (the same)
//
// for example
//
//	mysql://app:s3cret@db1:3306/app?table=locks&tls=true&tls_ca=/etc/ssl/db-ca.pem
//
// Schemes are case-insensitive. The port defaults to 3306; the database
// is required. Parameters of this package:
//
//   - table: Options.Table (default "fencelock_locks").
//   - create_table: false sets Options.SkipCreate (default true: create
//     the tables and procedures if missing or outdated).
//   - max_open_conns: the pool's size (default DefaultMaxOpenConns()).
//   - socket: a unix socket path instead of host:port (the host must then
//     be empty or localhost).
//   - tls: false (default without tls_* files), true (verify the server's
//     certificate), skip-verify (encrypt, verify nothing) or preferred
//     (TLS if the server offers it).
//   - tls_ca, tls_cert, tls_key: PEM files of the CA that signed the
//     server's certificate, and of a client certificate and its key; any
//     of them implies tls=true.
//   - tls_server_name: the name to verify the server's certificate
//     against (default the URL's host).
//
// Every other parameter goes to github.com/go-sql-driver/mysql as its DSN
// has it (timeout, readTimeout, writeTimeout, charset, collation,
// interpolateParams, …), except that interpolateParams defaults to true
// (one round trip per statement) and timeout to 10s, which bounds a
// connection's whole establishment (dial, handshake and login). One
// the driver does not know becomes a session variable, and Open fails
// with an *InvalidOptionError when the server does not know it either. A
// parameter given twice is an *InvalidOptionError, and so is password= or
// user= (credentials go in the URL's user information). fencelock.Open also
// accepts the engine's parameters (ttl, renew_interval, margin,
// rotate_every, owner, lock_delay, require) and removes them before this
// package sees the URL.
//
// No credential from the URL appears in an error or a log: URLs are shown
// through driver.RedactURL (the password, and the values of password=,
// tls_key= and of any parameter whose name driver.IsSecretParam names
// become "xxxxx"), and the driver's errors are wrapped with
// driver.RedactError.
package mysql
