// Package nats is fencelock's NATS backend: locks in a JetStream
// key-value bucket (github.com/nats-io/nats.go/jetstream), NATS Server
// 2.11 or later.
//
// Importing it registers the URL schemes nats:// and nats+tls:// with
// fencelock.Open, and Open opens a Backend on a URL; New wraps a
// jetstream.JetStream that the caller owns and never closes its
// connection:
//
//	js, err := jetstream.New(nc)
//	b, err := fencelocknats.New(ctx, js, &fencelocknats.Options{Bucket: "myapp-locks", Replicas: 3})
//	c, err := fencelock.New(b, nil)
//
// A lock is a key of the bucket, taken with a write that succeeds only if
// the key has no live record, stored with a per-message TTL that the
// server enforces; renewals and releases compare the record's sequence,
// and the fencing token is the stream sequence of the acquiring write.
// See https://github.com/fencelock/fencelock/blob/main/docs/backends/nats.md
// for the guarantees, the caveats and the design.
//
// # URLs
//
// Open, OpenURL and fencelock.Open take
//
//	nats://[user:password@]host[:port][,host[:port]...][?params]
//	nats+tls://… (the same over TLS)
//
// for example
//
//	nats+tls://app:s3cret@n1:4222,n2:4222,n3:4222?bucket=myapp-locks&replicas=3&ca_file=/etc/ssl/nats-ca.pem
//
// Schemes are case-insensitive. Each host's port defaults to 4222. A user
// and password in the URL authenticate with them; a user name without a
// password is refused (NATS reads nats://TOKEN@host as a token, but a
// URL's user name is not redacted where the URL is shown): give a token
// as token=. The path must be empty.
// Parameters:
//
//   - bucket: Options.Bucket, the key-value bucket (default "fencelock").
//   - replicas: Options.Replicas for a bucket Open creates (default 1;
//     3 or 5 on a cluster).
//   - storage: file (default) or memory, for a bucket Open creates.
//   - connect_timeout: how long Open waits to connect and set up the
//     bucket (default 5s; must be positive).
//   - token: a token to authenticate with.
//   - creds: a credentials file (JWT and NKey seed).
//   - nkey: an NKey seed file.
//   - ca_file: PEM file of the CAs to trust (nats+tls only; default the
//     system roots).
//   - cert_file and key_file: a client certificate, both or neither
//     (nats+tls only).
//   - server_name: the name the server's certificate must carry
//     (nats+tls only; default the host dialled).
//
// At most one credential may be given. Any other parameter, a repeated
// one, and a TLS parameter on nats:// are errors. fencelock.Open also
// accepts the engine's parameters (ttl, renew_interval, margin,
// rotate_every, owner, lock_delay, require) and removes them before this
// package sees the URL. No credential from the URL appears in an error
// or a log: URLs are shown through driver.RedactURL (the password, and
// the values of token, creds, nkey and key_file, which
// driver.IsSecretParam names, become "xxxxx"), and the client library's
// errors are wrapped with driver.RedactError.
package nats
