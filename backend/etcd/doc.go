// Package etcd is fencelock's etcd backend (go.etcd.io/etcd/client/v3).
//
// Importing it registers the URL schemes etcd:// and etcds:// (TLS) with
// fencelock.Open, and Open opens a Backend on a URL; New wraps a
// *clientv3.Client that the caller owns and never closes it:
//
//	b, err := fencelocketcd.New(ctx, cli, &fencelocketcd.Options{Prefix: "/myapp/locks/"})
//	c, err := fencelock.New(b, nil)
//
// See https://github.com/fencelock/fencelock/blob/main/docs/backends/etcd.md
// for the guarantees, the caveats and the design.
//
// # URLs
//
// Open, OpenURL and fencelock.Open take
//
//	etcd://[user[:password]@]host[:port][,host[:port]...][/prefix/][?params]
//	etcds://… (the same over TLS)
//
// for example
//
//	etcds://app:s3cret@etcd1:2379,etcd2:2379,etcd3:2379/myapp/locks/?dial_timeout=3s&ca_file=/etc/ssl/etcd-ca.pem
//
// Schemes are case-insensitive. Each host's port defaults to 2379. The
// user and password, if given, authenticate with etcd's own users. The
// path, if not empty or "/", is Options.Prefix (a missing trailing '/' is
// added; default "/fencelock/"). Parameters:
//
//   - dial_timeout: how long Open waits for the cluster to answer a first
//     read (default 5s; must be positive). A refused connection fails at
//     once: the client Open makes does not wait for a ready connection,
//     so a request to an unreachable cluster fails within milliseconds
//     with the cause ("connection refused"). A client passed to New keeps
//     its own settings.
//   - cleanup_timeout: Options.CleanupTimeout (default 5s).
//   - ca_file: PEM file of the CAs to trust (etcds only; default the
//     system roots).
//   - cert_file and key_file: a client certificate, both or neither
//     (etcds only; default none).
//   - server_name: the name the server's certificate must carry (etcds
//     only; default the host name dialled).
//
// Any other parameter, and a TLS parameter on etcd://, is an error.
// fencelock.Open also accepts the engine's parameters (ttl,
// renew_interval, margin, rotate_every, owner,
// lock_delay, require) and removes them before
// this package sees the URL. No credential from the URL appears in an
// error or a log: URLs are shown through driver.RedactURL (the password
// and the value of key_file, and of any parameter whose name
// driver.IsSecretParam names, become "xxxxx"), and the client library's
// errors are wrapped with driver.RedactError.
package etcd
