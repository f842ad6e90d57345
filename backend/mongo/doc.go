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
//   - collection: the collection of lock records and epoch claims,
//     default "fencelock_locks" (token claims: the same collection, or on
//     FerretDB the TokenShards collections TokenCollections names);
//   - namespace: keeps several applications apart in one collection,
//     default "default";
//   - clock_resync: how often the server clock estimate is refreshed
//     (a Go duration), default 30s.
//
// Every other parameter must be a MongoDB connection-string option
// (replicaSet, authSource, tls, w, journal, readConcernLevel, maxPoolSize,
// ...) and goes to the driver; w, journal and readConcernLevel given in the
// URL replace the backend's majority/journaled defaults;
// serverSelectionTimeoutMS and connectTimeoutMS default to
// DefaultServerSelectionTimeout and DefaultConnectTimeout (5s each, not the
// driver's 30s; see "Unreachable servers"). An unknown
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
// therefore never updates a document, and never relies on a conditional
// delete of one that someone else may change. The collection holds:
//
//   - lock records {_id: "r/<rid>", ns, key, owner, token, until, meta}:
//     one per acquisition, inserted once and never written again. rid is a
//     fresh ObjectID followed by a digest of the owner, so a grant with an
//     altered owner names no record. The unique index (ns, key) admits one
//     record per key.
//   - claims, immutable: {_id, ns: 0, key: _id, kind, ...}. A token claim
//     "t/<len(ns)>/<ns>/<token, 20 digits>/<key>" records that a token of
//     a key was issued, and for which record (trec); an epoch claim
//     "e/<rid>/<n>" records who moved a record to epoch n: a renewal (with
//     its expiry, token and metadata) or an end (a takeover or
//     force-release). Their ns is the number 0, so no namespace string
//     collides with them in the (ns, key) index.
//
// On FerretDB the token claims live in collections of their own,
// TokenShards of them (Collection plus TokensSuffix plus "_00" to "_31"),
// each key's claims and hint in the one TokenCollection names for it:
// FerretDB 1.24 reads the whole collection for every delete and find,
// even by _id, so a release would otherwise read every token claim of the
// last GarbageAfter, and every probe of a key's claims would read every
// other key's. On every other server (MongoDB,
// and the Mongo-wire stores whose _id index serves a delete) they share
// the records' collection, so that one ordered insert carries record and
// claim. The layout follows from buildInfo (FerretDB's has a
// ferretdbVersion), so every Backend on one server agrees.
//
// A record's state is its newest epoch claim's (expiry, token, metadata),
// or, without one, the record's own. No _id, key or value contains a NUL
// byte (PostgreSQL's jsonb rejects \u0000); keys are stored as given and
// round-trip exactly.
//
// # Operations
//
//   - Acquire inserts the new record with token t+1 and then the claim
//     of token t+1: one ordered insert where they share a collection, two
//     inserts on FerretDB. t is the last token this Backend
//     claimed for the key if it did so within GarbageAfter/2 (one round
//     trip), else the key's highest token claim, found by finds by _id
//     (see "Finding the highest claim"); such an Acquire reads the key's
//     record first, and refuses a live holder (or takes an expired record
//     over) without inserting. A collision on
//     the record means held: the record and its epoch claims are read and
//     the holder named in a *driver.HeldError, or, if expired, the record
//     is taken over. A collision on the claim means t was stale: the record
//     is deleted and t read again; so is a failed claim insert (with a
//     context of its own, so an abandoned acquire leaves no record). A
//     retry that finds its own owner's live record (an ambiguous reply)
//     is granted it only if the record's token claim names that record
//     (the claim is inserted if missing).
//   - Takeover (and force-release) of an expired record at epoch n: insert
//     the end claim of epoch n+1, then the record's token claim if
//     missing; look for a claim of a later epoch (if one exists the holder
//     had renewed past n+1: withdraw); delete the record and its renewal
//     claims; insert the new record with a token above the old one and
//     every claim. If a renewal claim of epoch n+1 exists, the record is
//     held until that renewal's expiry passes too; then the end claims
//     epoch n+2.
//   - Renew inserts the claim of epoch n+1 carrying the new expiry (with
//     Rotate, a token claimed first like an acquire's; with SetMetadata,
//     the new metadata, which later renewals carry forward), then deletes
//     the claim of epoch n. RenewBatch inserts the claims of up to 500
//     grants in one unordered insert and deletes the previous claims in one
//     statement. The record is never written: FerretDB writes one
//     document per transaction, and an update of 100 records cost seconds.
//   - Release deletes the record by its _id alone (and the newest renewal
//     claim by its _id): one round trip for a grant never renewed.
//   - HighWater and RaiseFloor (driver.TokenFloorer) read the token claims;
//     a floor is a token claim of h+1 (h the key's highest) carrying the
//     floor, so the next claim is above it.
//
// A Backend remembers, per record, the newest grant it issued. A grant it
// does not know as newest (one from before a rotation, one the engine built
// from Inspect, another Backend's) is checked against the store (the record
// and its claims read back: same record, owner and token, live) before it is
// renewed or released.
//
// # Why it is safe
//
// Every move of a record after its insert is the unique insert of its next
// epoch claim, and a holder deletes the claim of epoch n only after its
// claim of epoch n+1 exists, so the newest existing claim is always the
// record's last move. Interleavings:
//
//   - Two contenders, one expired record: both read epoch n; one end
//     claim of n+1 wins, the other collides and reports held. A contender
//     that reads after the winner cleaned up finds no record (its _id is
//     never reused) and its insert collides on (ns, key) with the winner's
//     record, or its token claim with the winner's token.
//   - Holder renewing at expiry against a takeover: both claim epoch n+1;
//     one wins. If the renewal wins, the contender reports held until the
//     renewal's expiry; if the end wins, the renewal is ErrNotHeld.
//   - A contender paused between reading epoch n and inserting its end
//     claim, while the holder renewed twice: the claim of n+1 was deleted,
//     so the end claim succeeds, but the holder's claim of n+2 (or later)
//     existed before it (a claim is deleted only after its successor is
//     inserted), so the look for a later claim finds it and the contender
//     withdraws. If the look finds none, no renewal of the record can ever
//     succeed again: its next epoch is the end claim's, which stays
//     until GarbageAfter has passed.
//   - A stale renewal or release (after a rotation, after the Backend's own
//     release): the Backend does not know the grant as newest, so it reads
//     the record first and refuses a grant that is not its live holder.
//     A release removes the record by an _id that names the acquisition;
//     a later holder's record has another.
//   - Tokens: a key's records are serialized by the (ns, key) index, and
//     the token of each is claimed by a unique insert after the record is
//     in (so after every earlier record of the key was removed, and with
//     it released); every base is either this Backend's own last claim
//     or the highest claim read. Token claims below a key's highest are
//     deleted only when older than GarbageAfter, and an own base, or a
//     start of a walk, is used for at most GarbageAfter/2, so a stale base
//     always meets the claim of its next token.
//     Assumption: no write is delayed in flight by more than
//     GarbageAfter/2 (30 minutes by default) before the server applies
//     it.
//
// # Finding the highest claim
//
// MongoDB serves a sorted find over a key's claims from the (tns, tkey,
// token) index; FerretDB 1.24 reads and decodes the whole tokens
// collection for it (a claim per acquisition of the last GarbageAfter):
// 360 ms at 10,000 claims on the SQLite handler, against 16 ms for a find
// by _id (BenchmarkHighestClaimRead in bench/mongo). So the highest claim
// is walked to by _id from a start, a base that was the key's highest less
// than GarbageAfter/2 ago: this Backend's own last claim, the base whose
// next claim just collided, or the key's hint document
// ("h/<len(ns)>/<ns>/<key>": a base and the moment it was the highest,
// rewritten by walks of four finds or more and by every sorted find).
// Above a start, every claim is younger than GarbageAfter/2, so none is
// garbage, and tokens are consecutive (each claim is of base+1 for an
// existing claim's base) but for the gap a floor claim leaves below its
// floor. The walk probes start+1, +2, +4, … until a claim is missing,
// bisects to the last claim p whose p+1 is missing, and goes on from p's
// floor if p carries one; otherwise p is the highest (as of the probe: a
// later claim only makes the insert collide). The claim of token 1 is
// never deleted: a key's first claim is always of token 1 (every base is
// an existing claim, or a record's token, which its takeover claims), so
// without a start (no recent hint either) one find by _id of it tells a
// fresh key (base 0), and if it was made less than GarbageAfter/2 ago its
// base is a start; only a key with claims and no recent start, or a walk
// past 48 finds, is read with the sorted find.
//
// # Time
//
// Expiry is judged by the server's clock. MongoDB's own server-side
// clock ($$NOW) is only reachable through aggregation-pipeline updates and
// $expr, which FerretDB lacks, so the backend estimates the server's clock
// from hello's localTime: a hello sent at local time s and answered at r
// read the server's clock somewhere in [s, r], so the midpoint is within
// (r−s)/2 + 1ms (localTime's resolution). The estimate runs on the
// process's monotonic clock and its bound grows by 500 ppm of drift with
// age (1ms per 2s). The best of three samples is taken at Open, one more
// every ClockResync (30s by default); a sample replaces the estimate only
// if its bound is no wider than the estimate's bound grown by that drift,
// so a hello that a stalled server answered late (a 3s round trip, ±1.5s)
// never replaces a tight estimate. ClockBound reports the bound now.
//
// Both edges of the bound are used, so two clients' errors never add up
// against a holder: a record's expiry (at acquire and renewal) counts from
// the latest the server's clock can read (estimate + bound), and another
// owner's record is judged expired only when the earliest it can read
// (estimate − bound) has passed its expiry. A takeover then happens only
// after the record lived its TTL by the server's clock, whatever the two
// bounds; the holder's Margin (TTL/10 by default) has only to absorb the
// rate difference between its clock and the server's over one TTL. If the
// bound is wider than a tenth of the Acquire's TTL (no tight sample since
// the server stalled), the Acquire samples again (at most once a second)
// and, if still too wide, does not take the record over: it returns an
// error matching ErrClockUncertain and driver.ErrNotAcquired, so the
// engine keeps waiting as for a held key. A free key (no record) is
// granted whatever the bound. A step of the server's own wall clock is
// not detected: run it under NTP, slewing.
//
// # GarbageAfter belongs to the collection
//
// A Backend builds its next token of a key on its own last claim for
// GarbageAfter/2 without reading, while every Backend's garbage collection
// deletes claims older than GarbageAfter: the value must be the same for
// every Backend on a collection. The first one records it in the
// collection (document "c/garbageAfter", immutable); later ones given
// none, as every Backend opened from a URL, adopt it, so a roll-out that
// changes the option keeps running on the recorded value; one given
// another value fails New and Open with a *GarbageAfterError
// (ErrGarbageAfter), which changes nothing. To change the value, stop
// every Backend of the collection, delete that document (and on MongoDB
// the fencelock_garbage index), and start them with the new value.
//
// # Unreachable servers
//
// Every command runs on the call's context. On a client it opened (Open)
// the backend watches the driver's heartbeats: once no server takes writes
// and the last heartbeat failed, commands waiting for a server end at
// once, and later calls fail without waiting, with an *UnreachableError
// (ErrUnreachable) that wraps the failure (a refused connection matches
// syscall.ECONNREFUSED) until a heartbeat succeeds again; a background
// ping keeps the driver checking every 500ms meanwhile. A server that
// stops answering without refusing (a paused process, a dropped network)
// is noticed when a heartbeat times out (connectTimeoutMS), or the call's
// deadline ends it first. On a caller-owned client (New) the client's own
// settings apply; a server-selection error still wraps the failures the
// driver recorded for its servers.
//
// # Guarantees and caveats
//
// With the default write concern (majority, journaled) and read concern
// (majority) on a MongoDB replica set, exclusion and fencing survive a
// failover. Weaker concerns, and a standalone mongod, are reported by
// Describe as warnings. FerretDB has no replica set; its durability is its
// handler's (SQLite or PostgreSQL). Expired records stay until their key
// is taken again; claims are collected by age (GarbageAfter).
//
// There is no Watcher: change streams need a replica set and FerretDB has
// none. Waiters poll with the engine's capped backoff, cut short when the
// holder's record is due to expire.
package mongo
