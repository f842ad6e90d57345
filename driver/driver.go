// Package driver defines the interface that fencelock backends implement.
//
// Application code does not use this package: it holds a *fencelock.Client
// and *fencelock.Lease. This package is for the authors of backends
// (PostgreSQL, Redis, etcd, ZooKeeper, MongoDB, the in-process memory
// backend, and third-party stores) and is deliberately small, in the manner
// of database/sql/driver and gocloud.dev's pubsub/driver.
//
// # Division of labour
//
// The engine in package fencelock owns everything that involves time or
// retries: the acquire/wait loop, backoff with jitter, the renewal schedule,
// local validity (the holder's own deadline), token-regression checks and
// loss signalling. A backend performs single attempts: each method is one
// attempt, ideally one round trip, and returns. A backend never sleeps,
// never loops to retry, and starts no goroutines except where its store
// needs a session (a ZooKeeper connection, an etcd watch or keep-alive
// stream, a PostgreSQL LISTEN connection).
//
// # Errors
//
// A backend reports outcomes with the sentinel errors of this package so the
// engine can tell a definite answer from a transient failure:
//
//   - ErrNotAcquired (usually as a *HeldError that names the holder): the key
//     is held by someone else. A definite answer, not a failure.
//   - ErrNotHeld: a renew or release was answered "this grant is not the
//     current holder" (expired, released, stolen, or a stale token). For a
//     renewal this ends the lease at once.
//   - *InvalidKeyError, *InvalidOptionError: bad input, detected before
//     anything is stored.
//   - ErrUnsupported: the operation is not available on this backend.
//   - ErrClosed: the backend was closed.
//
// Any other error is treated as transient: the engine may retry it (for
// renewals, until the lease's local validity runs out). Context errors
// should be returned as they are (or wrapped with %w).
//
// When ctx ends in the middle of an Acquire, the outcome is unknown to the
// engine, which then looks the key up once (Inspect) with a fresh context
// and releases the record if its owner holds it. A backend should make the
// outcome definite before returning where its store allows (cancel the
// statement on the server and wait for the cancellation), so that this one
// look finds the truth.
//
// # Optional capabilities
//
// Beyond Backend, the engine discovers what a backend can do by type
// assertion: Waiter (a blocking acquire in the store's queue), Watcher and
// WatchProber (a wake-up when a key frees), BatchRenewer (every due
// renewal in one round trip), BatchAcquirer and BatchReleaser (concurrent
// acquire attempts and releases of one Client in one round trip, each
// request with its own answer: see batch.go), LossNotifier (a loss pushed
// by the store), ForceReleaser, TokenFloorer, Describer and Guarantor.
// None is required; the conformance suite runs the cases of each one a
// backend has.
//
// # Validation
//
// The backend owns input validation, with this package's functions: the
// rules live here once, and each backend entry point applies them with one
// call before anything is stored. Backends are called directly, not only
// by the engine (package migrate, the fencelock command, third-party code),
// so "bad input gets a typed error and changes nothing stored" must hold
// for every caller; the conformance suite calls backends directly to check
// it.
//
//   - Acquire, AcquireWait and each request of AcquireBatch: CheckAcquire
//     (key, owner, TTL, metadata size); a bad request of a batch is that
//     request's error alone (BatchAcquirer).
//   - Renew and RenewBatch: CheckRenew (the TTL, the metadata size). A grant (also Release's)
//     is the backend's own output, not new input: one it cannot have
//     issued (a bad key, an empty owner, a zero token) changes nothing and
//     gets ErrNotHeld, or an *InvalidKeyError for a bad key.
//   - Inspect, ForceRelease, Watch, RaiseFloor: ValidateKey.
//   - List, HighWater: ValidatePrefix.
//
// A backend whose store has stricter rules (a shorter key limit) adds them
// after these and reports them the same way. Apply them before any round
// trip and before any check of the connection (only ErrClosed and ctx's
// error may come first): bad input gets its typed error even while the
// store is unreachable, since a transient failure is what the engine
// retries.
//
// The engine relies on the backend and checks nothing twice: not the
// AcquireRequest or RenewRequest it builds (its owners always pass, and
// its TTL was checked by fencelock.New with ValidateTTL's bounds), nor
// the keys and prefixes the application passes to the Client, which reach
// the backend as they are. The Client treats ErrInvalidKey and
// ErrInvalidOption as definite: returned at once, never retried, with
// nothing to clean up. (Client.ForceRelease on a backend without
// ForceReleaser returns ErrUnsupported without looking at the key.)
//
// # Concurrency
//
// Every method may be called concurrently from many goroutines. After Close
// returns, every method returns ErrClosed.
package driver

import (
	"context"
	"errors"
	"time"
)

// Token is a fencing token: a number issued by the store that strictly
// increases, per key, across holders, takeovers, release and re-acquire, and
// token rotation. Zero is never a valid token.
type Token uint64

// AcquireRequest asks for a key on behalf of one lease.
type AcquireRequest struct {
	// Key is the lock key. The backend checks the request with
	// CheckAcquire before storing anything (see "Validation"); a backend
	// with stricter rules (for example a length limit of its store) also
	// returns an *InvalidKeyError for them.
	Key string
	// Owner identifies the lease. It is unique per Acquire or TryAcquire call
	// of the engine and is what Inspect and List report as the holder.
	Owner string
	// TTL is how long the store should keep the record alive without a
	// renewal. A backend with coarser granularity rounds up and reports the
	// TTL it granted in Grant.TTL.
	TTL time.Duration
	// Metadata is an opaque payload stored with the record and returned by
	// Inspect and List in Info.Metadata: at most MaxMetadataLen bytes, nil
	// and empty alike. An Acquire by the same Owner (a retry) replaces it.
	Metadata []byte
	// LockDelay, if positive, asks for a quiet gap after an unreleased end
	// (Chubby's lock-delay, Consul's LockDelay): the backend refuses the
	// key, with a *HeldError whose LockDelay is the rest of the gap, while
	// a previous holder's record ended without a release (it expired, its
	// holder crashed or lost it) less than LockDelay ago, by the clock that
	// judges expiry. A released (or force-released) record frees the key
	// at once. Where the store cannot keep an expired record readable
	// (Redis, etcd, ZooKeeper), the holder's grant leaves a marker that
	// outlives its record, so an unreleased end is remembered only if the
	// holder asked for a lock delay too: every client of a key should use
	// the same one. At most MaxTTL; CheckAcquire refuses a negative one. A
	// backend that cannot keep it returns an *UnsupportedError (matching
	// ErrUnsupported, see LockDelayUnsupported) for a positive LockDelay,
	// storing nothing.
	LockDelay time.Duration
}

// MaxMetadataLen is the largest metadata payload, in bytes, that a lease
// may carry (AcquireRequest.Metadata, RenewRequest.Metadata). Every
// backend stores at least this much; CheckAcquire and CheckRenew refuse
// more with an *InvalidOptionError.
const MaxMetadataLen = 4096

// Grant is a successful acquisition or renewal as the store recorded it.
type Grant struct {
	// Key is the lock key.
	Key string
	// Owner is the owner from the AcquireRequest.
	Owner string
	// Token is the fencing token the store issued for this grant.
	Token Token
	// TTL is the time to live the store granted, if it differs from the one
	// requested (etcd grants whole seconds). Zero means "as requested". The
	// engine bases local validity on the smaller of the two.
	TTL time.Duration
	// Valid, if positive, is how long the holder may count on the grant,
	// from the start of the request that returned it, where that is less
	// than the time the store keeps the record (TTL): a store whose
	// answer may come from a replica out of touch with the server that
	// judges expiry (a ZooKeeper follower cut off from its leader answers
	// renewals while the leader expires the session) vouches for less
	// than it keeps. The engine then bases local validity on it; the
	// store still frees a crashed holder's key only after TTL. Zero means
	// as long as TTL.
	Valid time.Duration
	// Handle is opaque backend state that later calls need to find the
	// grant again: a znode path, an etcd lease ID. The engine stores it and
	// passes it back unchanged. It is empty in one case: when the engine
	// removes a record that an acquire with an unknown outcome may have left,
	// it builds the grant from Inspect (Key, Owner, Token); Release must then
	// find the record by those.
	Handle string
}

// RenewRequest asks to extend a grant.
type RenewRequest struct {
	// TTL is the new time to live, counted from the store's receipt of the
	// request.
	TTL time.Duration
	// Rotate asks for a new, higher fencing token for the same holder. A
	// backend that cannot rotate ignores it and keeps the token; the engine
	// then reports rotation as unsupported.
	Rotate bool
	// SetMetadata asks the renewal to replace the record's metadata with
	// Metadata, under the same check as the renewal itself (the grant is
	// the current holder), so only the holder changes it. Without it the
	// stored metadata is kept. RenewBatch is never asked to set metadata.
	// A store whose token is the record's version (etcd, ZooKeeper) issues
	// a new, higher token for such a renewal, as for Rotate; the engine
	// takes the returned Grant's token either way.
	SetMetadata bool
	// Metadata is the new payload when SetMetadata is true (at most
	// MaxMetadataLen bytes).
	Metadata []byte
}

// Info describes the current holder of a key, as the store sees it.
type Info struct {
	// Key is the lock key.
	Key string
	// Owner is the holder's owner string; empty if the key is free.
	Owner string
	// Token is the holder's fencing token; zero if the key is free.
	Token Token
	// Remaining is how long the record stays alive without a renewal, as
	// judged by the store's clock. Zero means unknown, as when the lock lives
	// as long as the holder's session (ZooKeeper).
	Remaining time.Duration
	// Metadata is the payload the holder stored (AcquireRequest.Metadata,
	// or the last RenewRequest with SetMetadata); nil if none or free.
	Metadata []byte
}

// Locked reports whether Info describes a held key.
func (i Info) Locked() bool { return i.Owner != "" }

// Backend is one connection to a lock store.
//
// The contract of each method:
//
//   - Acquire makes one attempt to take Key. On success it returns a Grant
//     with a token greater than every token previously issued for the key.
//     If the key is held by someone else it returns an error for which
//     errors.Is(err, ErrNotAcquired) holds, preferably a *HeldError naming
//     the holder. An expired record counts as free. If the key is already
//     held by the same Owner (a retry after an ambiguous reply), Acquire
//     succeeds and returns the existing grant, so retries are safe.
//   - Renew extends a grant that is still current: same Owner, same Token,
//     not expired. Otherwise it returns ErrNotHeld and changes nothing. Renew
//     must never create a record (a late renewal must not resurrect a
//     released lock). With Rotate it issues a higher token.
//   - Release removes the record if and only if Owner and Token match and
//     it has not expired; otherwise it returns ErrNotHeld and changes
//     nothing.
//   - Inspect reports the current holder of a key (Owner empty if free;
//     expired records count as free).
//   - List reports every held key with the given prefix ("" for all), in
//     any order.
//   - Close releases the backend's own resources (connections it opened,
//     goroutines it started). It must not close a store client the caller
//     passed in, and it does not release locks: the engine does that first.
type Backend interface {
	Acquire(ctx context.Context, req AcquireRequest) (Grant, error)
	Renew(ctx context.Context, g Grant, req RenewRequest) (Grant, error)
	Release(ctx context.Context, g Grant) error
	Inspect(ctx context.Context, key string) (Info, error)
	List(ctx context.Context, prefix string) ([]Info, error)
	Close() error
}

// Waiter is implemented by stores that can queue contenders fairly
// (etcd, ZooKeeper).
//
// AcquireWait blocks until the request holds the key or ctx ends. While it
// waits, the backend keeps its queue entry alive (through its session). When
// ctx ends first, it removes its queue entry before returning, using a fresh
// context with a bounded timeout (never the dead ctx), and returns ctx's
// error. The engine calls AcquireWait only after Acquire has answered
// ErrNotAcquired, and confirms the returned grant with a Renew before
// starting the lease's local-validity clock; the token of the grant
// AcquireWait returns may therefore be provisional, settled by that Renew.
type Waiter interface {
	AcquireWait(ctx context.Context, req AcquireRequest) (Grant, error)
}

// Watcher is implemented by record stores that can notify waiters when a key
// may have become free (PostgreSQL LISTEN/NOTIFY, Redis pub/sub).
//
// The engine subscribes only after an Acquire of the key was answered
// ErrNotAcquired, and tries once more right after subscribing, so a release
// that happens before the subscription exists is never missed. A backend
// may rely on that, e.g. to notify only for keys that someone found held.
//
// Watch subscribes to releases of key until ctx ends. The returned channel
// receives a value (sent without blocking; buffer it) whenever the key may
// have become free; spurious wake-ups are allowed. A backend may wake only
// some of a key's watchers per release (at least one, to avoid a herd): a
// woken waiter that loses the race, or whose wait ends, must not leave the
// others stranded, which the engine's polling safety net guarantees. The backend closes the
// channel when the subscription ends for any reason, including losing its
// notification connection; the engine then falls back to polling. The
// engine always keeps polling with capped backoff as a safety net, so a
// lost notification delays a waiter but never strands it.
type Watcher interface {
	Watch(ctx context.Context, key string) (<-chan struct{}, error)
}

// WatchProber is implemented by a Watcher whose Watch may be unsupported
// for good: a backend that wraps others (migrate.Dual) is a Watcher in
// type whether or not what it wraps can watch. CanWatch reports whether
// Watch can succeed at all; callers treat a Watcher whose CanWatch is
// false as no Watcher, and wait by polling from the start.
type WatchProber interface {
	CanWatch() bool
}

// Watches returns b as a Watcher if it is one that can watch: it
// implements Watcher and, if it implements WatchProber too, CanWatch
// reports true.
func Watches(b Backend) (Watcher, bool) {
	w, ok := b.(Watcher)
	if !ok {
		return nil, false
	}
	if p, ok := b.(WatchProber); ok && !p.CanWatch() {
		return nil, false
	}
	return w, true
}

// RenewResult is the outcome of renewing one grant in a batch.
type RenewResult struct {
	// Grant is the renewed grant when Err is nil.
	Grant Grant
	// Err is nil, ErrNotHeld, or a transient error for this grant alone.
	Err error
}

// BatchRenewer is implemented by backends that can renew many grants in one
// round trip (one SQL statement, one Redis pipeline). The engine then renews
// all of a client's leases together, at most about twice per renewal
// interval, instead of once per lease.
//
// RenewBatch returns one result per grant, in order. A non-nil error means
// the whole batch failed transiently and results is ignored.
type BatchRenewer interface {
	RenewBatch(ctx context.Context, grants []Grant, req RenewRequest) ([]RenewResult, error)
}

// LossNotifier is implemented by stores that can tell a holder that its
// grant is gone before the next renewal would (a watch on the lock key, an
// etcd lease revoked, a ZooKeeper session expired).
//
// NotifyLoss arranges for lost to be called, at most once and from any
// goroutine, when the store reports that g is definitely no longer held. The
// returned stop function cancels the notification; after stop returns, lost
// is not started (a call already under way may still be running, so lost
// must be safe to call concurrently with stop and must not block on it). The engine also applies its own local-validity deadline,
// so a notifier only ever makes loss detection faster.
type LossNotifier interface {
	NotifyLoss(g Grant, lost func(cause error)) (stop func())
}

// ForceReleaser is implemented by backends that let an administrator remove
// a lock regardless of its holder. It returns what it removed (Owner empty
// if the key was free). The holder learns of the loss at its next renewal,
// or at once where the backend is also a LossNotifier. Tokens stay
// monotonic: the next grant of the key still gets a higher token.
type ForceReleaser interface {
	ForceRelease(ctx context.Context, key string) (Info, error)
}

// Description is a backend's own account of what it guarantees. The safety
// report puts these claims beside measurements.
type Description struct {
	// Name is the backend's short name, e.g. "postgres".
	Name string
	// Fencing says how tokens are issued and what they survive, e.g.
	// "per-key INCR counter; survives restart only with appendfsync always".
	Fencing string
	// Clock says whose clock judges expiry, e.g. "server (now())".
	Clock string
	// Liveness says how a crashed holder's lock is freed, e.g. "TTL" or
	// "session timeout".
	Liveness string
	// Scope is what tokens strictly increase over: ScopeKey (one counter
	// per key) or ScopeStore (one sequence for every key: each token is
	// also above every token of every other key issued before it).
	Scope string
	// FailoverSafe reports whether exclusion and token order survive the
	// loss of the store's primary or leader, as deployed: true for a
	// replicated, linearizable store (etcd, ZooKeeper) or durable writes
	// to a majority (MongoDB with w:majority and journaling), false where
	// a replica may lag (Redis asynchronous replication, PostgreSQL
	// streaming replication without synchronous commit) or there is no
	// replica at all.
	FailoverSafe bool
	// Failover explains FailoverSafe: what a failover or restart can lose.
	Failover string
	// LossDetection says how soon a holder learns it lost its lock, e.g.
	// "at its next renewal (RenewInterval) or at local validity (TTL -
	// Margin) if the store is unreachable" or "pushed by a watch".
	LossDetection string
	// Warnings lists detected settings of this store that weaken exclusion
	// or fencing (eviction policy, missing persistence, asynchronous
	// replication). Empty means none detected.
	Warnings []string
}

// Token scopes (Description.Scope).
const (
	ScopeKey   = "key"
	ScopeStore = "store"
)

// LossByRenewal is the LossDetection of a backend that learns of loss only
// by renewing (the engine's rule, the same for every record store).
const LossByRenewal = "at the next renewal the store refuses (within RenewInterval), or at local validity (TTL - Margin after the last successful renewal began) if the store cannot be reached"

// Describer is implemented by backends that describe their guarantees.
type Describer interface {
	Describe() Description
}

// Sentinel errors. Backends return them (or errors wrapping them); callers
// test for them with errors.Is.
var (
	// ErrNotAcquired reports that a key is held by someone else.
	ErrNotAcquired = errors.New("fencelock: not acquired")
	// ErrNotHeld reports that a grant is not (or no longer) the current
	// holder of its key.
	ErrNotHeld = errors.New("fencelock: not held")
	// ErrInvalidKey is matched by every *InvalidKeyError.
	ErrInvalidKey = errors.New("fencelock: invalid key")
	// ErrInvalidOption is matched by every *InvalidOptionError.
	ErrInvalidOption = errors.New("fencelock: invalid option")
	// ErrUnsupported reports an operation the backend does not offer.
	ErrUnsupported = errors.New("fencelock: not supported by this backend")
	// ErrClosed reports use of a closed backend or client.
	ErrClosed = errors.New("fencelock: closed")
)

// HighWater is what a TokenFloorer reports of the tokens it has issued.
type HighWater struct {
	// Keys maps each key the store remembers to the highest token it has
	// issued for it, held or not (or the floor RaiseFloor set, if
	// higher). A key that was never locked, or whose
	// record the store has since forgotten, is absent.
	Keys map[string]Token
	// Global, if not zero, is above or equal to every token the store has
	// issued for any key, including keys it no longer lists (a
	// store-wide sequence). Zero for stores with per-key counters only.
	Global Token
}

// Max returns the highest token in h: Global or the largest per-key mark.
func (h HighWater) Max() Token {
	m := h.Global
	for _, t := range h.Keys {
		m = max(m, t)
	}
	return m
}

// TokenFloorer is implemented by backends whose token counter can be read
// and raised: what a migration between backends needs so that the tokens a
// downstream fence has already seen never go backwards (PostgreSQL, Redis,
// memory).
//
// HighWater reports the highest tokens issued for the keys starting with
// prefix ("" for all).
//
// RaiseFloor guarantees that every token the backend issues for key after
// RaiseFloor returns (by Acquire or a rotating Renew) is greater than
// floor. key "" raises the floor of every key, present and future; a
// backend that cannot do that returns ErrUnsupported for "" and callers
// raise the keys one by one. A floor never goes down: raising it to a
// value at or below the current one changes nothing, so RaiseFloor is
// idempotent and safe to re-run. A lock held while its floor is raised
// keeps its token; the next grant is above the floor. A backend may raise
// more than asked (a store-wide sequence raises every key at once).
type TokenFloorer interface {
	HighWater(ctx context.Context, prefix string) (HighWater, error)
	RaiseFloor(ctx context.Context, key string, floor Token) error
}
