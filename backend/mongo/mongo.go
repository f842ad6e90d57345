package mongo

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
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
// driver.ForceReleaser, driver.TokenFloorer and driver.Describer. It is
// safe for concurrent use.
type Backend struct {
	client *mongo.Client
	owned  bool // Close disconnects client
	o      Options
	locks  *mongo.Collection
	clock  *serverClock
	closed atomic.Bool

	ferret   bool   // the server is FerretDB
	version  string // server version as buildInfo reports it
	replSet  bool   // the server is a replica-set member
	ttlIndex bool   // the garbage TTL index exists

	ownMu    sync.Mutex
	own      map[string]ownToken // per key: the highest token this backend claimed
	warnings []string
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// lockDoc is a lock record: one per acquisition, with a fresh _id. The
// unique (ns, key) index admits one per key. Only the winner of the
// record's next epoch claim writes it (see the package documentation).
type lockDoc struct {
	ID        bson.ObjectID `bson:"_id"`
	NS        string        `bson:"ns"`
	Key       string        `bson:"key"`
	Owner     string        `bson:"owner"`
	Token     int64         `bson:"token"`
	Epoch     int64         `bson:"epoch"`
	ExpiresAt bson.DateTime `bson:"expiresAt"`
}

// Claim kinds.
const (
	kindToken = "token" // a token was issued (or a floor set)
	kindRenew = "renew" // a renewal of a record's epoch
	kindEnd   = "end"   // a takeover or force-release of a record
)

// claimDoc is an immutable claim: inserted once, never updated, deleted
// only as garbage. Its _id says what it claims (a token of a key, an
// epoch of a record); the unique _id index lets exactly one inserter win.
// Claims live in the locks collection with ns = 0 (a number, so no
// namespace string collides with it) and key = _id, so the unique
// (ns, key) index holds them too.
type claimDoc struct {
	ID    string `bson:"_id"`
	NS    int32  `bson:"ns"`
	Key   string `bson:"key"`
	Kind  string `bson:"kind"`
	Owner string `bson:"owner,omitempty"`
	// Token claims: the namespace, key and token claimed, and a floor
	// (RaiseFloor) above which the next token must be.
	TNS   string `bson:"tns,omitempty"`
	TKey  string `bson:"tkey,omitempty"`
	Token int64  `bson:"token,omitempty"`
	Floor int64  `bson:"floor,omitempty"`
	// Epoch claims of a renewal: the expiry and token the renewal sets.
	ExpiresAt bson.DateTime `bson:"expiresAt,omitempty"`
	At        bson.DateTime `bson:"at"`
}

// tokenID is the _id of the claim of token tok for key: unambiguous
// (the namespace is length-prefixed, the token fixed-width) and free of
// NUL bytes, which PostgreSQL's jsonb rejects.
func (b *Backend) tokenID(key string, tok int64) string {
	return "t/" + strconv.Itoa(len(b.o.Namespace)) + "/" + b.o.Namespace + "/" + fmt.Sprintf("%020d", tok) + "/" + key
}

// epochID is the _id of the claim of epoch n of the record with _id x.
func epochID(x bson.ObjectID, n int64) string {
	return "e/" + x.Hex() + "/" + strconv.FormatInt(n, 10)
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
	// One createIndexes per index: FerretDB 1.24 panics on a command
	// creating several indexes when they exist already.
	for _, m := range []mongo.IndexModel{{
		Keys:    bson.D{{Key: "ns", Value: 1}, {Key: "key", Value: 1}},
		Options: options.Index().SetUnique(true).SetName("fencelock_ns_key"),
	}, {
		Keys:    bson.D{{Key: "tns", Value: 1}, {Key: "tkey", Value: 1}, {Key: "token", Value: 1}},
		Options: options.Index().SetName("fencelock_tokens"),
	}} {
		if _, err := b.locks.Indexes().CreateOne(ctx, m); err != nil {
			return nil, fmt.Errorf("mongo: creating the indexes on %s.%s: %w", o.Database, o.Collection, err)
		}
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
		// FerretDB has no TTL indexes: expired records are replaced by
		// the next acquire of their key, and claims are deleted by the
		// operations that end them.
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
	if !b.ferret && !b.replSet {
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

func (b *Backend) info(d *lockDoc, now time.Time) driver.Info {
	if d == nil {
		return driver.Info{}
	}
	if d.Owner == "" || expired(d.ExpiresAt, now) {
		return driver.Info{Key: d.Key}
	}
	return driver.Info{Key: d.Key, Owner: d.Owner, Token: driver.Token(d.Token), Remaining: d.ExpiresAt.Time().Sub(now)}
}

// handle encodes what later calls need to find a grant's record: its _id,
// its epoch and its expiry.
func handle(x bson.ObjectID, epoch int64, exp bson.DateTime) string {
	return x.Hex() + "/" + strconv.FormatInt(epoch, 10) + "/" + strconv.FormatInt(int64(exp), 10)
}

type grantRef struct {
	x     bson.ObjectID
	epoch int64
	exp   bson.DateTime
	token int64
}

// ref finds g's record: from its Handle, or (a grant the engine built from
// Inspect) by looking the record up by key, owner and token.
func (b *Backend) ref(ctx context.Context, g driver.Grant) (grantRef, error) {
	if g.Handle != "" {
		p := strings.Split(g.Handle, "/")
		if len(p) == 3 {
			x, err1 := bson.ObjectIDFromHex(p[0])
			n, err2 := strconv.ParseInt(p[1], 10, 64)
			e, err3 := strconv.ParseInt(p[2], 10, 64)
			if err1 == nil && err2 == nil && err3 == nil {
				return grantRef{x: x, epoch: n, exp: bson.DateTime(e), token: int64(g.Token)}, nil
			}
		}
		return grantRef{}, driver.ErrNotHeld
	}
	var d lockDoc
	err := b.locks.FindOne(ctx, bson.D{{Key: "ns", Value: b.o.Namespace}, {Key: "key", Value: g.Key},
		{Key: "owner", Value: g.Owner}, {Key: "token", Value: int64(g.Token)}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return grantRef{}, driver.ErrNotHeld
	}
	if err != nil {
		return grantRef{}, err
	}
	return grantRef{x: d.ID, epoch: d.Epoch, exp: d.ExpiresAt, token: d.Token}, nil
}

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
// than half that can only miss a claim that never existed (see the
// package documentation).
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

// highestClaim reads key's highest token claim and returns the base of the
// next one: the larger of its token and its floor (0 if none). Every
// 16th token it also deletes the key's claims below it that are older
// than GarbageAfter, except the claim of token 1.
//
// A key's first claim is always of token 1 (every claim's base is an
// existing claim or a record's token, claimed by the takeover that ends
// it), and that claim is never deleted, so a key without it has no claims
// at all: one find by _id (cheap on every server; FerretDB scans the
// whole collection for any other filter) answers a fresh key.
func (b *Backend) highestClaim(ctx context.Context, key string, now time.Time) (int64, error) {
	var c claimDoc
	err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: b.tokenID(key, 1)}}).Decode(&c)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	err = b.locks.FindOne(ctx, bson.D{{Key: "tns", Value: b.o.Namespace}, {Key: "tkey", Value: key}},
		options.FindOne().SetSort(bson.D{{Key: "tns", Value: -1}, {Key: "tkey", Value: -1}, {Key: "token", Value: -1}})).Decode(&c)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if c.Token%16 == 0 {
		// Garbage: claims are immutable, so this filter holds at the
		// delete as it held when read, on every server.
		_, _ = b.locks.DeleteMany(ctx, bson.D{
			{Key: "tns", Value: b.o.Namespace}, {Key: "tkey", Value: key},
			{Key: "token", Value: bson.D{{Key: "$gt", Value: 1}, {Key: "$lt", Value: c.Token}}},
			{Key: "at", Value: bson.D{{Key: "$lt", Value: date(now.Add(-b.o.GarbageAfter))}}},
		})
	}
	return max(c.Token, c.Floor), nil
}

func (b *Backend) tokenClaim(key string, tok int64, now time.Time) claimDoc {
	id := b.tokenID(key, tok)
	return claimDoc{ID: id, Key: id, Kind: kindToken, TNS: b.o.Namespace, TKey: key, Token: tok, At: date(now)}
}

// Outcomes of insertRecord.
type insertOutcome int

const (
	inserted  insertOutcome = iota
	keyHeld                 // the (ns, key) index refused the record
	tokenUsed               // the token was claimed before: the base was stale
)

// insertRecord inserts a new record for req with token base+1 and, in
// the same ordered insert, the claim of that token. The record goes
// first, so a token claim exists only for a token whose record was
// inserted. If the claim collides (the base was stale), the record is
// deleted again.
func (b *Backend) insertRecord(ctx context.Context, req driver.AcquireRequest, base int64, now time.Time) (driver.Grant, insertOutcome, error) {
	tok := base + 1
	x := lockDoc{ID: bson.NewObjectID(), NS: b.o.Namespace, Key: req.Key, Owner: req.Owner, Token: tok, ExpiresAt: expiry(now, req.TTL)}
	_, err := b.locks.InsertMany(ctx, []any{x, b.tokenClaim(req.Key, tok, now)})
	switch {
	case err == nil:
		b.remember(req.Key, tok)
		return driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(tok), Handle: handle(x.ID, 0, x.ExpiresAt)}, inserted, nil
	case writeErrorAt(err, 0) == 11000:
		return driver.Grant{}, keyHeld, nil
	case writeErrorAt(err, 0) == 0 && writeErrorAt(err, 1) == 11000:
		if _, err := b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: x.ID}}); err != nil {
			return driver.Grant{}, 0, err
		}
		return driver.Grant{}, tokenUsed, nil
	default:
		return driver.Grant{}, 0, err
	}
}

// errTokenRace is the transient error of an acquire whose token claim
// collided twice: the engine retries.
var errTokenRace = errors.New("mongo: token claimed concurrently; retry")

// Acquire implements driver.Backend.
//
// A free key costs one round trip when this backend issued the key's last
// token itself (recently): one ordered insert of the new record (fresh
// _id, token last+1) and the claim of that token. Otherwise the key's
// highest token claim is read first. A held key costs the insert and one
// read of the holder. An expired record is taken over: its next epoch is
// claimed (a unique insert), the record deleted and a new one inserted.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	now := b.clock.now(ctx)
	base, fresh := b.ownBase(req.Key)
	for round := 0; ; round++ {
		if !fresh {
			var err error
			if base, err = b.highestClaim(ctx, req.Key, now); err != nil {
				return driver.Grant{}, err
			}
		}
		g, out, err := b.insertRecord(ctx, req, base, now)
		if err != nil {
			return driver.Grant{}, err
		}
		switch out {
		case inserted:
			return g, nil
		case tokenUsed:
			if !fresh && round > 0 {
				return driver.Grant{}, errTokenRace
			}
			fresh = false
			continue
		}
		// keyHeld: read the record.
		var d lockDoc
		err = b.locks.FindOne(ctx, bson.D{{Key: "ns", Value: b.o.Namespace}, {Key: "key", Value: req.Key}}).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			if round > 0 {
				return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
			}
			continue // released in between: try once more
		}
		if err != nil {
			return driver.Grant{}, err
		}
		now = b.clock.now(ctx)
		switch {
		case d.Owner == req.Owner && !expired(d.ExpiresAt, now):
			// A retry after an ambiguous reply: the existing grant.
			return driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(d.Token), Handle: handle(d.ID, d.Epoch, d.ExpiresAt)}, nil
		case !expired(d.ExpiresAt, now):
			return driver.Grant{}, &driver.HeldError{Holder: b.info(&d, now)}
		}
		if err := b.end(ctx, &d, req.Owner, false, now); err != nil {
			return driver.Grant{}, err
		}
		// The expired record is gone and nobody else can take it over:
		// insert ours, above both its token and every claim.
		hi, err := b.highestClaim(ctx, req.Key, now)
		if err != nil {
			return driver.Grant{}, err
		}
		g, out, err = b.insertRecord(ctx, req, max(hi, d.Token), now)
		if err != nil {
			return driver.Grant{}, err
		}
		switch out {
		case inserted:
			return g, nil
		case tokenUsed:
			return driver.Grant{}, errTokenRace
		}
		return driver.Grant{}, b.held(ctx, req.Key)
	}
}

// end ends the expired (or force-released) record d on behalf of owner:
// it claims d's next epoch with an "end" claim, so that no renewal of d
// can succeed after it, deletes d and the claims of d. A renewal claim of
// d that is already in place wins unless its own expiry has passed too; a
// *driver.HeldError reports the record as still held.
//
// The same insert also claims d's token, if nobody did (a record whose
// token claim was lost with its insert): the tokens below the next one are
// then all claimed.
func (b *Backend) end(ctx context.Context, d *lockDoc, owner string, force bool, now time.Time) error {
	n := d.Epoch + 1
	claim := claimDoc{ID: epochID(d.ID, n), Kind: kindEnd, Owner: owner, At: date(now)}
	claim.Key = claim.ID
	tc := b.tokenClaim(d.Key, d.Token, now)
	_, err := b.locks.InsertMany(ctx, []any{claim, tc}, options.InsertMany().SetOrdered(false))
	switch code := writeErrorAt(err, 0); {
	case code == 11000:
		// Someone claimed epoch n first: a pending renewal by the holder,
		// or another contender.
		var c claimDoc
		if err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: claim.ID}}).Decode(&c); err != nil {
			if errors.Is(err, mongo.ErrNoDocuments) {
				return &driver.HeldError{Holder: driver.Info{Key: d.Key}}
			}
			return err
		}
		if c.Kind != kindRenew || !force && !expired(c.ExpiresAt, now) {
			info := driver.Info{Key: d.Key}
			if c.Kind == kindRenew {
				info = driver.Info{Key: d.Key, Owner: d.Owner, Token: driver.Token(c.Token), Remaining: c.ExpiresAt.Time().Sub(now)}
			}
			return &driver.HeldError{Holder: info}
		}
		// The renewal's expiry passed as well: claim the epoch after it.
		n++
		claim.ID = epochID(d.ID, n)
		claim.Key = claim.ID
		if _, err := b.locks.InsertOne(ctx, claim); mongo.IsDuplicateKeyError(err) {
			return &driver.HeldError{Holder: driver.Info{Key: d.Key}}
		} else if err != nil {
			return err
		}
	case code == 0 && writeErrorAt(err, 1) == 11000:
		// The record's token was claimed already, as it should be.
	case err != nil:
		return err
	}
	// d is ours to end: its epoch can no longer move, so these filters
	// hold at the delete as they held when read.
	dels := []mongo.WriteModel{mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: d.ID}})}
	for e := max(d.Epoch, 1); e <= n; e++ {
		dels = append(dels, mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: epochID(d.ID, e)}}))
	}
	_, err = b.locks.BulkWrite(ctx, dels)
	return err
}

// held returns the error for a refused acquire: a *HeldError naming the
// holder as far as a read can tell.
func (b *Backend) held(ctx context.Context, key string) error {
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Owner == "" {
		info = driver.Info{Key: key}
	}
	return &driver.HeldError{Holder: info}
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

// Renew implements driver.Backend. It claims the record's next epoch with
// an immutable "renew" claim carrying the new expiry (and, with Rotate,
// a new token, claimed like an acquire's), then writes that epoch into
// the record, and deletes the previous renewal claim: three round trips,
// four with Rotate. A claim already taken by someone else means the record
// was taken over or force-released: ErrNotHeld.
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
	r, err := b.ref(ctx, g)
	if err != nil {
		return driver.Grant{}, err
	}
	now := b.clock.now(ctx)
	if expired(r.exp, now) {
		return driver.Grant{}, driver.ErrNotHeld
	}
	n := r.epoch + 1
	claim := claimDoc{ID: epochID(r.x, n), Kind: kindRenew, Owner: g.Owner, Token: int64(g.Token), ExpiresAt: expiry(now, req.TTL), At: date(now)}
	claim.Key = claim.ID
	if req.Rotate {
		tok, err := b.claimToken(ctx, g.Key, now)
		if err != nil {
			return driver.Grant{}, err
		}
		claim.Token = tok
	}
	inserted := true
	if _, err := b.locks.InsertOne(ctx, claim); mongo.IsDuplicateKeyError(err) {
		// Our own earlier attempt (a retry), or someone else's end.
		var c claimDoc
		if err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: claim.ID}}).Decode(&c); err != nil {
			if errors.Is(err, mongo.ErrNoDocuments) {
				return driver.Grant{}, driver.ErrNotHeld
			}
			return driver.Grant{}, err
		}
		// Ours only if it renews this grant: same owner, and the same
		// token unless this is a rotation (whose first attempt chose
		// the new token). A grant from before a rotation is stale.
		if c.Kind != kindRenew || c.Owner != g.Owner || c.Token != int64(g.Token) && !req.Rotate {
			return driver.Grant{}, driver.ErrNotHeld
		}
		claim = c
		inserted = false
	} else if err != nil {
		return driver.Grant{}, err
	}
	res, err := b.locks.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: r.x}, {Key: "owner", Value: g.Owner},
			{Key: "epoch", Value: bson.D{{Key: "$in", Value: bson.A{r.epoch, n}}}},
			{Key: "token", Value: bson.D{{Key: "$in", Value: bson.A{int64(g.Token), claim.Token}}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "epoch", Value: n}, {Key: "expiresAt", Value: claim.ExpiresAt}, {Key: "token", Value: claim.Token}}}})
	if err != nil {
		return driver.Grant{}, err
	}
	if res.MatchedCount == 0 {
		if inserted {
			// Garbage: a claim of an epoch the record never reaches.
			_, _ = b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: claim.ID}})
		}
		return driver.Grant{}, driver.ErrNotHeld
	}
	if r.epoch > 0 {
		// Garbage: the record has moved past it, so a late claim of
		// that epoch can no longer match the record's epoch.
		_, _ = b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: epochID(r.x, r.epoch)}})
	}
	out := driver.Grant{Key: g.Key, Owner: g.Owner, Token: driver.Token(claim.Token), Handle: handle(r.x, n, claim.ExpiresAt)}
	if left := claim.ExpiresAt.Time().Sub(b.clock.now(ctx)); left < req.TTL {
		// A retry found the expiry its first attempt set.
		if left <= 0 {
			return driver.Grant{}, driver.ErrNotHeld
		}
		out.TTL = left
	}
	return out, nil
}

// claimToken claims the next token of key for its holder (a rotation).
func (b *Backend) claimToken(ctx context.Context, key string, now time.Time) (int64, error) {
	base, fresh := b.ownBase(key)
	for round := 0; round < 2; round++ {
		if !fresh || round > 0 {
			var err error
			if base, err = b.highestClaim(ctx, key, now); err != nil {
				return 0, err
			}
		}
		_, err := b.locks.InsertOne(ctx, b.tokenClaim(key, base+1, now))
		if err == nil {
			b.remember(key, base+1)
			return base + 1, nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return 0, err
		}
	}
	return 0, errTokenRace
}

// maxBatch bounds the grants renewed by one round of RenewBatch.
const maxBatch = 500

// RenewBatch implements driver.BatchRenewer. Without rotation it renews
// up to 500 grants with four commands: one unordered insert of their epoch
// claims, one updateMany (one per distinct epoch and owner), one find
// reading the records back (a record carrying the claimed epoch and
// expiry was renewed), and one delete of the previous claims. A grant
// whose claim collides (a retry, or an end of its record), or that came
// without a handle, is renewed alone with Renew; rotating renewals too.
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
		return out, ctx.Err()
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
	var items []renewItem
	var single []int
	for i, g := range grants {
		if err := validGrant(g); err != nil {
			out[i].Err = err
			continue
		}
		if g.Handle == "" {
			single = append(single, i)
			continue
		}
		r, err := b.ref(ctx, g)
		if err != nil {
			out[i].Err = err
			continue
		}
		if expired(r.exp, now) {
			out[i].Err = driver.ErrNotHeld
			continue
		}
		c := claimDoc{ID: epochID(r.x, r.epoch+1), Kind: kindRenew, Owner: g.Owner, Token: int64(g.Token), ExpiresAt: exp, At: date(now)}
		c.Key = c.ID
		items = append(items, renewItem{i: i, r: r, c: c})
	}
	if len(items) > 0 {
		docs := make([]any, len(items))
		for j := range items {
			docs[j] = items[j].c
		}
		_, err := b.locks.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
		var won []renewItem
		for j, it := range items {
			switch code := writeErrorAt(err, j); {
			case code == 0 || code == -1 && err == nil:
				won = append(won, it)
			case code == 11000:
				single = append(single, it.i)
			default:
				return err
			}
		}
		if err := b.applyClaims(ctx, grants, won, out); err != nil {
			return err
		}
	}
	for _, i := range single {
		out[i].Grant, out[i].Err = b.Renew(ctx, grants[i], req)
	}
	return nil
}

// renewItem is one grant of a batch renewal and the epoch claim made for it.
type renewItem struct {
	i int      // index in the batch
	r grantRef // the grant's record
	c claimDoc // the claim of its next epoch
}

// applyClaims writes won epoch claims into their records, reads the
// records back and deletes the previous claims.
//
// The records are written with one single-statement updateMany per
// (epoch, owner) group, filtered on _id ∈ group and that epoch, never
// with a bulk of one statement per record: FerretDB 1.24 keeps every
// statement's read open until the whole update command ends and takes a
// second pooled connection for each write, so a bulk of as many
// statements as its connection pool holds (50 on PostgreSQL, 100 on
// SQLite) deadlocks the server. A group's records all share the claimed
// expiry (the chunk's), and each was claimed at its next epoch by this
// call, so the filter holds at FerretDB's write as it held at its read.
func (b *Backend) applyClaims(ctx context.Context, grants []driver.Grant, won []renewItem, out []driver.RenewResult) error {
	if len(won) == 0 {
		return nil
	}
	type groupKey struct {
		epoch int64
		owner string
		exp   bson.DateTime
	}
	groups := make(map[groupKey]bson.A)
	var order []groupKey
	ids := make(bson.A, len(won))
	var dels bson.A // claims that are garbage after this call
	for j, it := range won {
		k := groupKey{epoch: it.r.epoch, owner: grants[it.i].Owner, exp: it.c.ExpiresAt}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], it.r.x)
		ids[j] = it.r.x
		if it.r.epoch > 0 {
			dels = append(dels, epochID(it.r.x, it.r.epoch))
		}
	}
	for _, k := range order {
		if _, err := b.locks.UpdateMany(ctx,
			bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: groups[k]}}}, {Key: "owner", Value: k.owner}, {Key: "epoch", Value: k.epoch}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "epoch", Value: k.epoch + 1}, {Key: "expiresAt", Value: k.exp}}}}); err != nil {
			return err
		}
	}
	cur, err := b.locks.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		options.Find().SetProjection(bson.D{{Key: "owner", Value: 1}, {Key: "token", Value: 1}, {Key: "epoch", Value: 1}, {Key: "expiresAt", Value: 1}}))
	if err != nil {
		return err
	}
	var docs []lockDoc
	if err := cur.All(ctx, &docs); err != nil {
		return err
	}
	byID := make(map[bson.ObjectID]*lockDoc, len(docs))
	for i := range docs {
		byID[docs[i].ID] = &docs[i]
	}
	for _, it := range won {
		g := grants[it.i]
		d := byID[it.r.x]
		if d != nil && d.Owner == g.Owner && d.Token == int64(g.Token) && d.Epoch == it.r.epoch+1 && d.ExpiresAt == it.c.ExpiresAt {
			g.Handle = handle(it.r.x, it.r.epoch+1, it.c.ExpiresAt)
			out[it.i].Grant = g
		} else {
			out[it.i].Err = driver.ErrNotHeld
			dels = append(dels, it.c.ID)
		}
	}
	if len(dels) > 0 {
		// Garbage only; a failure leaves claims the record has moved past.
		// One statement: FerretDB deletes what it matched in one write,
		// where a bulk of one statement per claim costs a write each.
		_, _ = b.locks.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: dels}}}})
	}
	return nil
}

// Release implements driver.Backend: one delete of the grant's record by
// its _id (plus one of its last renewal claim, if it was renewed). The
// record's _id is never reused, so a stale release cannot remove a later
// holder's record. A release after the grant's expiry is ErrNotHeld.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if err := validGrant(g); err != nil {
		return err
	}
	r, err := b.ref(ctx, g)
	if err != nil {
		return err
	}
	if expired(r.exp, b.clock.now(ctx)) {
		return driver.ErrNotHeld
	}
	res, err := b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: r.x}, {Key: "owner", Value: g.Owner}, {Key: "token", Value: int64(g.Token)}})
	if err != nil {
		return err
	}
	if r.epoch > 0 {
		_, _ = b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: epochID(r.x, r.epoch)}})
	}
	if res.DeletedCount == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// ForceRelease implements driver.ForceReleaser: it ends key's record
// whoever holds it (the same claim as a takeover) and returns the holder
// it removed. The holder finds out at its next renewal; the next grant
// still gets a higher token.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	now := b.clock.now(ctx)
	var d lockDoc
	err := b.locks.FindOne(ctx, bson.D{{Key: "ns", Value: b.o.Namespace}, {Key: "key", Value: key}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return driver.Info{Key: key}, nil
	}
	if err != nil {
		return driver.Info{}, err
	}
	info := b.info(&d, now)
	info.Key = key
	// An administrator's end wins over a pending renewal: claim the
	// renewal's epoch or the one after it.
	if err := b.end(ctx, &d, "force-release", true, now); err != nil {
		var he *driver.HeldError
		if errors.As(err, &he) {
			return driver.Info{}, fmt.Errorf("mongo: force-release of %q raced another end of its record; retry", key)
		}
		return driver.Info{}, err
	}
	return info, nil
}

// Inspect implements driver.Backend with one find on (ns, key).
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	now := b.clock.now(ctx)
	var d lockDoc
	err := b.locks.FindOne(ctx, bson.D{{Key: "ns", Value: b.o.Namespace}, {Key: "key", Value: key}}).Decode(&d)
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
		// The server compares by byte; keep the exact prefix rule here.
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
	if b.closed.Swap(true) || !b.owned {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return b.client.Disconnect(ctx)
}
