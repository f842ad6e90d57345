package mongo

import (
	"context"
	"math"
	"regexp"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.TokenFloorer = (*Backend)(nil)

// HighWater implements driver.TokenFloorer: for every key of this
// namespace under prefix, the highest of its token claims (token or
// floor) and of its record's token, read with a find per token
// collection (one, or TokenShards on FerretDB) and one of the records. A
// key's highest claim is never deleted, so every key ever locked is
// listed. Global is zero: tokens are per key.
func (b *Backend) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	ctx, end := b.begin(ctx)
	v, err := b.highWater(ctx, prefix)
	return v, end(err)
}

func (b *Backend) highWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if err := b.check(ctx); err != nil {
		return driver.HighWater{}, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return driver.HighWater{}, err
	}
	hw := driver.HighWater{Keys: make(map[string]driver.Token)}
	re := bson.D{{Key: "$regex", Value: "^" + regexp.QuoteMeta(prefix)}}
	for _, tc := range b.tokenColls {
		cur, err := tc.Find(ctx, bson.D{{Key: "tns", Value: b.o.Namespace}, {Key: "tkey", Value: re}},
			options.Find().SetProjection(bson.D{{Key: "tkey", Value: 1}, {Key: "token", Value: 1}, {Key: "floor", Value: 1}}))
		if err != nil {
			return driver.HighWater{}, err
		}
		var claims []claimDoc
		if err := cur.All(ctx, &claims); err != nil {
			return driver.HighWater{}, err
		}
		for _, c := range claims {
			if len(c.TKey) >= len(prefix) && c.TKey[:len(prefix)] == prefix {
				hw.Keys[c.TKey] = max(hw.Keys[c.TKey], driver.Token(max(c.Token, c.Floor)))
			}
		}
	}
	cur, err := b.locks.Find(ctx, bson.D{{Key: "ns", Value: b.o.Namespace}, {Key: "key", Value: re}},
		options.Find().SetProjection(bson.D{{Key: "key", Value: 1}, {Key: "token", Value: 1}}))
	if err != nil {
		return driver.HighWater{}, err
	}
	var recs []lockDoc
	if err := cur.All(ctx, &recs); err != nil {
		return driver.HighWater{}, err
	}
	for _, d := range recs {
		if len(d.Key) >= len(prefix) && d.Key[:len(prefix)] == prefix {
			hw.Keys[d.Key] = max(hw.Keys[d.Key], driver.Token(d.Token))
		}
	}
	return hw, nil
}

// RaiseFloor implements driver.TokenFloorer for one key. It reads the
// key's highest claim h (and claims the token of the key's record for it
// if that is above h: a record whose own claim is in flight or failed) and,
// if the floor is above it, inserts the claim of token h+1 carrying the
// floor: no token at or below h+1 can be
// claimed any more (every one is, or its claim collides), and the next
// claim is based on max(h+1, floor). A concurrent claim of h+1 makes it
// read again and retry (see claimBackoff). There is no global
// floor (key "" returns driver.ErrUnsupported).
func (b *Backend) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	ctx, end := b.begin(ctx)
	return end(b.raiseFloor(ctx, key, floor))
}

func (b *Backend) raiseFloor(ctx context.Context, key string, floor driver.Token) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if key == "" {
		return driver.ErrUnsupported
	}
	if err := driver.ValidateKey(key); err != nil {
		return err
	}
	if floor >= math.MaxInt64 {
		return &driver.InvalidOptionError{Option: "token floor", Value: strconv.FormatUint(uint64(floor), 10), Reason: "must be below 2^63-1, the largest BSON int64"}
	}
	if floor == 0 {
		return nil
	}
	now := b.clock.now(ctx)
	start := int64(noStart)
	for round := 0; ; round++ {
		h, err := b.highestClaim(ctx, key, now, start)
		if err != nil {
			return err
		}
		start = h
		var d lockDoc
		err = b.locks.FindOne(ctx, bson.D{{Key: "ns", Value: b.o.Namespace}, {Key: "key", Value: key}}).Decode(&d)
		if err != nil && err != mongo.ErrNoDocuments {
			return err
		}
		if d.Token > h {
			// The record's token has no claim yet (its acquire's claim
			// insert is in flight, or failed): claim it for the record,
			// as a takeover does, and read again. A floor claim above an
			// unclaimed token would leave a hole below it, where a walk
			// stops (and that token would be issued after the floor).
			if _, err := b.tokens(key).InsertOne(ctx, b.tokenClaim(key, d.Token, strings.TrimPrefix(d.ID, "r/"), now)); err != nil && !mongo.IsDuplicateKeyError(err) {
				return err
			}
			if err := claimBackoff(ctx, round); err != nil {
				return err
			}
			continue
		}
		if h >= int64(floor) {
			return nil
		}
		c := b.tokenClaim(key, h+1, "", now)
		c.Floor = int64(floor)
		if _, err := b.tokens(key).InsertOne(ctx, c); err == nil || !mongo.IsDuplicateKeyError(err) {
			return err
		}
		if err := claimBackoff(ctx, round); err != nil {
			return err
		}
		now = b.clock.now(ctx)
	}
}
