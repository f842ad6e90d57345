package mongo

import (
	"context"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// FENCELOCK_TEST_MONGO_LAYOUT=one runs the tests with the token claims in
// the records' collection on every server: the layout MongoDB gets, which
// the FerretDB test servers otherwise never see.
func init() { oneCollection = os.Getenv("FENCELOCK_TEST_MONGO_LAYOUT") == "one" }

// OneCollection reports whether the tests run the single-collection layout.
func OneCollection() bool { return oneCollection }

// EndAsIfReadAt runs the takeover's end step as a contender that read
// key's record at epoch n, judged it expired, and was paused until now.
func (b *Backend) EndAsIfReadAt(ctx context.Context, key string, n int64) error {
	st, err := b.readKey(ctx, key)
	if err != nil {
		return err
	}
	st.n = n
	st.exp = date(time.Unix(0, 0))
	return b.end(ctx, key, &st, "paused-contender", false, b.clock.now(ctx))
}

// ClaimEndOnly inserts the end claim of key's record's next epoch and
// stops there, as an ender whose context ended (or whose server died)
// right after its claim.
func (b *Backend) ClaimEndOnly(ctx context.Context, key string) error {
	st, err := b.readKey(ctx, key)
	if err != nil {
		return err
	}
	_, err = b.locks.InsertOne(ctx, b.epochClaim(st.rid, key, kindEnd, "stopped-ender", st.n+1, b.clock.now(ctx)))
	return err
}

// InsertRecordOnly inserts a record of key for owner with the token after
// the key's highest claim, and no claim of that token: what an acquire
// leaves whose claim insert failed and whose removal of the record failed
// too. It returns the record's token.
func (b *Backend) InsertRecordOnly(ctx context.Context, key, owner string, ttl time.Duration) (int64, error) {
	now := b.clock.now(ctx)
	base, err := b.highestClaim(ctx, key, now, noStart)
	if err != nil {
		return 0, err
	}
	rid := newRID(owner)
	_, err = b.locks.InsertOne(ctx, lockDoc{ID: recordID(rid), NS: b.o.Namespace, Key: key, Owner: owner, Token: base + 1, Until: expiry(now, ttl)})
	return base + 1, err
}

// ClaimTokenForOther inserts the claim of key's token tok for a record
// that is not key's.
func (b *Backend) ClaimTokenForOther(ctx context.Context, key string, tok int64) error {
	_, err := b.tokens(key).InsertOne(ctx, b.tokenClaim(key, tok, newRID("other"), b.clock.now(ctx)))
	return err
}

// WalkFrom returns the base of key's next claim as walk finds it from
// start, and whether it found it within maxWalkProbes probes.
func (b *Backend) WalkFrom(ctx context.Context, key string, start int64) (int64, bool, error) {
	base, _, _, ok, err := b.walk(ctx, key, start)
	return base, ok, err
}

// ScanHighest returns the base of key's next claim as the sorted find
// reads it.
func (b *Backend) ScanHighest(ctx context.Context, key string) (int64, error) {
	base, _, err := b.scanHighest(ctx, key)
	return base, err
}

// AgeClaim dates the claim of key's token tok age before now, as if it
// had been made then.
func (b *Backend) AgeClaim(ctx context.Context, key string, tok int64, age time.Duration) error {
	_, err := b.tokens(key).UpdateOne(ctx, bson.D{{Key: "_id", Value: b.tokenID(key, tok)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "at", Value: date(b.clock.now(ctx).Add(-age))}}}})
	return err
}

// SetHint writes key's hint: base was the key's highest age ago.
func (b *Backend) SetHint(ctx context.Context, key string, base int64, age time.Duration) error {
	id := b.hintID(key)
	_, err := b.tokens(key).ReplaceOne(ctx, bson.D{{Key: "_id", Value: id}},
		claimDoc{ID: id, Key: id, Kind: kindHint, Token: base, At: date(b.clock.now(ctx).Add(-age))}, options.Replace().SetUpsert(true))
	return err
}

// DeleteClaims deletes the claims of key's tokens lo to hi, as garbage
// collection does with old ones.
func (b *Backend) DeleteClaims(ctx context.Context, key string, lo, hi int64) error {
	for tok := lo; tok <= hi; tok++ {
		if _, err := b.tokens(key).DeleteOne(ctx, bson.D{{Key: "_id", Value: b.tokenID(key, tok)}}); err != nil {
			return err
		}
	}
	return nil
}

// PauseBetweenReads makes every read of a key's state (Inspect, List, and
// the reads of Acquire, Renew and Release) call f between its find of the
// records and its find of their epoch claims.
func (b *Backend) PauseBetweenReads(f func()) { b.testHookRecordRead = f }
