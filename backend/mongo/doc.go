// Package mongo is fencelock's MongoDB backend, on go.mongodb.org/mongo-driver/v2.
//
// # URLs
//
// Importing the package registers the schemes Scheme (mongodb://) and
// SchemeSRV (mongodb+srv://) with fencelock.Open; Open and OpenURL take
// the same URLs, and New takes a caller-owned client and *Options:
//
//	c, err := fencelock.Open(ctx, "mongodb://db1,db2,db3/app?replicaSet=rs0&namespace=billing", nil)
//
//	b, err := mongo.New(ctx, client, &mongo.Options{Namespace: "billing"}) // caller-owned *mongo.Client
//	c, err := fencelock.New(b, nil)
//
// Schemes: mongodb:// and mongodb+srv:// (case-insensitive). Parameters of
// fencelock's own (each optional):
//
//   - database: the collection's database; default the URL's path
//     (mongodb://host/app), else "fencelock";
//   - collection: the collection of lock records and claims, default
//     "fencelock_locks";
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
// # Design: unique inserts only
//
// Mongo-wire stores agree on one atomic primitive: inserting a document
// under a unique index. FerretDB (both handlers) runs update, delete and
// findAndModify as a read followed by a write by _id, without isolation,
// so a filter it evaluated may no longer hold when it writes. The backend
// therefore never relies on a conditional update or delete of a document
// that someone else may change at the same time. One collection holds:
//
//   - lock records {_id: fresh ObjectID, ns, key, owner, token, epoch,
//     expiresAt}: one per acquisition, never reused. The unique index
//     (ns, key) admits one record per key.
//   - claims, immutable: {_id, ns: 0, key: _id, kind, ...}. A token claim
//     "t/<len(ns)>/<ns>/<token, 20 digits>/<key>" records that a token of
//     a key was issued; an epoch claim "e/<record _id>/<n>" records who
//     moves a record to epoch n (a renewal, with the new expiry, or an
//     end: a takeover or force-release). Their ns is the number 0, so no
//     namespace string collides with them in the (ns, key) index.
//
// No _id, key or value contains a NUL byte (PostgreSQL's jsonb rejects
// \u0000); keys are stored as given and round-trip exactly.
//
// # Operations
//
//   - Acquire inserts, in one ordered insert, the new record with token
//     t+1 and the claim of token t+1. t is the last token this Backend
//     claimed for the key if it did so within GarbageAfter/2 (one round
//     trip), else the key's highest token claim (one find by _id of the
//     claim of token 1, which is never deleted, so its absence means a
//     fresh key; otherwise one more find for the highest). A
//     collision on the record means held: the record is read and named in
//     a *driver.HeldError, or, if expired, taken over. A collision on the
//     claim means t was stale: the record is deleted and t read.
//   - Takeover of an expired record r at epoch n: claim epoch n+1 of r
//     with an end claim (and r's token, if unclaimed); delete r and r's
//     epoch claims; insert the new record with a token above r's and every
//     claim. If a renewal claim of epoch n+1 exists, r is held until that
//     renewal's expiry passes too; then the end claims epoch n+2.
//   - Renew claims epoch n+1 of its record with a renewal claim carrying
//     the new expiry (and, with Rotate, a newly claimed token), writes
//     epoch, expiry and token into the record, and deletes the claim of
//     epoch n. RenewBatch does this for up to 500 records with four
//     commands: one unordered insert of all their claims, one updateMany
//     per (epoch, owner) group filtered on _id ∈ group and that epoch
//     (usually one), one find reading them back and one delete of the
//     previous claims. Never a bulk of one update statement per record:
//     FerretDB 1.24 holds every statement's read open until the command
//     ends and takes another pooled connection per write, so a bulk as
//     large as its pool (50 on PostgreSQL, 100 on SQLite) deadlocks the
//     server. Release deletes the record by its _id.
//   - HighWater and RaiseFloor (driver.TokenFloorer) read the token claims;
//     a floor is a token claim of h+1 (h the key's highest) carrying the
//     floor, so the next claim is above it.
//
// # Why it is safe
//
// Only the winner of a record's epoch claim n+1 (a unique insert) writes
// the record while it is at epoch n, and every such write is filtered on
// epoch ∈ {n, n+1}: a filter FerretDB reads stays true until it writes,
// because nobody else can move the epoch. Interleavings:
//
//   - Two contenders, one expired record: both read epoch n; one end
//     claim of n+1 wins, the other collides and reports held. A contender
//     that read before the winner's delete and claims again after the
//     winner cleaned up deletes nothing (the record is gone; _ids are
//     never reused) and its insert collides on (ns, key) with the winner's
//     record, or its token claim with the winner's token.
//   - Holder renewing at expiry vs a takeover: both claim epoch n+1; one
//     wins. If the renewal wins, the contender reports held until the
//     renewal's expiry; if the end wins, the renewal is ErrNotHeld. A
//     renewal's late write cannot revive a deleted record (an update never
//     upserts) and cannot reach a new record (fresh _id).
//   - A batch renewal against takeovers: its updateMany names only
//     records whose epoch n+1 this call has just claimed, and FerretDB
//     reads them, then writes each by _id. Between that read and a write
//     only an end claim of n+2 could move a record, and it needs the
//     renewal claim's own expiry (now+TTL) to pass first; an end that
//     claimed n+1 earlier made this call's claim collide (that grant is
//     renewed alone, by Renew, and fails) or, if its claim was already
//     cleaned up, deleted the record first, so the update finds nothing
//     and never inserts. Every grant is confirmed by reading its record
//     back with the claimed epoch and expiry.
//   - Release racing a takeover: both delete the same _id; the new record
//     has another _id. The release reports ErrNotHeld unless its delete
//     removed the record.
//   - Tokens: a key's records are serialized by the (ns, key) index, and
//     the token of each is claimed by a unique insert in the same command,
//     after the record; every base is either this Backend's own last claim
//     or the highest claim read. Token claims below a key's highest are
//     deleted only when older than GarbageAfter, and an own base is used
//     for at most GarbageAfter/2, so a base can only miss a claim that
//     was made before it was learned, which cannot be (the key's records
//     are serialized). The claim of token 1 is never deleted: a key's
//     first claim is always of token 1 (every base is an existing claim,
//     or a record's token, which its takeover claims), so its absence
//     proves the key has no claims and a base of 0 is the highest.
//     Assumption: no request is delayed in flight by more
//     than GarbageAfter/2 (30 minutes by default).
//
// # Time
//
// Expiry is judged by the server's clock. MongoDB's own server-side
// clock ($$NOW) is only reachable through aggregation-pipeline updates and
// $expr, which FerretDB lacks, so the backend estimates the server's clock
// from hello's localTime (the midpoint of the round trip; the best of
// three at Open, one more every ClockResync, 30s by default). Every time
// written or compared is this estimate, which runs on the process's
// monotonic clock. Two clients' estimates differ by at most the sum of
// their bounds (half a round trip plus 1ms each, plus drift since the
// last sample); the engine's Margin (TTL/10 by default) must exceed it.
// ClockBound reports the current bound.
//
// # Guarantees and caveats
//
// With the default write concern (majority, journaled) and read concern
// (majority) on a MongoDB replica set, exclusion and fencing survive a
// failover. Weaker concerns, and a standalone mongod, are reported by
// Describe as warnings. FerretDB has no replica set; its durability is its
// handler's (SQLite or PostgreSQL). FerretDB has no TTL indexes: expired
// records stay until their key is taken again.
//
// There is no Watcher: change streams need a replica set and FerretDB has
// none. Waiters poll with the engine's capped backoff, cut short when the
// holder's record is due to expire.
package mongo
