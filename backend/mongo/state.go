package mongo

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock/driver"
)

// A record's rid names one acquisition: a fresh ObjectID (hex) followed by
// a digest of its owner, so a grant whose owner was altered addresses a
// record that does not exist. The record's _id is "r/<rid>", the _id of
// the claim of its epoch n is "e/<rid>/<n>". Neither contains a NUL byte.
const ridLen = 24 + 16

func newRID(owner string) string { return bson.NewObjectID().Hex() + ownerDigest(owner) }

func ownerDigest(owner string) string {
	s := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(s[:8])
}

func recordID(rid string) string { return "r/" + rid }

func epochID(rid string, n int64) string { return "e/" + rid + "/" + strconv.FormatInt(n, 10) }

// lockDoc is a lock record: one per acquisition, inserted once and never
// updated; deleted by its release, or by the winner of an end claim. The
// unique (ns, key) index admits one per key. Its state after the insert
// (expiry, rotated token, metadata) is its newest epoch claim's.
type lockDoc struct {
	ID    string        `bson:"_id"`
	NS    string        `bson:"ns"`
	Key   string        `bson:"key"`
	Owner string        `bson:"owner"`
	Token int64         `bson:"token"`
	Until bson.DateTime `bson:"until"` // the expiry the acquisition granted
	Meta  []byte        `bson:"meta,omitempty"`
}

// Claim kinds.
const (
	kindToken = "token" // a token was issued (or a floor set)
	kindRenew = "renew" // a renewal: epoch n of a record, with its expiry
	kindEnd   = "end"   // a takeover or force-release of a record
)

// claimDoc is an immutable claim: inserted once, never updated. Its _id
// says what it claims (a token of a key, an epoch of a record); the
// unique _id index lets exactly one inserter win. Claims live in the locks
// collection with ns = 0 (a number, so no namespace string collides with
// it) and key = _id, so the unique (ns, key) index holds them too.
type claimDoc struct {
	ID    string `bson:"_id"`
	NS    int32  `bson:"ns"`
	Key   string `bson:"key"`
	Kind  string `bson:"kind"`
	Owner string `bson:"owner,omitempty"`
	// Token claims: the namespace, key and token claimed, a floor
	// (RaiseFloor) above which the next token must be, and the record.
	TNS   string `bson:"tns,omitempty"`
	TKey  string `bson:"tkey,omitempty"`
	Token int64  `bson:"token,omitempty"`
	Floor int64  `bson:"floor,omitempty"`
	TRec  string `bson:"trec,omitempty"`
	// Epoch claims: the record (rid) and epoch claimed; a renewal's
	// expiry, token and metadata.
	Rec       string        `bson:"rec,omitempty"`
	N         int64         `bson:"n,omitempty"`
	ExpiresAt bson.DateTime `bson:"expiresAt,omitempty"`
	MetaSet   bool          `bson:"metaSet,omitempty"`
	Meta      []byte        `bson:"meta,omitempty"`
	At        bson.DateTime `bson:"at"`
}

func (b *Backend) epochClaim(rid, key, kind, owner string, n int64, now time.Time) claimDoc {
	id := epochID(rid, n)
	return claimDoc{ID: id, Key: id, Kind: kind, Owner: owner, Rec: rid, N: n, At: date(now)}
}

// state is a key's lock as its record and epoch claims describe it.
type state struct {
	rid   string // "" if the key has no record
	owner string
	token int64
	n     int64 // the newest epoch claim's epoch, 0 if none
	exp   bson.DateTime
	meta  []byte
	ended bool // the newest epoch claim is an end: the record is being removed
}

// live reports whether st is a record that holds its key at now.
func (st *state) live(now time.Time) bool {
	return st.rid != "" && !st.ended && !expired(st.exp, now)
}

func (st *state) info(key string, now time.Time) driver.Info {
	if !st.live(now) {
		return driver.Info{Key: key}
	}
	return driver.Info{Key: key, Owner: st.owner, Token: driver.Token(st.token), Remaining: st.exp.Time().Sub(now), Metadata: st.meta}
}

// fold derives a record's state from the record and its epoch claims
// (claims of other records are ignored). Epoch claims below the newest
// are deleted only after the newer one exists, so the newest existing
// claim is the record's last move.
func fold(d *lockDoc, claims []claimDoc) state {
	st := state{rid: strings.TrimPrefix(d.ID, "r/"), owner: d.Owner, token: d.Token, exp: d.Until, meta: d.Meta}
	var head *claimDoc
	for i := range claims {
		if c := &claims[i]; c.Rec == st.rid && (head == nil || c.N > head.N) {
			head = c
		}
	}
	if head == nil {
		return st
	}
	st.n = head.N
	if head.Kind == kindEnd {
		st.ended = true
		return st
	}
	st.token, st.exp = head.Token, head.ExpiresAt
	if head.MetaSet {
		st.meta = head.Meta
	}
	return st
}

// readKey reads key's record and its epoch claims: two finds (the second
// only if there is a record), each served by an index on MongoDB, and a
// third to confirm a record that holds its key (see stateOf).
func (b *Backend) readKey(ctx context.Context, key string) (state, error) {
	var d lockDoc
	err := b.locks.FindOne(ctx, bson.D{{Key: "ns", Value: b.o.Namespace}, {Key: "key", Value: key}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return state{}, nil
	}
	if err != nil {
		return state{}, err
	}
	return b.stateOf(ctx, &d)
}

// stateOf reads the epoch claims of the record d, read a moment ago, and
// returns its state; a state with no record if the record was deleted
// meanwhile. The two finds are not one snapshot: a release deletes the
// record and then its newest claim, so a find of the claims after a
// release that came after the find of the record finds none (or only an
// older one whose delete failed), and the record alone reads as it was
// acquired — its first token and metadata, a state it left with its
// first renewal. So a record that the claims show unended is confirmed by
// a find of its _id after them: still there, it existed all along, and
// the claims found are the record's moves up to their find (a renewal
// deletes a claim only after inserting the next one); gone, the key was
// free when it was deleted. An end claim (takeover, force-release)
// outlives its record, so an ended state needs no confirmation.
func (b *Backend) stateOf(ctx context.Context, d *lockDoc) (state, error) {
	rid := strings.TrimPrefix(d.ID, "r/")
	if h := b.testHookRecordRead; h != nil {
		h()
	}
	claims, err := b.claimsOf(ctx, rid)
	if err != nil {
		return state{}, err
	}
	st := fold(d, claims)
	if st.ended {
		return st, nil
	}
	err = b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: d.ID}}, options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return state{}, nil
	}
	if err != nil {
		return state{}, err
	}
	return st, nil
}

// claimsOf reads the epoch claims of the record rid.
func (b *Backend) claimsOf(ctx context.Context, rid string) ([]claimDoc, error) {
	cur, err := b.locks.Find(ctx, bson.D{{Key: "rec", Value: rid}})
	if err != nil {
		return nil, err
	}
	var claims []claimDoc
	if err := cur.All(ctx, &claims); err != nil {
		return nil, err
	}
	return claims, nil
}

// handle encodes what later calls need to find a grant's record: its
// rid, the epoch of its newest claim and its expiry.
func handle(rid string, n int64, exp bson.DateTime) string {
	return rid + "/" + strconv.FormatInt(n, 10) + "/" + strconv.FormatInt(int64(exp), 10)
}

type grantRef struct {
	rid string
	n   int64
	exp bson.DateTime
}

// parseHandle reads a handle; ok is false for one this backend cannot
// have issued for g (malformed, or its owner digest is not g.Owner's).
func parseHandle(g driver.Grant) (grantRef, bool) {
	p := strings.Split(g.Handle, "/")
	if len(p) != 3 || len(p[0]) != ridLen || p[0][24:] != ownerDigest(g.Owner) {
		return grantRef{}, false
	}
	n, err1 := strconv.ParseInt(p[1], 10, 64)
	e, err2 := strconv.ParseInt(p[2], 10, 64)
	if err1 != nil || err2 != nil || n < 0 {
		return grantRef{}, false
	}
	return grantRef{rid: p[0], n: n, exp: bson.DateTime(e)}, true
}

// held tracks the grants this Backend issued and has not seen end: per
// record, the newest epoch and token it granted. A grant that matches is
// current unless an end claim (takeover, force-release) took its next
// epoch, which its next insert then meets; any other grant is checked
// against the store before it is renewed or released.
type heldGrant struct {
	n     int64
	token int64
	meta  []byte // set by a renewal with SetMetadata: carried forward by later renewals
	set   bool
}

// current reports whether g (at epoch r.n) is the newest grant this
// Backend issued for its record, and returns what it knows.
func (b *Backend) current(g driver.Grant, r grantRef) (heldGrant, bool) {
	b.heldMu.Lock()
	defer b.heldMu.Unlock()
	h, ok := b.held[r.rid]
	return h, ok && h.n == r.n && h.token == int64(g.Token)
}

func (b *Backend) hold(rid string, h heldGrant) {
	b.heldMu.Lock()
	defer b.heldMu.Unlock()
	if b.held == nil {
		b.held = make(map[string]heldGrant)
	}
	b.held[rid] = h
}

func (b *Backend) forget(rid string) {
	b.heldMu.Lock()
	defer b.heldMu.Unlock()
	delete(b.held, rid)
}

// resync checks a grant this Backend does not know as current against
// the store: it reads the record's state and returns its reference if
// g is the live holder (same record, owner and token).
func (b *Backend) resync(ctx context.Context, g driver.Grant, r grantRef) (grantRef, state, error) {
	var d lockDoc
	err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: recordID(r.rid)}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return grantRef{}, state{}, driver.ErrNotHeld
	}
	if err != nil {
		return grantRef{}, state{}, err
	}
	st, err := b.stateOf(ctx, &d)
	if err != nil {
		return grantRef{}, state{}, err
	}
	if !st.live(b.clock.now(ctx)) || st.owner != g.Owner || st.token != int64(g.Token) || d.Key != g.Key || d.NS != b.o.Namespace {
		return grantRef{}, state{}, driver.ErrNotHeld
	}
	return grantRef{rid: r.rid, n: st.n, exp: st.exp}, st, nil
}

// ref finds g's record: from its Handle, or (a grant the engine built from
// Inspect) by reading the key.
func (b *Backend) ref(ctx context.Context, g driver.Grant) (grantRef, error) {
	if g.Handle != "" {
		r, ok := parseHandle(g)
		if !ok {
			return grantRef{}, driver.ErrNotHeld
		}
		return r, nil
	}
	st, err := b.readKey(ctx, g.Key)
	if err != nil {
		return grantRef{}, err
	}
	if !st.live(b.clock.now(ctx)) || st.owner != g.Owner || st.token != int64(g.Token) {
		return grantRef{}, driver.ErrNotHeld
	}
	return grantRef{rid: st.rid, n: st.n, exp: st.exp}, nil
}
