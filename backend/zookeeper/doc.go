// Package zookeeper is fencelock's ZooKeeper backend, on
// github.com/go-zookeeper/zk.
//
// Import it for its side effect to make "zk://" URLs work with
// fencelock.Open, or use New with a *zk.Conn you own:
//
//	import _ "github.com/fencelock/fencelock/backend/zookeeper"
//
//	c, err := fencelock.Open(ctx, "zk://zk1:2181,zk2:2181/app?session_timeout=15s", nil)
//
// Open opens a Backend on a URL, with a connection of its own that Close
// closes; New never closes the caller's connection. Set the engine's TTL to
// about the session timeout: a lock lives as long as its holder's session.
// See https://github.com/fencelock/fencelock/blob/main/docs/backends/zookeeper.md
// for the guarantees, the caveats and the design.
//
// # URLs
//
// Open, OpenURL and fencelock.Open take
//
//	zk://host[:port][,host[:port]...][/path][?params]
//
// for example
//
//	zk://zk1:2181,zk2:2181,zk3:2181/myapp?prefix=locks&session_timeout=10s
//
// The scheme is case-insensitive. A host's port defaults to 2181 (the
// client library's default). Locks live under the znode /path/prefix
// (here /myapp/locks; without a path, /fencelock); the path must be a
// clean znode path and is created if missing. Parameters:
//
//   - prefix: the last part of that znode path (default "fencelock").
//   - session_timeout: the session timeout asked of the server (default
//     15s, between 10ms and 24h; the server clamps it to 2 to 20 ×
//     tickTime by default, and grants report what it negotiated).
//   - connect_timeout: how long Open waits for the first session (default
//     10s; must be positive). Open fails sooner, naming the cause, once
//     every server has refused the connection; from then until a session
//     is back, requests on the connection fail at once with
//     zk.ErrNoServer and the cause (see reach.go).
//
// Any other parameter is an error. fencelock.Open also accepts the
// engine's parameters (ttl, renew_interval, margin, rotate_every, owner,
// lock_delay, require)
// and removes them before this package sees the URL. A zk URL carries no
// credentials: a user or password in it is an error (add digest or other
// authentication to a *zk.Conn of your own and pass it to New), so there
// is nothing to redact; the client library's errors are still wrapped with
// driver.RedactError.
package zookeeper
