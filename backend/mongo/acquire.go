package mongo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/fencelock/fencelock/driver"
)

// Outcomes of insertRecord.
type insertOutcome int

const (
	inserted  insertOutcome = iota
	keyHeld                 // the (ns, key) index refused the record
	tokenUsed               // the token was claimed before: the base was stale
)

// insertRecord inserts a new record for req with token base+1 and then
// the claim of that token: in one ordered insert where both share a
// collection, else the record's insert and then the claim's. The record
// goes first, so that the claim is applied after every earlier holder of
// the key released: a base that was stale by then meets that holder's
// claim. If the claim collides (the base was stale) or fails, the record
// is deleted again. The record's expiry counts from just before its
// insert, not from the start of the Acquire: a grant never claims a time
// before the read that found the key free.
func (b *Backend) insertRecord(ctx context.Context, req driver.AcquireRequest, base int64) (driver.Grant, insertOutcome, error) {
	if base == math.MaxInt64 {
		return driver.Grant{}, 0, &overflowError{req.Key}
	}
	rd := b.clock.read(ctx)
	now := rd.mid
	tok := base + 1
	rid := newRID(req.Owner)
	// The expiry counts from the latest the server's clock can read, so
	// the record lives at least TTL by the server's clock.
	x := lockDoc{ID: recordID(rid), NS: b.o.Namespace, Key: req.Key, Owner: req.Owner, Token: tok, Until: expiry(rd.late(), req.TTL), Meta: clone(req.Metadata)}
	claim := b.tokenClaim(req.Key, tok, rid, now)
	var err error
	if !b.split() {
		_, err = b.locks.InsertMany(ctx, []any{x, claim})
		if writeErrorAt(err, 0) == 11000 {
			return driver.Grant{}, keyHeld, nil
		}
	} else {
		if _, err = b.locks.InsertOne(ctx, x); mongo.IsDuplicateKeyError(err) {
			return driver.Grant{}, keyHeld, nil
		} else if err != nil {
			return driver.Grant{}, 0, err
		}
		_, err = b.tokens(req.Key).InsertOne(ctx, claim)
	}
	if err == nil {
		b.remember(req.Key, tok)
		b.hold(rid, heldGrant{token: tok})
		return driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(tok), Handle: handle(rid, 0, x.Until)}, inserted, nil
	}
	// No grant: remove the record, even if ctx ended (an abandoned
	// acquire leaves no record behind).
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	dctx, end := b.begin(dctx)
	_, derr := b.locks.DeleteOne(dctx, bson.D{{Key: "_id", Value: x.ID}})
	if derr = end(derr); derr != nil {
		return driver.Grant{}, 0, errors.Join(err, derr)
	}
	if mongo.IsDuplicateKeyError(err) {
		return driver.Grant{}, tokenUsed, nil
	}
	return driver.Grant{}, 0, err
}

// cleanupTimeout bounds the removal of a record whose token claim failed.
const cleanupTimeout = 5 * time.Second

// ensureClaim makes sure the token of st's record (a live record of the
// acquiring owner, found by a retry) is claimed for that record: a record
// whose claim insert failed ambiguously (or whose removal after it failed)
// may have none. It reports false if the token's claim belongs to another
// record or a floor: that record's token cannot be shown to be fresh, and
// it is not granted.
func (b *Backend) ensureClaim(ctx context.Context, key string, st *state, now time.Time) (bool, error) {
	c := b.tokenClaim(key, st.token, st.rid, now)
	_, err := b.tokens(key).InsertOne(ctx, c)
	if err == nil {
		return true, nil
	}
	if !mongo.IsDuplicateKeyError(err) {
		return false, err
	}
	var got claimDoc
	if err := b.tokens(key).FindOne(ctx, bson.D{{Key: "_id", Value: c.ID}}).Decode(&got); err != nil {
		return false, err
	}
	return got.TRec == st.rid, nil
}

// errMoved is the transient error of a same-owner acquire whose record
// moved while it was being renewed: the engine retries.
var errMoved = errors.New("mongo: the record moved during a same-owner acquire; retry")

// maxEndRounds bounds how often one Acquire finishes the removal of an
// ended record before it reports the key held.
const maxEndRounds = 4

// clone copies a metadata payload; nil and empty both become nil.
func clone(md []byte) []byte {
	if len(md) == 0 {
		return nil
	}
	return append([]byte(nil), md...)
}

// Acquire implements driver.Backend.
//
// A free key costs one round trip when this backend issued the key's last
// token itself (recently): one ordered insert of the new record (fresh
// _id, token last+1) and the claim of that token. Otherwise the key's
// record is read first (a live holder is refused after that read), then
// its highest token claim. A held key costs the insert and two reads
// (the record, its epoch claims), or the two reads alone. An expired record is taken over:
// its next epoch is claimed with an end claim (a unique insert), the record
// deleted and a new one inserted.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	ctx, end := b.begin(ctx)
	v, err := b.acquire(ctx, req)
	return v, end(err)
}

func (b *Backend) acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	rd := b.clock.read(ctx)
	now := rd.mid
	base, fresh := b.ownBase(req.Key)
	// start is a base that was the key's highest a moment ago (this
	// Backend's own, or one read in this call), to walk from.
	start := int64(noStart)
	if fresh {
		start = base
	}
	var pre state
	if !fresh {
		// No recent base of this Backend's own: look at the key first.
		// A live holder, the usual answer to a waiter's poll, is then
		// told after three finds (see stateOf), without reading the token claims; an
		// expired record is taken over without an insert first.
		var err error
		if pre, err = b.readKey(ctx, req.Key); err != nil {
			return driver.Grant{}, err
		}
		if pre.live(rd.early()) && pre.owner != req.Owner {
			return driver.Grant{}, &driver.HeldError{Holder: pre.info(req.Key, rd.early())}
		}
	}
	for round := 0; ; round++ {
		var st state
		if round == 0 && pre.rid != "" {
			st = pre
		} else {
			if !fresh {
				var err error
				if base, err = b.highestClaim(ctx, req.Key, now, start); err != nil {
					return driver.Grant{}, err
				}
				start = base
			}
			g, out, err := b.insertRecord(ctx, req, base)
			if err != nil {
				return driver.Grant{}, err
			}
			switch out {
			case inserted:
				return g, nil
			case tokenUsed:
				// Another token claim (an acquire elsewhere, a floor)
				// came between the read of the base and the insert:
				// read again, walking up from base, whose next claim
				// exists (see claimBackoff).
				if err := claimBackoff(ctx, round); err != nil {
					return driver.Grant{}, err
				}
				fresh, start = false, base
				continue
			}
			// keyHeld: read the record.
			if st, err = b.readKey(ctx, req.Key); err != nil {
				return driver.Grant{}, err
			}
			if st.rid == "" {
				if round > 0 {
					return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
				}
				continue // released in between: try once more
			}
		}
		rd = b.clock.read(ctx)
		now = rd.mid
		switch {
		case st.ended:
			// A takeover or force-release claimed the record's last
			// epoch; its ender may have stopped before removing it (its
			// context ended, the server died). The record can never
			// move again (see teardown): finish the removal and try
			// once more.
			if round >= maxEndRounds {
				return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
			}
			if err := b.teardown(ctx, st.rid); err != nil {
				return driver.Grant{}, err
			}
			continue
		case st.owner == req.Owner && st.live(now):
			// A retry after an ambiguous reply: the existing grant,
			// renewed with this request's TTL and metadata, if its
			// token is claimed for it.
			ok, err := b.ensureClaim(ctx, req.Key, &st, now)
			if err != nil {
				return driver.Grant{}, err
			}
			if !ok {
				return driver.Grant{}, &driver.HeldError{Holder: st.info(req.Key, now)}
			}
			b.hold(st.rid, heldGrant{n: st.n, token: st.token})
			g := driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(st.token), Handle: handle(st.rid, st.n, st.exp)}
			g, err = b.renew(ctx, g, driver.RenewRequest{TTL: req.TTL, SetMetadata: true, Metadata: req.Metadata})
			if errors.Is(err, driver.ErrNotHeld) {
				return driver.Grant{}, errMoved
			}
			return g, err
		case st.owner != req.Owner && st.live(rd.early()):
			// Another owner's record is expired only once the earliest
			// the server's clock can read has passed its expiry.
			return driver.Grant{}, &driver.HeldError{Holder: st.info(req.Key, rd.early())}
		case st.owner != req.Owner && req.LockDelay > 0 && !expired(st.exp+bson.DateTime(req.LockDelay.Milliseconds()+1), rd.early()):
			// The record expired (a release deletes it): the key stays
			// refused for the lock delay after that end, judged like
			// the expiry, by the earliest the server's clock can read.
			left := st.exp.Time().Add(req.LockDelay).Sub(rd.early())
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Token: driver.Token(st.token)}, LockDelay: max(left, time.Millisecond)}
		}
		// Expired by the server's clock, if the estimate can tell: one
		// whose bound is too wide (no tight sample since the server
		// stalled) cannot, and the record is left to its holder.
		if limit := takeoverBound(req.TTL); rd.bound > limit {
			if rd = b.clock.tighten(ctx, limit); rd.bound > limit {
				return driver.Grant{}, &uncertainError{key: req.Key, bound: rd.bound, limit: limit}
			}
			if st.live(rd.early()) {
				return driver.Grant{}, &driver.HeldError{Holder: st.info(req.Key, rd.early())}
			}
		}
		if err := b.end(ctx, req.Key, &st, req.Owner, false, rd.early()); err != nil {
			return driver.Grant{}, err
		}
		// The expired record is gone and nobody else can take it over:
		// insert ours, above both its token and every claim.
		hi, err := b.highestClaim(ctx, req.Key, now, start)
		if err != nil {
			return driver.Grant{}, err
		}
		for round := 0; ; round++ {
			hi = max(hi, st.token)
			g, out, err := b.insertRecord(ctx, req, hi)
			if err != nil {
				return driver.Grant{}, err
			}
			switch out {
			case inserted:
				return g, nil
			case keyHeld:
				return driver.Grant{}, b.heldError(ctx, req.Key)
			}
			if err := claimBackoff(ctx, round); err != nil {
				return driver.Grant{}, err
			}
			if hi, err = b.highestClaim(ctx, req.Key, now, hi); err != nil {
				return driver.Grant{}, err
			}
		}
	}
}

// takeoverBound is the widest error bound of the server clock's estimate
// with which an Acquire of ttl judges a record expired: a tenth of ttl,
// the engine's default Margin.
func takeoverBound(ttl time.Duration) time.Duration { return ttl / 10 }

// ErrClockUncertain matches the refusal of an Acquire that found the key's
// record expired by its estimate of the server's clock, but could not
// trust the estimate: its error bound was wider than a tenth of the
// requested TTL (the server answered every recent clock read slowly,
// e.g. after a stall). The record is left to its holder, as if held; the
// error also matches driver.ErrNotAcquired, so Acquire keeps waiting and
// TryAcquire reports the key held.
var ErrClockUncertain = errors.New("mongo: the server's clock is not known closely enough to judge a record expired")

// uncertainError is the refusal ErrClockUncertain describes.
type uncertainError struct {
	key          string
	bound, limit time.Duration
}

func (e *uncertainError) Error() string {
	return fmt.Sprintf("mongo: not acquired: the record of %q looks expired, but this process knows the server's clock only within ±%v (more than %v, a tenth of the TTL: the server answered its recent clock reads slowly); "+
		"the key is left to its holder until a clock read answers within %v (check the server's load and the network, or use a longer TTL)",
		e.key, e.bound.Round(time.Millisecond), e.limit, 2*e.limit)
}

// Is matches ErrClockUncertain and driver.ErrNotAcquired.
func (e *uncertainError) Is(target error) bool {
	return target == ErrClockUncertain || target == driver.ErrNotAcquired
}

// heldError returns the error for a refused acquire: a *HeldError naming
// the holder as far as a read can tell.
func (b *Backend) heldError(ctx context.Context, key string) error {
	info, err := b.inspect(ctx, key)
	if err != nil || info.Owner == "" {
		info = driver.Info{Key: key}
	}
	return &driver.HeldError{Holder: info}
}

// end ends the record of st (expired, or force-released) on behalf of
// owner: it claims the record's next epoch with an "end" claim, so that no
// renewal can succeed after it, then deletes the record and its renewal
// claims. The end claim stays (garbage after GarbageAfter): a renewal
// delayed in flight meets it. A renewal claim already in that epoch wins
// unless its own expiry has passed too (or force); then the end claims the
// epoch after it. A *driver.HeldError reports the record as still held.
//
// The same insert also claims the record's token, if nobody did (a record
// whose token claim was lost with its insert): the tokens below the next
// one are then all claimed.
//
// An end claim can land in an epoch whose renewal claim was already
// deleted, if the holder renewed past it after st was read (a contender
// paused between its read and its insert). The holder deletes a renewal
// claim only after inserting the next one, so a newer claim then exists:
// end looks for one after its insert and, if found, withdraws.
func (b *Backend) end(ctx context.Context, key string, st *state, owner string, force bool, now time.Time) error {
	n := st.n + 1
	claim := b.epochClaim(st.rid, key, kindEnd, owner, n, now)
	_, err := b.locks.InsertOne(ctx, claim)
	switch {
	case mongo.IsDuplicateKeyError(err):
		// Someone claimed epoch n first: a renewal by the holder, or
		// another contender.
		var c claimDoc
		if err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: claim.ID}}).Decode(&c); err != nil {
			if err == mongo.ErrNoDocuments {
				return &driver.HeldError{Holder: driver.Info{Key: key}}
			}
			return err
		}
		if c.Kind != kindRenew || !force && !expired(c.ExpiresAt, now) {
			info := driver.Info{Key: key}
			if c.Kind == kindRenew {
				info = driver.Info{Key: key, Owner: st.owner, Token: driver.Token(c.Token), Remaining: c.ExpiresAt.Time().Sub(now)}
			}
			return &driver.HeldError{Holder: info}
		}
		// The renewal's expiry passed as well: claim the epoch after it.
		n++
		claim = b.epochClaim(st.rid, key, kindEnd, owner, n, now)
		if _, err := b.locks.InsertOne(ctx, claim); mongo.IsDuplicateKeyError(err) {
			return &driver.HeldError{Holder: driver.Info{Key: key}}
		} else if err != nil {
			return err
		}
	case err != nil:
		return err
	}
	// Claim the record's token, if nobody did (its claim was lost with
	// its insert); normally it exists already.
	if _, err := b.tokens(key).InsertOne(ctx, b.tokenClaim(key, st.token, st.rid, now)); err != nil && !mongo.IsDuplicateKeyError(err) {
		return err
	}
	// Epoch n is ours unless the holder had moved past it.
	var newer claimDoc
	err = b.locks.FindOne(ctx, bson.D{{Key: "rec", Value: st.rid}, {Key: "n", Value: bson.D{{Key: "$gt", Value: n}}}}).Decode(&newer)
	switch {
	case err == nil:
		_, _ = b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: claim.ID}})
		return &driver.HeldError{Holder: driver.Info{Key: key}}
	case err != mongo.ErrNoDocuments:
		return err
	}
	return b.teardown(ctx, st.rid)
}

// teardown deletes an ended record and its renewal claims, keeping the
// end claim. Anyone who reads a record whose newest epoch claim is an end
// may call it: that end claim is genuine (a stale one lands in a deleted
// epoch below a newer claim, so it is never the newest), the holder's next
// renewal claims that very epoch and fails, and so the record can never
// move again.
func (b *Backend) teardown(ctx context.Context, rid string) error {
	if _, err := b.locks.DeleteOne(ctx, bson.D{{Key: "_id", Value: recordID(rid)}}); err != nil {
		return err
	}
	_, err := b.locks.DeleteMany(ctx, bson.D{{Key: "rec", Value: rid}, {Key: "kind", Value: kindRenew}})
	return err
}
