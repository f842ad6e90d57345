// Package etcd is fencelock's etcd backend (go.etcd.io/etcd/client/v3).
//
// Importing it registers the URL schemes etcd:// and etcds:// (TLS) with
// fencelock.Open; New wraps a *clientv3.Client that the caller owns.
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
// renew_interval, margin, rotate_every, owner) and removes them before
// this package sees the URL. No credential from the URL appears in an
// error or a log: URLs are shown through driver.RedactURL (the password
// and the value of key_file, and of any parameter whose name
// driver.IsSecretParam names, become "xxxxx"), and the client library's
// errors are wrapped with driver.RedactError.
//
// # Layout
//
// Every lock key has a queue under the configured prefix (Options.Prefix,
// default "/fencelock/"):
//
//	PREFIX + escape(key) + "/" + name   value: owner NUL [metadata]
//
// where escape percent-encodes '%' and '/', so a key's queue prefix is never
// a prefix of another key's queue. Each contender, holder or waiter, is one
// entry attached to an etcd lease. The holder is the entry with the lowest
// create revision, as in concurrency.Mutex. The value is the owner and a
// NUL byte (an owner never contains NUL), followed by the holder's
// metadata, if any; earlier versions wrote the owner alone when there was
// no metadata, which reads the same.
//
// An entry's name is the Backend's random id and a slot number, and a
// Backend reuses a slot once its entry is released: etcd keeps every
// deleted name in its index until a compaction, and every compare and
// range over a queue walks them, so a name per acquisition made a busy key
// slower with every acquisition (docs/performance.md, DeadEntries). A
// grant's Handle carries its entry's name; a grant without one (built from
// Inspect) finds its entry by its token. Safety does not rest on the names
// being distinct: every put that creates an entry is guarded (Acquire's by
// an empty queue, a waiter's by the name being free), every later write
// or delete by the entry's mod revision, and Release also by the owner in
// the value. Earlier versions named an entry escape(owner) and kept no
// name in the handle; their entries and grants are found by token, and
// both versions can share a prefix.

// # Guarantees
//
//   - Mutual exclusion is decided by etcd's linearizable store: Acquire is
//     one transaction that puts the entry only if the key's queue is empty
//     (a compare over the whole queue prefix).
//   - The fencing token is the holder entry's mod revision. etcd's
//     revision is a single counter for the whole cluster that never goes
//     back: not across releases, lease expiry, force-release, compaction or
//     restarts. A new entry gets a revision above every earlier one, and the
//     holder is the oldest entry, so tokens strictly increase per key.
//     Rotation (Renew with Rotate) re-puts the holder's entry (new mod
//     revision). Renew with SetMetadata re-puts the entry the same way with
//     the new value, so on etcd setting metadata also issues a new token
//     (returned by Renew); every other re-put keeps the value and with it
//     the metadata. Every re-put of an entry also writes a per-key marker in
//     the same transaction, so the marker is at least every token that is
//     not a create revision; a waiter whose entry is older than the marker
//     (it queued before a re-put) re-puts its own entry, marker included,
//     on its first Renew (the engine's confirmation), so its token exceeds
//     every earlier one. Keys that never rotate never get a marker.
//   - Release and ForceRelease delete an entry only if it still has the
//     expected revision (never by key name alone: see
//     etcd-io/etcd#22082, where a retried unlock deleted a newer holder),
//     and Release only if its value names the grant's owner (compared in
//     etcd, or read before the delete of that very revision).
//   - Expiry is judged by etcd's lease clock. Lease TTLs are whole seconds
//     (at least etcd's minimum, 2s with default election settings); every
//     grant reports in Grant.TTL how long etcd is sure to keep the lease,
//     measured from before the request that last kept it alive, and the
//     engine's local validity never goes beyond it.
//   - Waiting (driver.Waiter) is FIFO by create revision and watch-based:
//     a waiter with at most 16 entries ahead of it knows them all and
//     watches the queue for their deletions, so it becomes the holder with
//     no further read; further back it watches its predecessor. Watches are
//     registered at the current revision so etcd treats them as synced (no
//     100ms catch-up), and a cancelled waiter deletes its entry.
//   - Loss is pushed (driver.LossNotifier): a watch on the holder's entry
//     reports its deletion, including by lease expiry or revocation. A
//     grant whose Handle names no entry (one built from Inspect, or held on
//     an entry an earlier version wrote) is not watched; renewal finds its
//     loss.
//   - Token floors (driver.TokenFloorer, for migrations between
//     backends): the token a caller sees is the native token (the mod
//     revision above) plus an offset kept in PREFIX + "%floor", a list of
//     segments that RaiseFloor only appends to, each with a larger offset,
//     starting at the revision of its own write. The offset is a
//     non-decreasing function of the revision, so tokens keep the order of
//     revisions and everything above holds for them; Acquire's
//     transaction compares the floor key with the version the backend has
//     cached (or reads it, with nothing cached), and a waiter that queued
//     before a raise re-puts its entry when it is granted. The floor is per prefix
//     (RaiseFloor of any key raises all of them), below 2^62; see
//     docs/migration.md for the argument.
//
// # Leases: one per backend, not one per lock
//
// All entries a Backend writes with the same TTL share one etcd lease
// ("session"), like concurrency.Session. Acquire and Release are then one
// transaction each, the same cost as a bare put and delete; a lease per
// lock would add a LeaseGrant and a LeaseRevoke (two more Raft writes) to
// every lock. The lease has no goroutine of its own: the engine's renewals
// keep it alive (one keep-alive serves every renewal and acquisition within
// 1/20 of the TTL, and RenewBatch renews any number of locks with one
// keep-alive and one read transaction per 128 locks), and a waiter keeps it
// alive while it waits.
//
// The trade-off: a lock's liveness is the liveness of its Backend's lease.
// If the process dies, every lock it held is freed when the lease expires
// (within the TTL), as with a lease per lock. But an entry that a live
// process stops renewing without deleting it (the engine lost the lease
// locally and its clean-up release also failed) stays as long as the same
// Backend keeps renewing other locks, or until Close, which revokes the
// backend's leases. Exclusion and fencing are unaffected; only that key's
// availability is. The same holds for an entry re-put by a rotation whose
// reply was lost: a retry with the old token is answered ErrNotHeld, as
// the driver contract says, and Release of a grant built from Inspect
// (Key, Owner, Token, no Handle) removes the entry.
//
// # Caveats
//
//   - A lease's TTL is whole seconds: a 1.5s TTL is kept for 2s by etcd.
//   - Inspect and List report Remaining in whole seconds (LeaseTimeToLive).
//   - Close revokes the backend's leases: any entry still attached to them
//     is deleted at once.
//   - A rotated key keeps a small marker key (no lease) for good, like a
//     token counter; keys that never rotate have none.
//   - A waited grant's token is final only after its first Renew (the
//     engine's confirmation), which re-puts the entry if another holder's
//     entry was re-put after this one queued.
package etcd
