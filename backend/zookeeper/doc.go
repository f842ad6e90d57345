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
// engine's parameters (ttl, renew_interval, margin, rotate_every, owner)
// and removes them before this package sees the URL. A zk URL carries no
// credentials: a user or password in it is an error (add digest or other
// authentication to a *zk.Conn of your own and pass it to New), so there
// is nothing to redact; the client library's errors are still wrapped with
// driver.RedactError.
//
// # Design
//
// Each lock key is a container znode PREFIX/<escaped key> (every byte outside
// [A-Za-z0-9_-] percent-encoded, so any key is one path segment and comes
// back exactly). Contenders create EPHEMERAL|SEQUENTIAL children named
// _c_<nonce>-lock-<seq> holding their owner string, followed, when the
// holder stored metadata, by a NUL byte and the metadata (without metadata
// the data is the owner alone, as earlier versions wrote it, and their
// znodes read as locks without metadata); the lowest child holds the lock.
// Every rewrite of a znode writes back the data it read, version-checked,
// so metadata survives rotations; Renew with SetMetadata is such a rewrite
// with new data, so on ZooKeeper it also issues a new token. Acquire creates its child in one multi transaction together
// with a no-op write to the parent, whose returned Stat gives the number of
// children (one: the lock is ours, in a single round trip) and the
// transaction's zxid (our child's czxid, the token). Otherwise it lists the
// children, reports the holder (its data and zxid) and deletes its own
// child (for a key it recently found held, Acquire reads the holder first
// and writes nothing if the key is taken). AcquireWait keeps its child and
// watches only its immediate
// predecessor (a data watch), so a release wakes exactly one waiter, in
// FIFO order; when the predecessor was the lowest child, its deletion alone
// hands over the lock, with no further read.
//
// # Guarantees
//
//   - Fencing: the token is a zxid of the holder's znode: its czxid, or its
//     mzxid after a rotation or a hand-off. zxids are cluster-wide and
//     strictly increasing, so tokens keep increasing when a key's container
//     znode is deleted and recreated (sequence numbers would restart) and
//     across server restarts. Queue order is creation order, so a waiter's
//     czxid is above every earlier holder's czxid; only a rotation (a
//     version-checked rewrite of the holder's znode, whose new mzxid is the
//     new token) can issue a token above a waiter's czxid. Every rotation
//     therefore also bumps the key znode's ACL version, and a waiter that
//     takes over (in the engine's confirming Renew: one read of the
//     children and the parent's Stat) rewrites its own znode for a fresh
//     zxid only if that version moved since it joined the queue.
//   - Liveness is the session: an ephemeral znode lives until it is deleted
//     or its session ends. Renew proves in one round trip that the session
//     is alive and the znode is still this grant's (same version and zxid,
//     owned by this session); RenewBatch renews every lease whose loss watch
//     is armed with a single read. Grants report the negotiated session timeout
//     as their TTL, so the engine's local validity never outlasts what the
//     server grants: a holder that goes silent stops believing it holds the
//     lock before the server expires its session. A reconnect within the
//     session timeout keeps every lock; an expired session ends them all at
//     once (NotifyLoss fires with a cause matching zk.ErrSessionExpired).
//   - Crash release: the server deletes a dead holder's znode when its
//     session times out. Set the engine's TTL to about the session timeout.
//   - No orphans: a create whose reply was lost is found again by its nonce
//     and deleted, and so is the znode of a TryAcquire that lost or a wait
//     that was cancelled. A deletion that fails, and the search for a
//     nonce (the server may execute a create late), are retried at the
//     start of the next Acquire, AcquireWait, Renew, RenewBatch, Release
//     or Inspect: the backend starts no goroutine of its own for it. Until
//     it is done, Inspect of that key returns a transient error, so the
//     engine's clean-up after an ambiguous acquire keeps looking (with its
//     backoff) and drives it to the end. Empty key znodes are container znodes that the
//     server deletes itself (ZooKeeper 3.5.3 or later).
//   - Release deletes only its own znode, version-checked; ForceRelease
//     deletes the current holder's znode, and the holder's loss watch fires.
//   - Token floors (driver.TokenFloorer, for migrations between
//     backends): the token a caller sees is the zxid above plus an offset
//     kept in the persistent znode ROOT/%floor, a list of segments that
//     RaiseFloor only appends to (a version-checked Set), each with a
//     larger offset, starting at the zxid of its own write. The offset is
//     a non-decreasing function of the zxid, so tokens keep the order of
//     zxids and everything above holds for them. Acquire's multi checks
//     the floor znode's version, so the offset it adds is the one in force
//     at its zxid; a grant whose zxid was decided before it is handed out
//     (a waiter reaching the head, in the confirming Renew; an Acquire
//     that finds the holder gone after queueing) syncs with the leader,
//     reads the floor and rewrites its znode for a fresh zxid if the floor
//     is newer than its zxid. The floor is per root (RaiseFloor of any key
//     raises all of them), below 2^62; HighWater writes the floor znode
//     (same offsets) for a zxid above every token issued. See floor.go and
//     docs/migration.md for the argument.
//
// # Caveats
//
// go-zookeeper calls take no context: a call in flight runs until the
// server answers or go-zookeeper gives up (about two thirds of the session
// timeout, or one pass over the server list while disconnected); contexts
// are checked between calls. Inspect reports Remaining 0: a lock lives as
// long as its holder's session. TTLs in AcquireRequest cannot be honoured
// per lock; the session timeout applies to every lock of a Backend. Reads
// may be served by a follower that lags the leader (ZooKeeper's sequential
// consistency); a holder's own session always sees its own writes. A
// token is mapped with the floor znode as read on the session that saw its
// zxid; right after a session expired and a new one began, a holder
// reported by Inspect may get a token mapped with an older floor (lower,
// never higher, than its own).
package zookeeper
