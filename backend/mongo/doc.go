// Package mongo is fencelock's MongoDB backend, on go.mongodb.org/mongo-driver/v2.
//
// Import it for its side effect to make fencelock.Open accept mongodb://
// and mongodb+srv:// URLs, or call Open or New directly:
//
//	c, err := fencelock.Open(ctx, "mongodb://db1,db2,db3/app?replicaSet=rs0&namespace=billing", nil)
//
//	b, err := mongo.New(ctx, client, &mongo.Options{Namespace: "billing"}) // caller-owned *mongo.Client
//	c, err := fencelock.New(b, nil)
//
// # URLs
//
// Schemes: mongodb:// and mongodb+srv:// (case-insensitive). Parameters of
// fencelock's own (each optional):
//
//   - database: the database of both collections; default the URL's path
//     (mongodb://host/app), else "fencelock";
//   - collection: the lock documents' collection, default "fencelock_locks";
//   - token_collection: the token counters' collection, default
//     "fencelock_tokens";
//   - namespace: keeps several applications apart in one collection,
//     default "default";
//   - clock_resync: how often the server clock estimate is refreshed
//     (a Go duration), default 30s.
//
// Every other parameter must be a MongoDB connection-string option
// (replicaSet, authSource, tls, w, journal, readConcernLevel, maxPoolSize,
// ...) and goes to the driver; w, journal and readConcernLevel given in the
// URL replace the backend's majority/journaled defaults. An unknown
// parameter is refused with an *driver.InvalidOptionError, so a typo never
// silently drops a setting. Ports must be 1 to 65535. For example:
//
//	mongodb://app:secret@db1,db2,db3/app?replicaSet=rs0&namespace=billing&w=majority
//
// Errors and Describe show the URL through driver.RedactURL: the password
// of the userinfo and credential-bearing parameters (proxyPassword,
// tlsCertificateKeyFilePassword, ...) never appear.
//
// # Schema
//
// Two collections in one database (names configurable and validated):
//
//   - fencelock_locks: one document per held key,
//     {_id: namespace+"\x00"+key, ns, key, owner, token, expiresAt}. The
//     _id is the (namespace, key) pair, so its unique index is the lock
//     (the seed's unique (BizType, Key) index); a unique index on
//     (ns, key) serves List and guards documents written by hand. A TTL
//     index on expiresAt removes documents of crashed holders an hour
//     (Options.GarbageAfter) after they expire: garbage collection only,
//     never correctness, since an expired document already counts as free.
//   - fencelock_tokens: one counter document per key ever locked,
//     {_id: namespace+"\x00"+key, seq}, incremented with $inc and never
//     deleted, so tokens strictly increase across release, expiry,
//     force-release, garbage collection and server restarts.
//
// Namespace (the seed's BizType) lets several applications share the
// collections; keys of different namespaces never collide.
//
// # Operations
//
// Acquire inserts the lock document. Exactly one concurrent insert
// succeeds; the others get E11000 duplicate key, classified with
// mongo.IsDuplicateKeyError as "held" (a *driver.HeldError naming the
// holder, read with one find), never as a failure. If the document exists
// but has expired, or belongs to the same owner (a retry), one update whose
// filter admits only that ({_id, $or: [{expiresAt ≤ now}, {owner}]}, with
// upsert) takes it over. Then, holding the key, Acquire issues the token
// from the key's counter document:
//
//   - if this Backend knows the last token issued for the key (it got it,
//     or read it from a holder while waiting), the insert already carried
//     last+1, and one compare-and-set of the counter from last to last+1
//     confirms it: it matches only if no token was issued since;
//   - otherwise (or if that compare-and-set misses) $inc on the counter
//     (upsert, returning the new value) issues the token, which is then
//     written into the lock document if it is still its own.
//
// The token is issued after the lock is held on purpose: a token taken
// before could be overtaken by a later holder's and handed out after it.
// A free key costs two round trips when the last token is known, three
// otherwise; until then the document may show a token not (yet) issued.
//
// Renew is one update filtered on {_id, owner, token, expiresAt > now};
// it never upserts, so a late renewal cannot resurrect a released lock.
// With rotation it first takes a new token from the counter. RenewBatch
// renews up to 500 leases with one updateMany plus one find. Release is
// one delete with the same filter; zero deleted means ErrNotHeld.
// ForceRelease is a findOneAndDelete of the unexpired document.
//
// # Time
//
// Expiry is judged by the server's clock. MongoDB's own server-side
// clock ($$NOW) is only reachable through aggregation-pipeline updates and
// $expr, which FerretDB lacks, so the backend estimates the server's clock
// instead: it sends hello, reads the reply's localTime, and takes the
// midpoint of the round trip (the best of three at Open, one more every
// ClockResync, 30s by default). Every time written or compared
// (expiresAt, "now" in filters) is this estimate, which runs on the
// process's monotonic clock, so a jump of the local wall clock changes
// nothing. Two clients' estimates differ by at most the sum of their
// bounds: half a round trip plus 1ms (localTime's resolution) each, plus
// the rate drift since the last sample. The engine's Margin (TTL/10 by
// default) must exceed that; on a LAN it is a few milliseconds.
// ClockBound reports the current bound.
//
// # Guarantees and caveats
//
// On MongoDB every conditional write is atomic per document, so mutual
// exclusion and fencing hold with the default write concern (majority,
// journaled) and read concern (majority); reads go to the primary. Weaker
// concerns are reported by Describe as warnings.
//
// FerretDB v1 (used by the project's tests because MongoDB cannot be
// installed there) executes findAndModify, update and delete as a read
// followed by an unconditional write by _id, without isolation. The
// insert path is still atomic (SQLite's unique index), so taking a free
// key and release/re-acquire cycles stay exclusive and correctly fenced
// there. The takeover of an expired record is an update, though: the
// safety suite (docs/safety.md) measured two contenders taking over the
// same expired key at once, both with the same token, and a renewal or
// release racing a takeover can overwrite the new holder's record.
// Describe warns about it; use MongoDB for production. FerretDB also evaluates every filter other than a lone _id by
// scanning the collection, so its cost grows with the number of held keys.
//
// There is no Watcher: change streams need a replica set and FerretDB has
// none. Waiters poll with the engine's capped backoff, cut short when the
// holder's record is due to expire; each attempt on a held key costs two
// reads' worth of work (the refused insert and the holder look-up).
package mongo
