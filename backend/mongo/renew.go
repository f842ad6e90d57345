package mongo

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock/driver"
)

func validGrant(g driver.Grant) error {
	if err := driver.ValidateKey(g.Key); err != nil {
		return err
	}
	if g.Owner == "" || g.Token == 0 || g.Token > 1<<63-1 {
		return driver.ErrNotHeld
	}
	return nil
}

// renewClaim is the claim of epoch r.n+1 of g's record that a renewal
// inserts: the new expiry, the token (tok: g's, or a rotation's new one)
// and the metadata (h's carried forward, or req's).
func (b *Backend) renewClaim(g driver.Grant, r grantRef, h heldGrant, req driver.RenewRequest, tok int64, exp bson.DateTime, now time.Time) claimDoc {
	c := b.epochClaim(r.rid, g.Key, kindRenew, g.Owner, r.n+1, now)
	c.Token, c.ExpiresAt = tok, exp
	switch {
	case req.SetMetadata:
		c.MetaSet, c.Meta = true, clone(req.Metadata)
	case h.set:
		c.MetaSet, c.Meta = true, h.meta
	}
	return c
}

// Renew implements driver.Backend. A renewal is one insert: the immutable
// claim of the record's next epoch, carrying the new expiry (and, with
// Rotate, a new token claimed like an acquire's; with SetMetadata, the new
// metadata). The record itself is never written. A claim already taken by
// someone else means the record was taken over or force-released:
// ErrNotHeld. The previous claim is then deleted (garbage): two round
// trips, three with Rotate.
//
// A grant that is not the newest this Backend issued for its record (a
// stale grant from before a rotation, one built from Inspect, another
// Backend's) is first checked against the store: it must be the live
// holder, same owner and token.
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	ctx, end := b.begin(ctx)
	v, err := b.renew(ctx, g, req)
	return v, end(err)
}

func (b *Backend) renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := validGrant(g); err != nil {
		return driver.Grant{}, err
	}
	r, err := b.ref(ctx, g)
	if err != nil {
		return driver.Grant{}, err
	}
	h, ok := b.current(g, r)
	if !ok {
		var st state
		if r, st, err = b.resync(ctx, g, r); err != nil {
			return driver.Grant{}, err
		}
		h = heldGrant{n: st.n, token: st.token, meta: st.meta, set: st.meta != nil}
	}
	rd := b.clock.read(ctx)
	now := rd.mid
	if expired(r.exp, now) {
		b.forget(r.rid)
		return driver.Grant{}, driver.ErrNotHeld
	}
	tok := int64(g.Token)
	if req.Rotate {
		if tok, err = b.claimToken(ctx, g.Key, r.rid, now); err != nil {
			return driver.Grant{}, err
		}
	}
	claim := b.renewClaim(g, r, h, req, tok, expiry(rd.late(), req.TTL), now)
	adopted := false // claim is an earlier attempt's, with the expiry it set
	if _, err := b.locks.InsertOne(ctx, claim); mongo.IsDuplicateKeyError(err) {
		// Our own earlier attempt (a retry), or someone else's end.
		var c claimDoc
		if err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: claim.ID}}).Decode(&c); err != nil {
			if err == mongo.ErrNoDocuments {
				b.forget(r.rid)
				return driver.Grant{}, driver.ErrNotHeld
			}
			return driver.Grant{}, err
		}
		// Ours only if it renews this grant: same owner, and the same
		// token unless this is a rotation (whose first attempt chose
		// the new token).
		if c.Kind != kindRenew || c.Owner != g.Owner || c.Token != int64(g.Token) && !req.Rotate {
			b.forget(r.rid)
			return driver.Grant{}, driver.ErrNotHeld
		}
		// This call's own insert (the driver retried the write) is not
		// adopted: it has this call's expiry.
		adopted = c.At != claim.At || c.ExpiresAt != claim.ExpiresAt
		claim = c
	} else if err != nil {
		return driver.Grant{}, err
	}
	b.hold(r.rid, heldGrant{n: claim.N, token: claim.Token, meta: claim.Meta, set: claim.MetaSet})
	if r.n > 0 {
		// Garbage: the claim of epoch n+1 exists, so the newest claim
		// still describes the record without it.
		_, _ = b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: epochID(r.rid, r.n)}})
	}
	out := driver.Grant{Key: g.Key, Owner: g.Owner, Token: driver.Token(claim.Token), Handle: handle(r.rid, claim.N, claim.ExpiresAt)}
	if !adopted {
		// Our insert: the expiry is req.TTL from before the store's
		// receipt, as the engine counts it. An answer that took longer
		// than the TTL (a short minimum-hold renewal on a slow server)
		// is still a renewal the store applied, not a loss.
		return out, nil
	}
	if left := claim.ExpiresAt.Time().Sub(b.clock.read(ctx).late()); left < req.TTL {
		// A retry found the expiry its first attempt set. What is left
		// of it is counted from the late edge of the clock estimate, so
		// that an estimate running slow (by up to its bound) cannot
		// make the holder believe in more time than the server gives.
		if left <= 0 {
			return driver.Grant{}, driver.ErrNotHeld
		}
		out.TTL = left
	}
	return out, nil
}

// maxBatch bounds the grants renewed by one round of RenewBatch.
const maxBatch = 500

// RenewBatch implements driver.BatchRenewer. Without rotation it renews up
// to 500 current grants with two commands: one unordered insert of their
// epoch claims and one delete of the previous claims (garbage). A grant
// whose claim collides (a retry, or an end of its record), or that is not
// the newest this Backend issued for its record, is renewed alone with
// Renew; rotating renewals too.
//
// The records are never written: on FerretDB an update writes one
// document per transaction (100 renewals cost seconds on SQLite), and a
// bulk of one update statement per record as large as its connection pool
// deadlocks the server (FerretDB 1.24 keeps each statement's read open
// until the command ends and takes another pooled connection per write).
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	ctx, end := b.begin(ctx)
	v, err := b.renewBatch(ctx, grants, req)
	return v, end(err)
}

func (b *Backend) renewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	out := make([]driver.RenewResult, len(grants))
	if req.Rotate || req.SetMetadata {
		for i, g := range grants {
			out[i].Grant, out[i].Err = b.renew(ctx, g, req)
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

// renewItem is one grant of a batch renewal and the epoch claim made for it.
type renewItem struct {
	i int      // index in the batch
	r grantRef // the grant's record
	c claimDoc // the claim of its next epoch
}

func (b *Backend) renewChunk(ctx context.Context, grants []driver.Grant, req driver.RenewRequest, out []driver.RenewResult) error {
	rd := b.clock.read(ctx)
	now := rd.mid
	// Expiries count from the latest the server's clock can read (see
	// insertRecord).
	exp := expiry(rd.late(), req.TTL)
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
		r, ok := parseHandle(g)
		if !ok {
			out[i].Err = driver.ErrNotHeld
			continue
		}
		h, cur := b.current(g, r)
		if !cur {
			single = append(single, i)
			continue
		}
		if expired(r.exp, now) {
			b.forget(r.rid)
			out[i].Err = driver.ErrNotHeld
			continue
		}
		items = append(items, renewItem{i: i, r: r, c: b.renewClaim(g, r, h, req, int64(g.Token), exp, now)})
	}
	if len(items) > 0 {
		docs := make([]any, len(items))
		for j := range items {
			docs[j] = items[j].c
		}
		_, err := b.locks.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
		var dels bson.A
		for j, it := range items {
			switch code := writeErrorAt(err, j); {
			case code == 0 || code == -1 && err == nil:
				g := grants[it.i]
				b.hold(it.r.rid, heldGrant{n: it.c.N, token: it.c.Token, meta: it.c.Meta, set: it.c.MetaSet})
				g.Handle = handle(it.r.rid, it.c.N, it.c.ExpiresAt)
				out[it.i].Grant = g
				if it.r.n > 0 {
					dels = append(dels, epochID(it.r.rid, it.r.n))
				}
			case code == 11000:
				single = append(single, it.i)
			default:
				return err
			}
		}
		if len(dels) > 0 {
			// Garbage only; a failure leaves claims the records have
			// moved past. One statement: FerretDB deletes what it
			// matched in one write.
			_, _ = b.locks.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: dels}}}})
		}
	}
	for _, i := range single {
		out[i].Grant, out[i].Err = b.renew(ctx, grants[i], req)
	}
	return nil
}
