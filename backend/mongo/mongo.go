package mongo

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/fencelock/fencelock/driver"
)

// Backend is a lock store in a MongoDB (or MongoDB wire-compatible)
// database. It implements driver.Backend, driver.BatchRenewer,
// driver.ForceReleaser, driver.TokenFloorer and driver.Describer. It is
// safe for concurrent use.
type Backend struct {
	client *mongo.Client
	owned  bool // Close disconnects client
	o      Options
	locks  *mongo.Collection // lock records and epoch claims
	// tokenColls hold the token claims: just locks, or on FerretDB the
	// TokenShards collections Collection+TokensSuffix+"_NN", a key's
	// claims (and hint) in the one shard picks (see tokens).
	tokenColls []*mongo.Collection
	// highColls are tokenColls read with read concern "local", for the
	// highest claim of a key (see highestClaim).
	highColls []*mongo.Collection
	clock     *serverClock
	closed    atomic.Bool
	// reach follows the deployment's heartbeats, to fail calls fast
	// while it does not answer (nil on a caller-owned client).
	reach *reach

	ferret   bool   // the server is FerretDB
	version  string // server version as buildInfo reports it
	replSet  bool   // the server is a replica-set member
	ttlIndex bool   // the garbage TTL index exists

	ownMu    sync.Mutex
	own      map[string]ownToken // per key: the highest token this backend claimed
	warnings []string

	collects   atomic.Int64 // calls of collect, for its rarer sweep
	collecting atomic.Bool  // a batch of garbage deletes runs
	life       context.Context
	stop       context.CancelFunc
	bgMu       sync.Mutex     // orders bg.Add after Close's check
	bg         sync.WaitGroup // the running batch of garbage deletes

	heldMu sync.Mutex
	held   map[string]heldGrant // per record (rid): the newest grant this backend issued

	// testHookRecordRead, if set (tests only, before first use), runs
	// in each read of records and their epoch claims between the two.
	testHookRecordRead func()
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// ErrOldFormat is returned by New and Open, on FerretDB, for a records'
// collection, or a collection Collection+TokensSuffix, that holds token
// claims, as the development builds before TokenShards wrote them there:
// ignoring them would issue its keys' tokens from 1 again. Use a new
// collection.
var ErrOldFormat = errors.New("the collection holds token claims of an earlier development format; use a new collection")

// oneCollection makes every server use the single-collection layout
// (token claims with the records), as MongoDB does; set by tests only.
var oneCollection bool

// split reports whether token claims have collections of their own
// (FerretDB) rather than sharing the records' collection.
func (b *Backend) split() bool { return b.tokenColls[0] != b.locks }

// tokens returns the collection of key's token claims and hint.
func (b *Backend) tokens(key string) *mongo.Collection { return b.tokenColls[b.shard(key)] }

// highs returns tokens(key) read with read concern "local".
func (b *Backend) highs(key string) *mongo.Collection { return b.highColls[b.shard(key)] }

// shard returns the index in tokenColls of key's token claims: 0 where
// there is one collection, else shardOf(namespace, key).
func (b *Backend) shard(key string) int {
	if len(b.tokenColls) == 1 {
		return 0
	}
	return shardOf(b.o.Namespace, key)
}

// shardOf is the shard of namespace's key: the FNV-1a hash of the
// namespace's length, the namespace and the key, modulo TokenShards.
func shardOf(namespace, key string) int {
	h := fnv.New32a()
	_, _ = io.WriteString(h, strconv.Itoa(len(namespace))+"/"+namespace+"/"+key)
	return int(h.Sum32() % TokenShards)
}

// tokenID is the _id of the claim of token tok for key: unambiguous
// (the namespace is length-prefixed, the token fixed-width) and free of
// NUL bytes, which PostgreSQL's jsonb rejects.
func (b *Backend) tokenID(key string, tok int64) string {
	return "t/" + strconv.Itoa(len(b.o.Namespace)) + "/" + b.o.Namespace + "/" + fmt.Sprintf("%020d", tok) + "/" + key
}

// ownToken is a token this backend claimed itself, and when.
type ownToken struct {
	tok int64
	at  time.Time
}

// New returns a Backend on a caller-owned client. Close does not
// disconnect the client. New creates the collection's indexes if missing
// and measures the server's clock offset.
func New(ctx context.Context, client *mongo.Client, opts *Options) (*Backend, error) {
	if client == nil {
		return nil, errors.New("mongo: New: nil *mongo.Client")
	}
	return newBackend(ctx, client, false, opts)
}

func newBackend(ctx context.Context, client *mongo.Client, owned bool, opts *Options) (*Backend, error) {
	return openBackend(ctx, client, owned, nil, opts)
}

// openBackend is newBackend with the reach of an owned client (nil for a
// caller's): its commands run on begin's context.
func openBackend(ctx context.Context, client *mongo.Client, owned bool, r *reach, opts *Options) (_ *Backend, err error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	// GarbageAfter belongs to the collection (see garbageAfter): a zero
	// one adopts the collection's.
	explicitGarbage := opts != nil && opts.GarbageAfter != 0
	db := client.Database(o.Database)
	copts := options.Collection().
		SetWriteConcern(o.WriteConcern).
		SetReadConcern(o.ReadConcern).
		SetReadPreference(readpref.Primary())
	b := &Backend{
		client: client,
		owned:  owned,
		o:      o,
		locks:  db.Collection(o.Collection, copts),
		clock:  &serverClock{db: db, resync: o.ClockResync},
		reach:  r,
	}
	b.life, b.stop = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			b.stop()
		}
	}()
	ctx, end := b.begin(ctx)
	defer func() { err = end(err) }()
	if err := b.clock.sample(ctx, 3); err != nil {
		return nil, fmt.Errorf("mongo: reading the server's clock (hello): %w", err)
	}
	var hello struct {
		SetName string `bson:"setName"`
	}
	if err := db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return nil, fmt.Errorf("mongo: hello: %w", err)
	}
	b.replSet = hello.SetName != ""
	// The layout below depends on the server: every Backend on it must
	// agree, so buildInfo must answer.
	var bi bson.M
	if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&bi); err != nil {
		return nil, fmt.Errorf("mongo: buildInfo: %w", err)
	}
	b.version, _ = bi["version"].(string)
	_, b.ferret = bi["ferretdbVersion"]
	// FerretDB reads a whole collection for every delete and find, even
	// by _id: keep the token claims (one per acquisition, kept for
	// GarbageAfter) out of the collection that releases delete from, and
	// spread them by key over TokenShards collections, so that a walk's
	// find by _id scans about 1/TokenShards of them, not every key's.
	// Elsewhere the _id index serves those, and one ordered insert of
	// record and claim saves a round trip.
	highOpts := options.Collection().
		SetReadConcern(readconcern.Local()).
		SetReadPreference(readpref.Primary())
	if !b.ferret || oneCollection {
		b.tokenColls = []*mongo.Collection{b.locks}
		b.highColls = []*mongo.Collection{db.Collection(o.Collection, highOpts)}
	} else {
		for _, name := range TokenCollections(o.Collection) {
			b.tokenColls = append(b.tokenColls, db.Collection(name, copts))
			b.highColls = append(b.highColls, db.Collection(name, highOpts))
		}
		// Token claims used to live in the records' collection on every
		// server, then in one collection Collection+TokensSuffix on
		// FerretDB; a Backend that ignored them would issue tokens from 1
		// again.
		for _, name := range []string{o.Collection, o.Collection + TokensSuffix} {
			err := db.Collection(name).FindOne(ctx, bson.D{{Key: "kind", Value: kindToken}}, options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
			switch {
			case err == nil:
				return nil, fmt.Errorf("mongo: %s.%s: %w", o.Database, name, ErrOldFormat)
			case !errors.Is(err, mongo.ErrNoDocuments):
				return nil, fmt.Errorf("mongo: reading %s.%s: %w", o.Database, name, err)
			}
		}
	}
	if err := b.garbageAfter(ctx, explicitGarbage); err != nil {
		return nil, err
	}
	type index struct {
		c *mongo.Collection
		m mongo.IndexModel
	}
	indexes := []index{{b.locks, mongo.IndexModel{
		Keys:    bson.D{{Key: "ns", Value: 1}, {Key: "key", Value: 1}},
		Options: options.Index().SetUnique(true).SetName("fencelock_ns_key"),
	}}}
	// FerretDB 1.24 serves no query from a secondary index (SQLite
	// pushes down only an _id equality, PostgreSQL filters with jsonb @>,
	// which a btree index cannot serve): there they would only slow every
	// insert, so only the unique (ns, key) index, which excludes, is made.
	if !b.split() {
		indexes = append(indexes, index{b.locks, mongo.IndexModel{
			Keys:    bson.D{{Key: "rec", Value: 1}, {Key: "n", Value: 1}},
			Options: options.Index().SetName("fencelock_epochs"),
		}}, index{b.locks, mongo.IndexModel{
			Keys:    bson.D{{Key: "tns", Value: 1}, {Key: "tkey", Value: 1}, {Key: "token", Value: 1}},
			Options: options.Index().SetName("fencelock_tokens"),
		}})
	}
	// One createIndexes per index: FerretDB 1.24 panics on a command
	// creating several indexes when they exist already.
	for _, ix := range indexes {
		if _, err := ix.c.Indexes().CreateOne(ctx, ix.m); err != nil {
			return nil, fmt.Errorf("mongo: creating the indexes on %s.%s: %w", o.Database, ix.c.Name(), err)
		}
	}
	_, err = b.locks.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: "expiresAt", Value: 1}},
		Options: options.Index().SetExpireAfterSeconds(int32(b.o.GarbageAfter / time.Second)).SetName("fencelock_garbage"),
	})
	var ce mongo.CommandError
	switch {
	case err == nil:
		b.ttlIndex = true
	case errors.As(err, &ce) && (ce.Code == 238 || ce.Name == "NotImplemented"):
		// FerretDB has no TTL indexes: expired renewal claims are
		// deleted by collect, like end claims and old token claims.
	case errors.As(err, &ce) && (ce.Code == 85 || ce.Code == 86):
		// IndexOptionsConflict: the index exists with another
		// expireAfterSeconds (another GarbageAfter); keep it.
		b.ttlIndex = true
	default:
		return nil, fmt.Errorf("mongo: creating the garbage TTL index on %s.%s: %w", o.Database, o.Collection, err)
	}
	b.warnings = b.detectWarnings()
	ok = true
	return b, nil
}

func (b *Backend) detectWarnings() []string {
	var w []string
	if s := weakWrites(b.o.WriteConcern); s != "" {
		w = append(w, s)
	}
	if lvl := b.o.ReadConcern.Level; lvl != "majority" && lvl != "linearizable" {
		w = append(w, "read concern is "+fmt.Sprintf("%q", lvl)+", not majority: Inspect and List may report a state that a failover rolls back")
	}
	if !b.ferret && !b.replSet {
		w = append(w, "server is a standalone mongod, not a replica set: w:majority is satisfied by one node")
	}
	return w
}

// Client returns the underlying client.
func (b *Backend) Client() *mongo.Client { return b.client }

// Options returns the backend's options with defaults filled in, and
// GarbageAfter as the collection records it.
func (b *Backend) Options() Options { return b.o }

// ClockBound returns the error bound of the current estimate of the
// server's clock: half the round trip of the hello it came from, plus 1ms,
// plus 500 ppm of drift since. Expiries are written at its late edge and
// judged at its early edge (see "Caveats" in docs/backends/mongo.md); an
// Acquire does not take over an expired record while it is wider than a
// tenth of the Acquire's TTL.
func (b *Backend) ClockBound() time.Duration { return b.clock.Bound() }

func (b *Backend) check(ctx context.Context) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return ctx.Err()
}

// expiry returns now+ttl as a BSON date, rounded up to the millisecond.
func expiry(now time.Time, ttl time.Duration) bson.DateTime {
	ms := now.UnixMilli() + (ttl + time.Millisecond - 1).Milliseconds()
	return bson.DateTime(ms)
}

func date(t time.Time) bson.DateTime { return bson.DateTime(t.UnixMilli()) }

func expired(e bson.DateTime, now time.Time) bool { return !e.Time().After(now) }

// writeErrorAt returns the code of the write error of bulk index i, 0 if
// that document was written, or -1 if err is not a bulk write error.
func writeErrorAt(err error, i int) int {
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) {
		return -1
	}
	for _, we := range bwe.WriteErrors {
		if we.Index == i {
			if we.HasErrorCode(11000) || we.HasErrorCode(11001) || we.HasErrorCode(12582) {
				return 11000
			}
			return we.Code
		}
	}
	return 0
}

// cacheAge bounds how long a token this backend claimed is used as the
// base of its next claim without reading the key's highest claim. Token
// claims are garbage only once older than GarbageAfter; a base younger
// than half that can only miss a claim that never existed (see "Why it
// is safe" in docs/backends/mongo.md).
func (b *Backend) cacheAge() time.Duration { return b.o.GarbageAfter / 2 }

// ownBase returns the last token this backend claimed for key, if recent.
func (b *Backend) ownBase(key string) (int64, bool) {
	b.ownMu.Lock()
	defer b.ownMu.Unlock()
	t, ok := b.own[key]
	if !ok || time.Since(t.at) > b.cacheAge() {
		return 0, false
	}
	return t.tok, true
}

// maxOwn bounds the number of keys whose last token a Backend remembers.
const maxOwn = 1 << 16

// remember records a token this backend claimed for key just now.
func (b *Backend) remember(key string, tok int64) {
	b.ownMu.Lock()
	defer b.ownMu.Unlock()
	if b.own == nil || len(b.own) >= maxOwn {
		b.own = make(map[string]ownToken)
	}
	if tok >= b.own[key].tok {
		b.own[key] = ownToken{tok: tok, at: time.Now()}
	}
}

// highestClaim returns the base of key's next token claim: the larger of
// its highest claim's token and the floor that claim carries (0 if none),
// and collects garbage (see collect). from is a base that was the key's
// highest less than GarbageAfter/2 ago, or noStart: one is then found
// in the key's hint or its claim of token 1. From a start, the highest claim is found by _id (see
// walk); without one, or when the walk is too long, by the sorted find
// (see scanHighest), and the key's hint is rewritten.
func (b *Backend) highestClaim(ctx context.Context, key string, now time.Time, from int64) (int64, error) {
	if from == noStart {
		var err error
		if from, err = b.readHint(ctx, key, now); err != nil {
			return 0, err
		}
	}
	if from == noStart {
		// A key's first claim is always of token 1 (every claim's base
		// is an existing claim or a record's token, claimed by the
		// takeover that ends it), and that claim is never deleted: a key
		// without it has no claims. If it was made less than
		// GarbageAfter/2 ago, its base (1, or the floor it carries) was
		// the highest then: a start.
		c1, ok, err := b.probe(ctx, key, 1)
		switch {
		case err != nil:
			return 0, err
		case !ok:
			return 0, nil
		case c1.At.Time().After(now.Add(-b.cacheAge())):
			from = max(c1.Token, c1.Floor)
		}
	}
	if from != noStart {
		base, top, probes, ok, err := b.walk(ctx, key, from)
		if err != nil {
			return 0, err
		}
		if ok {
			if probes >= hintAfterProbes {
				b.writeHint(ctx, key, base, now)
			}
			b.collect(key, top, now)
			return base, nil
		}
	}
	base, top, err := b.scanHighest(ctx, key)
	if err != nil {
		return 0, err
	}
	if top > 0 {
		b.writeHint(ctx, key, base, now)
	}
	b.collect(key, top, now)
	return base, nil
}

// scanHighest reads key's highest token claim with a sorted find and
// returns the base of the next claim and the highest claim's token (0, 0
// if there is none).
//
// Its find (like walk's) reads with read concern "local": a claim that
// just refused ours (the unique index is the primary's) may not be
// majority-committed yet, and a majority read would return the same base
// again, so the retry would collide again until the commit point moved. A
// local read can only return a higher base, from a claim that a failover
// may later roll back: that skips tokens, never reuses one (tokens are
// issued by unique inserts, not by this read).
func (b *Backend) scanHighest(ctx context.Context, key string) (base, top int64, err error) {
	var c claimDoc
	err = b.highs(key).FindOne(ctx, bson.D{{Key: "tns", Value: b.o.Namespace}, {Key: "tkey", Value: key}},
		options.FindOne().SetSort(bson.D{{Key: "tns", Value: -1}, {Key: "tkey", Value: -1}, {Key: "token", Value: -1}})).Decode(&c)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	return max(c.Token, c.Floor), c.Token, nil
}

// collect deletes garbage; an acquire that reads a key's highest claim
// calls it. Once every 64 tokens of a key (tok is the key's newest): the
// key's token claims below tok older than GarbageAfter (except the claim
// of token 1). Once every 1024 calls on this Backend:
// end claims made, and renewal claims expired, GarbageAfter ago, of any
// record. Claims are immutable, so these filters hold at the delete as
// they held when read, on every server. Each filter starts with
// equalities, which FerretDB's PostgreSQL handler evaluates in SQL.
//
// The deletes run in the background, one batch at a time per Backend (a
// batch due while another runs is skipped: the next one covers it), off
// the acquire's path: FerretDB reads the whole collection for each. Close
// cancels a running batch and waits for it.
func (b *Backend) collect(key string, tok int64, now time.Time) {
	keyDue := tok > 1 && tok%64 == 0
	allDue := b.collects.Add(1)%1024 == 0
	if !keyDue && !allDue || !b.collecting.CompareAndSwap(false, true) {
		return
	}
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if b.closed.Load() {
		b.collecting.Store(false)
		return
	}
	b.bg.Add(1)
	go func() {
		defer b.bg.Done()
		defer b.collecting.Store(false)
		ctx, cancel := context.WithTimeout(b.life, collectTimeout)
		defer cancel()
		old := date(now.Add(-b.o.GarbageAfter))
		if keyDue {
			_, _ = b.tokens(key).DeleteMany(ctx, bson.D{
				{Key: "tns", Value: b.o.Namespace}, {Key: "tkey", Value: key},
				{Key: "token", Value: bson.D{{Key: "$gt", Value: 1}, {Key: "$lt", Value: tok}}},
				{Key: "at", Value: bson.D{{Key: "$lt", Value: old}}},
			})
		}
		if allDue {
			_, _ = b.locks.DeleteMany(ctx, bson.D{{Key: "kind", Value: kindEnd}, {Key: "at", Value: bson.D{{Key: "$lt", Value: old}}}})
			_, _ = b.locks.DeleteMany(ctx, bson.D{{Key: "kind", Value: kindRenew}, {Key: "expiresAt", Value: bson.D{{Key: "$lt", Value: old}}}})
		}
	}()
}

// collectTimeout bounds one background batch of garbage deletes.
const collectTimeout = time.Minute

// ErrTokenOverflow reports that a key's highest token claim (or floor) is
// 2^63-1, the largest BSON int64, so no higher token can be issued: an
// Acquire and a rotating renewal of the key are refused and change
// nothing. It also matches driver.ErrUnsupported, so the engine takes it
// as an answer and does not retry. Only a floor raised near 2^63-1 could
// get a key there.
var ErrTokenOverflow = errors.New("mongo: token at 2^63-1")

// overflowError is the error for key's tokens at 2^63-1.
type overflowError struct{ key string }

func (e *overflowError) Error() string {
	return fmt.Sprintf("mongo: the highest token of %q is 2^63-1, the largest BSON int64: no higher token can be issued", e.key)
}

// Is matches ErrTokenOverflow and driver.ErrUnsupported.
func (e *overflowError) Is(target error) bool {
	return target == ErrTokenOverflow || target == driver.ErrUnsupported
}

// tokenClaim is the claim of token tok of key for the record rid ("" for
// a floor).
func (b *Backend) tokenClaim(key string, tok int64, rid string, now time.Time) claimDoc {
	id := b.tokenID(key, tok)
	return claimDoc{ID: id, Key: id, Kind: kindToken, TNS: b.o.Namespace, TKey: key, Token: tok, TRec: rid, At: date(now)}
}

// maxClaimRounds bounds the collisions of one token claim: past it the
// caller gets errTokenRace, a transient error (the engine retries an
// Acquire, and a rotation at the next renewal).
const maxClaimRounds = 32

// errTokenRace is the transient error of a claim that collided
// maxClaimRounds times.
var errTokenRace = errors.New("mongo: token claimed concurrently; retry")

// claimBackoff waits before attempt round+1 of a token claim whose
// attempt round collided with another claim: not at all for the first
// two (a fresh read of the highest claim usually wins), then a jittered
// wait that doubles up to 32ms. A collision means another claim was
// inserted, so some caller always makes progress and a caller only
// loses while others win; the wait keeps a loser from spinning the
// store. It returns errTokenRace after maxClaimRounds collisions, and
// the context's error if the context ends first.
func claimBackoff(ctx context.Context, round int) error {
	if round+1 >= maxClaimRounds {
		return errTokenRace
	}
	if round < 2 {
		return ctx.Err()
	}
	d := time.Millisecond << min(round-2, 5)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// claimToken claims the next token of key for its holder, the record rid
// (a rotation). A collision with another claim makes it read the highest
// claim again and retry (see claimBackoff).
func (b *Backend) claimToken(ctx context.Context, key, rid string, now time.Time) (int64, error) {
	base, fresh := b.ownBase(key)
	for round := 0; ; round++ {
		if !fresh || round > 0 {
			start := int64(noStart)
			if round > 0 {
				start = base // the highest a moment ago; base+1 exists
			}
			var err error
			if base, err = b.highestClaim(ctx, key, now, start); err != nil {
				return 0, err
			}
		}
		if base == math.MaxInt64 {
			return 0, &overflowError{key}
		}
		_, err := b.tokens(key).InsertOne(ctx, b.tokenClaim(key, base+1, rid, now))
		if err == nil {
			b.remember(key, base+1)
			return base + 1, nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return 0, err
		}
		if err := claimBackoff(ctx, round); err != nil {
			return 0, err
		}
		now = b.clock.now(ctx) // the claim's date, for collect
	}
}

// Describe implements driver.Describer.
func (b *Backend) Describe() driver.Description {
	server := "MongoDB " + b.version
	if b.ferret {
		server = "FerretDB (MongoDB " + b.version + " wire protocol)"
	}
	wc := b.o.WriteConcern
	majority := wc != nil && wc.W == "majority" && wc.Journal != nil && *wc.Journal
	failover := "writes acknowledged by a journaled majority survive the loss of the primary"
	switch {
	case b.ferret:
		failover = "FerretDB stores in its own backend (SQLite or PostgreSQL): no replica set, durability is that backend's"
	case !majority:
		failover = "the write concern is weaker than journaled majority: a failover can lose acknowledged grants and token claims"
	}
	return driver.Description{
		Name: "mongo",
		Fencing: "per-key token claims (immutable documents under the unique _id index; token n+1 is issued by the one insert that claims it), " +
			"inserted with the record they fence; exclusion and fencing rest only on unique inserts (" + server + ")",
		Clock: fmt.Sprintf("server's clock, estimated from hello.localTime (± %v, re-measured every %v)",
			b.clock.Bound().Round(time.Microsecond), b.o.ClockResync),
		Liveness:      "TTL",
		Scope:         driver.ScopeKey,
		FailoverSafe:  majority && !b.ferret,
		Failover:      failover,
		LossDetection: driver.LossByRenewal,
		Warnings:      append([]string(nil), b.warnings...),
	}
}

// Close implements driver.Backend. It disconnects the client only if the
// backend opened it (Open, or fencelock.Open with a mongodb:// URL).
func (b *Backend) Close() error {
	b.bgMu.Lock()
	already := b.closed.Swap(true)
	b.bgMu.Unlock()
	if already {
		return nil
	}
	b.stop()
	b.bg.Wait()
	if !b.owned {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return b.client.Disconnect(ctx)
}
