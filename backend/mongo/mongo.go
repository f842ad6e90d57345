package mongo

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/fencelock/fencelock/driver"
)

// Backend is a lock store in a MongoDB (or MongoDB wire-compatible)
// database. It implements driver.Backend, driver.BatchRenewer,
// driver.ForceReleaser and driver.Describer. It is safe for concurrent use.
type Backend struct {
	client *mongo.Client
	owned  bool // Close disconnects client
	o      Options
	locks  *mongo.Collection
	tokens *mongo.Collection
	clock  *serverClock
	closed atomic.Bool

	ferret   bool   // the server is FerretDB
	version  string // server version as buildInfo reports it
	replSet  bool   // the server is a replica-set member
	ttlIndex bool   // the garbage TTL index exists

	seenMu   sync.Mutex
	seen     map[string]int64 // last token seen per _id: the counter's value, if nobody issued since
	warnings []string
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// lockDoc is a document of the locks collection: one per held key. It is
// deleted on release; an expired one counts as free and is replaced by the
// next acquire (or removed by the garbage TTL index).
type lockDoc struct {
	ID        string        `bson:"_id"`
	NS        string        `bson:"ns"`
	Key       string        `bson:"key"`
	Owner     string        `bson:"owner"`
	Token     int64         `bson:"token"`
	ExpiresAt bson.DateTime `bson:"expiresAt"`
}

// New returns a Backend on a caller-owned client. Close does not
// disconnect the client. New creates the collections' indexes if missing
// (a unique index on (ns, key)) and measures the server's clock offset.
func New(ctx context.Context, client *mongo.Client, opts *Options) (*Backend, error) {
	if client == nil {
		return nil, errors.New("mongo: New: nil *mongo.Client")
	}
	return newBackend(ctx, client, false, opts)
}

func newBackend(ctx context.Context, client *mongo.Client, owned bool, opts *Options) (*Backend, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
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
		tokens: db.Collection(o.TokenCollection, copts),
		clock:  &serverClock{db: db, resync: o.ClockResync},
	}
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
	var bi bson.M
	if err := client.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&bi); err == nil {
		b.version, _ = bi["version"].(string)
		_, b.ferret = bi["ferretdbVersion"]
	}
	_, err = b.locks.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: "ns", Value: 1}, {Key: "key", Value: 1}},
		Options: options.Index().SetUnique(true).SetName("fencelock_ns_key"),
	})
	if err != nil {
		return nil, fmt.Errorf("mongo: creating the unique (ns, key) index on %s.%s: %w", o.Database, o.Collection, err)
	}
	_, err = b.locks.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys:    bson.D{{Key: "expiresAt", Value: 1}},
		Options: options.Index().SetExpireAfterSeconds(int32(o.GarbageAfter / time.Second)).SetName("fencelock_garbage"),
	})
	var ce mongo.CommandError
	switch {
	case err == nil:
		b.ttlIndex = true
	case errors.As(err, &ce) && (ce.Code == 238 || ce.Name == "NotImplemented"):
		// FerretDB has no TTL indexes. Expired documents are only
		// garbage: the next acquire of their key replaces them.
	case errors.As(err, &ce) && (ce.Code == 85 || ce.Code == 86):
		// IndexOptionsConflict: the index exists with another
		// expireAfterSeconds (another GarbageAfter); keep it.
		b.ttlIndex = true
	default:
		return nil, fmt.Errorf("mongo: creating the garbage TTL index on %s.%s: %w", o.Database, o.Collection, err)
	}
	b.warnings = b.detectWarnings()
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
	if b.ferret {
		w = append(w, "server is FerretDB: it runs findAndModify, update and delete as a read followed by an unconditional write by _id, without isolation; taking a free key (an insert checked by the unique _id index) stays atomic and only holders update token counters, but the takeover of an expired record is an update: two contenders taking over the same expired key at once can both succeed with the same token (measured by the safety suite), and a renewal or release racing a takeover can overwrite the new holder's record. Use MongoDB for production")
	} else if !b.replSet {
		w = append(w, "server is a standalone mongod, not a replica set: w:majority is satisfied by one node")
	}
	return w
}

// Client returns the underlying client.
func (b *Backend) Client() *mongo.Client { return b.client }

// Options returns the backend's options with defaults filled in.
func (b *Backend) Options() Options { return b.o }

// ClockBound returns the error bound of the current estimate of the
// server's clock: half the round trip of the hello it came from, plus 1ms.
// Drift between samples adds to it. The engine's Margin must exceed it.
func (b *Backend) ClockBound() time.Duration { return b.clock.Bound() }

func (b *Backend) id(key string) string { return b.o.Namespace + "\x00" + key }

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

func (b *Backend) info(d *lockDoc, now time.Time) driver.Info {
	if d == nil || d.Owner == "" || !d.ExpiresAt.Time().After(now) {
		if d != nil {
			return driver.Info{Key: d.Key}
		}
		return driver.Info{}
	}
	return driver.Info{Key: d.Key, Owner: d.Owner, Token: driver.Token(d.Token), Remaining: d.ExpiresAt.Time().Sub(now)}
}

// Acquire implements driver.Backend. Taking a free key costs three round
// trips:
//
//  1. the key's lock document is inserted with token 0 ("being issued").
//     Its _id is (namespace, key), so the unique _id index lets exactly
//     one of any number of concurrent inserts succeed; the others get
//     E11000 duplicate key, which is classified as "held", never as a
//     failure;
//  2. the key's counter document is incremented ($inc, upsert) for the
//     token. This happens only while holding the key, so tokens are
//     issued in the order of the holders (a token taken before the lock
//     could be overtaken by a later holder's);
//  3. the token is written into the lock document, if it is still ours.
//
// If the insert collides, the existing document is read: held by another
// owner and unexpired, that is the answer (two round trips). Expired, or
// held by req.Owner (a retry), it is taken over with one update whose
// filter admits only an expired document or the same owner (an upsert, in
// case it vanished meanwhile), followed by steps 2 and 3. A retry by the
// same owner thus issues a new, higher token.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	id := b.id(req.Key)
	last, known := b.lastToken(id)
	spec := int64(0) // "being issued"
	if known {
		spec = last + 1
	}
	now := b.clock.now(ctx)
	fields := bson.D{
		{Key: "ns", Value: b.o.Namespace},
		{Key: "key", Value: req.Key},
		{Key: "owner", Value: req.Owner},
		{Key: "token", Value: spec},
		{Key: "expiresAt", Value: expiry(now, req.TTL)},
	}
	_, err := b.locks.InsertOne(ctx, append(bson.D{{Key: "_id", Value: id}}, fields...))
	if mongo.IsDuplicateKeyError(err) {
		err = b.takeOver(ctx, req, id, fields)
	}
	if err != nil {
		return driver.Grant{}, err
	}
	if known {
		// Compare-and-set the counter from the last token seen: it
		// succeeds only if no token was issued since, and then the
		// token already in the document is the next one.
		res, err := b.tokens.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: id}, {Key: "seq", Value: last}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "seq", Value: spec}}}})
		if err != nil {
			return driver.Grant{}, err
		}
		if res.MatchedCount == 1 {
			b.remember(id, spec)
			return driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(spec)}, nil
		}
	}
	tok, err := b.nextToken(ctx, id)
	if err != nil {
		return driver.Grant{}, err
	}
	b.remember(id, tok)
	res, err := b.locks.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: id}, {Key: "owner", Value: req.Owner}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "token", Value: tok}}}})
	if err != nil {
		return driver.Grant{}, err
	}
	if res.MatchedCount == 0 {
		// Our claim expired and was taken over before the token was
		// recorded: this token was never handed out.
		return driver.Grant{}, b.held(ctx, req.Key)
	}
	return driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(tok)}, nil
}

// takeOver claims a key whose lock document exists: it succeeds (nil) if
// the document is expired or req.Owner's, and otherwise returns a
// *driver.HeldError naming the holder.
func (b *Backend) takeOver(ctx context.Context, req driver.AcquireRequest, id string, fields bson.D) error {
	var d lockDoc
	err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return err
	}
	now := b.clock.now(ctx)
	if err == nil {
		b.remember(id, d.Token)
	}
	if err == nil && d.Owner != req.Owner && d.ExpiresAt.Time().After(now) {
		return &driver.HeldError{Holder: b.info(&d, now)}
	}
	filter := bson.D{
		{Key: "_id", Value: id},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: date(now)}}}},
			bson.D{{Key: "owner", Value: req.Owner}},
		}},
	}
	res, err := b.locks.UpdateOne(ctx, filter, bson.D{{Key: "$set", Value: fields}}, options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) || (err == nil && res.MatchedCount == 0 && res.UpsertedCount == 0) {
		return b.held(ctx, req.Key)
	}
	return err
}

// maxSeen bounds the number of keys whose last token a Backend remembers.
const maxSeen = 1 << 16

// lastToken returns the highest token this backend has seen for the key
// with _id id (issued to it or read from a holder), if any.
func (b *Backend) lastToken(id string) (int64, bool) {
	b.seenMu.Lock()
	defer b.seenMu.Unlock()
	t, ok := b.seen[id]
	return t, ok
}

// remember records a token seen for the key with _id id. Every token
// came from the key's counter, so the counter is at least this high; the
// compare-and-set in Acquire succeeds only if it is exactly this high.
func (b *Backend) remember(id string, tok int64) {
	if tok <= 0 {
		return
	}
	b.seenMu.Lock()
	defer b.seenMu.Unlock()
	if b.seen == nil || len(b.seen) >= maxSeen {
		b.seen = make(map[string]int64)
	}
	if tok > b.seen[id] {
		b.seen[id] = tok
	}
}

// nextToken increments the key's counter document and returns its new
// value. Counter documents are never deleted, so a key's tokens strictly
// increase for the life of the collection.
func (b *Backend) nextToken(ctx context.Context, id string) (int64, error) {
	var c struct {
		Seq int64 `bson:"seq"`
	}
	err := b.tokens.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "seq", Value: int64(1)}}}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&c)
	if err != nil {
		return 0, err
	}
	if c.Seq <= 0 {
		return 0, fmt.Errorf("mongo: token counter %q returned %d", id, c.Seq)
	}
	return c.Seq, nil
}

// held returns the error for a refused acquire: a *HeldError naming the
// holder as far as a read can tell.
func (b *Backend) held(ctx context.Context, key string) error {
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Owner == "" {
		// The holder released in between, or the read failed: still a
		// definite "not acquired" for this attempt.
		info = driver.Info{Key: key}
	}
	b.remember(b.id(key), int64(info.Token))
	return &driver.HeldError{Holder: info}
}

// current is the filter matching g's document while g holds it.
func (b *Backend) current(g driver.Grant, now time.Time) bson.D {
	return bson.D{
		{Key: "_id", Value: b.id(g.Key)},
		{Key: "owner", Value: g.Owner},
		{Key: "token", Value: int64(g.Token)},
		{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: date(now)}}},
	}
}

func validGrant(g driver.Grant) error {
	if err := driver.ValidateKey(g.Key); err != nil {
		return err
	}
	if g.Owner == "" || g.Token == 0 || g.Token > 1<<63-1 {
		return driver.ErrNotHeld
	}
	return nil
}

// Renew implements driver.Backend: one update conditioned on owner, token
// and an unexpired document; it never upserts. With Rotate it first takes
// the key's next token from its counter (one more round trip) and writes
// it into the document with the new expiry.
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	if err := validGrant(g); err != nil {
		return driver.Grant{}, err
	}
	now := b.clock.now(ctx)
	set := bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: expiry(now, req.TTL)}}}}
	if !req.Rotate {
		res, err := b.locks.UpdateOne(ctx, b.current(g, now), set)
		if err != nil {
			return driver.Grant{}, err
		}
		if res.MatchedCount == 0 {
			return driver.Grant{}, driver.ErrNotHeld
		}
		return g, nil
	}
	tok, err := b.nextToken(ctx, b.id(g.Key))
	if err != nil {
		return driver.Grant{}, err
	}
	set = bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: expiry(now, req.TTL)}, {Key: "token", Value: tok}}}}
	res, err := b.locks.UpdateOne(ctx, b.current(g, now), set)
	if err != nil {
		return driver.Grant{}, err
	}
	if res.MatchedCount == 0 {
		return driver.Grant{}, driver.ErrNotHeld
	}
	b.remember(b.id(g.Key), tok)
	g.Token = driver.Token(tok)
	return g, nil
}

// maxBatch bounds the grants renewed by one update command.
const maxBatch = 500

// RenewBatch implements driver.BatchRenewer. Without rotation it renews
// up to 500 grants with one updateMany (each grant's owner, token and
// expiry checked by the filter) and reads back which ones it extended:
// two round trips per 500 grants. Rotating renewals need a new token per
// document and go one by one.
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	out := make([]driver.RenewResult, len(grants))
	if req.Rotate {
		for i, g := range grants {
			out[i].Grant, out[i].Err = b.Renew(ctx, g, req)
		}
		return out, nil
	}
	for lo := 0; lo < len(grants); lo += maxBatch {
		hi := min(lo+maxBatch, len(grants))
		if err := b.renewChunk(ctx, grants[lo:hi], req, out[lo:hi]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (b *Backend) renewChunk(ctx context.Context, grants []driver.Grant, req driver.RenewRequest, out []driver.RenewResult) error {
	now := b.clock.now(ctx)
	exp := expiry(now, req.TTL)
	var (
		or  bson.A
		ids bson.A
	)
	for i, g := range grants {
		if err := validGrant(g); err != nil {
			out[i].Err = err
			continue
		}
		or = append(or, bson.D{{Key: "_id", Value: b.id(g.Key)}, {Key: "owner", Value: g.Owner}, {Key: "token", Value: int64(g.Token)}})
		ids = append(ids, b.id(g.Key))
	}
	if len(or) == 0 {
		return nil
	}
	_, err := b.locks.UpdateMany(ctx,
		bson.D{{Key: "$or", Value: or}, {Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: date(now)}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: exp}}}})
	if err != nil {
		return err
	}
	cur, err := b.locks.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		options.Find().SetProjection(bson.D{{Key: "owner", Value: 1}, {Key: "token", Value: 1}, {Key: "expiresAt", Value: 1}}))
	if err != nil {
		return err
	}
	var docs []lockDoc
	if err := cur.All(ctx, &docs); err != nil {
		return err
	}
	byID := make(map[string]*lockDoc, len(docs))
	for i := range docs {
		byID[docs[i].ID] = &docs[i]
	}
	for i, g := range grants {
		if out[i].Err != nil {
			continue
		}
		d := byID[b.id(g.Key)]
		// Renewed by this update: still ours, with exactly the expiry it
		// wrote. (A document that had expired keeps its old expiry.)
		if d != nil && d.Owner == g.Owner && d.Token == int64(g.Token) && d.ExpiresAt == exp {
			out[i].Grant = g
		} else {
			out[i].Err = driver.ErrNotHeld
		}
	}
	return nil
}

// Release implements driver.Backend: one delete conditioned on owner,
// token and an unexpired document. The key's counter document stays.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if err := validGrant(g); err != nil {
		return err
	}
	now := b.clock.now(ctx)
	res, err := b.locks.DeleteOne(ctx, b.current(g, now))
	if err != nil {
		return err
	}
	if res.DeletedCount == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// ForceRelease implements driver.ForceReleaser: it deletes key's lock
// document whoever holds it and returns the holder it removed. The holder
// finds out at its next renewal; the next grant still gets a higher token
// from the counter.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	now := b.clock.now(ctx)
	var d lockDoc
	err := b.locks.FindOneAndDelete(ctx,
		bson.D{{Key: "_id", Value: b.id(key)}, {Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: date(now)}}}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.Info{Key: key}, nil
	}
	if err != nil {
		return driver.Info{}, err
	}
	info := b.info(&d, now)
	info.Key = key
	return info, nil
}

// Inspect implements driver.Backend with one find by _id.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	now := b.clock.now(ctx)
	var d lockDoc
	err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: b.id(key)}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.Info{Key: key}, nil
	}
	if err != nil {
		return driver.Info{}, err
	}
	info := b.info(&d, now)
	info.Key = key
	return info, nil
}

// List implements driver.Backend: the held keys of this namespace that
// start with prefix, found with an anchored, quoted regular expression on
// the key (which the (ns, key) index serves as a range scan).
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	now := b.clock.now(ctx)
	filter := bson.D{{Key: "ns", Value: b.o.Namespace}}
	if prefix != "" {
		filter = append(filter, bson.E{Key: "key", Value: bson.D{{Key: "$regex", Value: "^" + regexp.QuoteMeta(prefix)}}})
	}
	filter = append(filter, bson.E{Key: "expiresAt", Value: bson.D{{Key: "$gt", Value: date(now)}}})
	cur, err := b.locks.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "ns", Value: 1}, {Key: "key", Value: 1}}))
	if err != nil {
		return nil, err
	}
	var docs []lockDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, err
	}
	out := make([]driver.Info, 0, len(docs))
	for i := range docs {
		// Documents compared by byte in the server; keep the exact
		// prefix rule here too.
		if in := b.info(&docs[i], now); in.Owner != "" && strings.HasPrefix(in.Key, prefix) {
			out = append(out, in)
		}
	}
	return out, nil
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
		failover = "FerretDB stores in its own backend (SQLite here): no replica set, durability is that backend's"
	case !majority:
		failover = "the write concern is weaker than journaled majority: a failover can lose acknowledged grants and counter increments"
	}
	return driver.Description{
		Name: "mongo",
		Fencing: "per-key $inc on a counter document in " + b.o.TokenCollection + " that is never deleted; " +
			"survives restart and failover with journaled majority writes (" + server + ")",
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
	if b.closed.Swap(true) || !b.owned {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return b.client.Disconnect(ctx)
}
