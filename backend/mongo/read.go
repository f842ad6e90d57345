package mongo

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock/driver"
)

// Release implements driver.Backend: one delete of the grant's record by
// its _id (plus one of its newest renewal claim, if it was renewed). The
// _id names the acquisition and its owner and is never reused, so a stale
// release cannot remove a later holder's record. A grant that is not the
// newest this Backend issued for its record (one from before a rotation)
// is checked against the store first. A release after the grant's expiry
// is ErrNotHeld.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	ctx, end := b.begin(ctx)
	return end(b.release(ctx, g))
}

func (b *Backend) release(ctx context.Context, g driver.Grant) error {
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
	if _, ok := b.current(g, r); !ok {
		if r, _, err = b.resync(ctx, g, r); err != nil {
			return err
		}
	}
	b.forget(r.rid)
	if expired(r.exp, b.clock.now(ctx)) {
		return driver.ErrNotHeld
	}
	res, err := b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: recordID(r.rid)}})
	if err != nil {
		return err
	}
	if r.n > 0 {
		_, _ = b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: epochID(r.rid, r.n)}})
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
	ctx, end := b.begin(ctx)
	v, err := b.forceRelease(ctx, key)
	return v, end(err)
}

func (b *Backend) forceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	now := b.clock.now(ctx)
	st, err := b.readKey(ctx, key)
	if err != nil {
		return driver.Info{}, err
	}
	if st.rid == "" || st.ended {
		return driver.Info{Key: key}, nil
	}
	info := st.info(key, now)
	// An administrator's end wins over a pending renewal: claim the
	// renewal's epoch or the one after it.
	if err := b.end(ctx, key, &st, "force-release", true, now); err != nil {
		if _, held := err.(*driver.HeldError); held {
			return driver.Info{}, fmt.Errorf("mongo: force-release of %q raced another move of its record; retry", key)
		}
		return driver.Info{}, err
	}
	return info, nil
}

// Inspect implements driver.Backend with two finds: the record on
// (ns, key), then its epoch claims; and a third that confirms a record
// that holds the key (see stateOf: a release between the two would
// otherwise show the record as it was acquired).
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	ctx, end := b.begin(ctx)
	v, err := b.inspect(ctx, key)
	return v, end(err)
}

func (b *Backend) inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	// The store's time before the finds: a renewal that lands after the
	// claims were read, just before their expiry, must not make a key
	// held throughout the read look expired (the claims read were in
	// effect at this time at the latest).
	now := b.clock.now(ctx)
	st, err := b.readKey(ctx, key)
	if err != nil {
		return driver.Info{}, err
	}
	return st.info(key, now), nil
}

// List implements driver.Backend: the held keys of this namespace that
// start with prefix, found with an anchored, quoted regular expression on
// the key (which the (ns, key) index serves as a range scan), and the
// epoch claims of their records (one more find), and the records that hold
// their keys confirmed (a third, see stateOf).
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	ctx, end := b.begin(ctx)
	v, err := b.list(ctx, prefix)
	return v, end(err)
}

func (b *Backend) list(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	filter := bson.D{{Key: "ns", Value: b.o.Namespace}}
	if prefix != "" {
		filter = append(filter, bson.E{Key: "key", Value: bson.D{{Key: "$regex", Value: "^" + regexp.QuoteMeta(prefix)}}})
	}
	cur, err := b.locks.Find(ctx, filter)
	if err != nil {
		return nil, err
	}
	var recs []lockDoc
	if err := cur.All(ctx, &recs); err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, nil
	}
	if h := b.testHookRecordRead; h != nil {
		h()
	}
	rids := make(bson.A, len(recs))
	for i := range recs {
		rids[i] = strings.TrimPrefix(recs[i].ID, "r/")
	}
	cur, err = b.locks.Find(ctx, bson.D{{Key: "rec", Value: bson.D{{Key: "$in", Value: rids}}}})
	if err != nil {
		return nil, err
	}
	var claims []claimDoc
	if err := cur.All(ctx, &claims); err != nil {
		return nil, err
	}
	byRec := make(map[string][]claimDoc)
	for _, c := range claims {
		byRec[c.Rec] = append(byRec[c.Rec], c)
	}
	now := b.clock.now(ctx)
	out := make([]driver.Info, 0, len(recs))
	var held bson.A // the records that hold their keys by their claims
	for i := range recs {
		d := &recs[i]
		st := fold(d, byRec[strings.TrimPrefix(d.ID, "r/")])
		// The server compares by byte; keep the exact prefix rule here.
		if in := st.info(d.Key, now); in.Owner != "" && strings.HasPrefix(in.Key, prefix) {
			out = append(out, in)
			held = append(held, d.ID)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	// Confirm them, as stateOf does one: a record released between the
	// two finds above has lost its claims, and reads as it was acquired.
	cur, err = b.locks.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: held}}}}, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, err
	}
	var left []struct {
		ID string `bson:"_id"`
	}
	if err := cur.All(ctx, &left); err != nil {
		return nil, err
	}
	still := make(map[string]bool, len(left))
	for _, d := range left {
		still[d.ID] = true
	}
	kept := out[:0]
	for i, in := range out {
		if still[held[i].(string)] {
			kept = append(kept, in)
		}
	}
	out = kept
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
