package mongo

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Finding a key's highest token claim by _id.
//
// A sorted find over a key's claims is served by an index on MongoDB, but
// FerretDB 1.24 serves no query from a secondary index: it reads every
// document of the tokens collection (one claim per acquisition, kept for
// GarbageAfter), so at a few thousand claims that one find takes a second
// (docs/safety-soak.md, "Third run"). A find by _id is cheap on every
// server, and a key's claims above a recent highest one have consecutive
// tokens, so the highest claim is found by probing _ids:
//
//   - Every claim is of base+1 for a base read from an existing claim (its
//     token, or the floor it carries), so above any claim the tokens are
//     consecutive up to the highest claim, except for the gap that a floor
//     claim of token t with floor f > t leaves: t+1 … f are never claimed,
//     and the next claim is f+1.
//   - Garbage collection deletes only claims older than GarbageAfter. A
//     claim inserted after a moment less than GarbageAfter/2 ago has not
//     been deleted, so above a base that was a key's highest at such a
//     moment (a start) there are no holes but the floors' gaps.
//
// walk gallops from a start (probing start+1, +2, +4, … until one is
// missing), bisects to the last claim p whose p+1 is missing, and
// continues from p's floor if p carries one above its token; otherwise p
// is the highest claim (as of the probe). A start comes from this
// Backend's own last claim (see ownBase), from a claim the caller just saw
// collide, or from the key's hint: a document naming a base and the moment
// it was the key's highest, rewritten by a walk that needed many probes
// and by every full read; or 0, when the key's claim of token 1 (its
// first, never deleted) is itself recent. Only when no start is recent
// enough, or a walk needs more than maxWalkProbes probes, is the key's
// highest claim read with the sorted find.

// noStart tells highestClaim that the caller knows no recent base.
const noStart = -1

// maxWalkProbes bounds the finds of one walk; past it the highest claim is
// read with the sorted find.
const maxWalkProbes = 48

// hintAfterProbes is the length of a walk after which it rewrites the
// key's hint.
const hintAfterProbes = 4

// kindHint marks a key's hint document: a base and when it was the key's
// highest.
const kindHint = "hint"

// hintID is the _id of key's hint: distinct from every claim's and
// record's _id, NUL-free like tokenID.
func (b *Backend) hintID(key string) string {
	return "h/" + strconv.Itoa(len(b.o.Namespace)) + "/" + b.o.Namespace + "/" + key
}

// readHint returns the base key's hint names if it was the key's highest
// less than GarbageAfter/2 before now, else noStart.
func (b *Backend) readHint(ctx context.Context, key string, now time.Time) (int64, error) {
	var h claimDoc
	err := b.highs(key).FindOne(ctx, bson.D{{Key: "_id", Value: b.hintID(key)}}).Decode(&h)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return noStart, nil
	case err != nil:
		return 0, err
	case h.Kind != kindHint || !h.At.Time().After(now.Add(-b.cacheAge())):
		return noStart, nil
	}
	return h.Token, nil
}

// writeHint records that base was key's highest at the moment at. Best
// effort: it replaces only a hint with a lower base (an upsert that finds
// a higher one collides, and is ignored), and any error is ignored, since
// a hint only saves probes. On a server whose updates are a read and a
// write (FerretDB), two writers may leave the lower of their hints; each
// is a base and a moment that belong together, so any is sound.
func (b *Backend) writeHint(ctx context.Context, key string, base int64, at time.Time) {
	id := b.hintID(key)
	doc := claimDoc{ID: id, Key: id, Kind: kindHint, Token: base, At: date(at)}
	_, _ = b.tokens(key).ReplaceOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "token", Value: bson.D{{Key: "$lt", Value: base}}}}, doc,
		options.Replace().SetUpsert(true))
}

// probe returns the claim of key's token tok, or ok false if there is none.
func (b *Backend) probe(ctx context.Context, key string, tok int64) (c claimDoc, ok bool, err error) {
	err = b.highs(key).FindOne(ctx, bson.D{{Key: "_id", Value: b.tokenID(key, tok)}},
		options.FindOne().SetProjection(bson.D{{Key: "token", Value: 1}, {Key: "floor", Value: 1}, {Key: "at", Value: 1}})).Decode(&c)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return c, false, nil
	}
	return c, err == nil, err
}

// walk returns the base of key's next claim (the highest claim's token,
// or the floor it carries if higher) and the highest claim's token (0 if
// there is no claim above start), probing _ids upward from start, a base
// that was the key's highest less than GarbageAfter/2 ago. It reports
// ok false after maxWalkProbes probes without an answer.
func (b *Backend) walk(ctx context.Context, key string, start int64) (base, top int64, probes int, ok bool, err error) {
	base = start
	for {
		// Find the last claim of the run of consecutive tokens from
		// base+1: gallop, then bisect.
		lo, hi := base, int64(0) // lo's claim exists (or lo is base); hi's is missing
		var loc claimDoc
		for step := int64(1); hi == 0; step *= 2 {
			p := lo + step
			if lo > math.MaxInt64-step {
				p = math.MaxInt64 // never claimed: tokens stay below it
			}
			if probes++; probes > maxWalkProbes {
				return 0, 0, probes, false, nil
			}
			c, present, err := b.probe(ctx, key, p)
			if err != nil {
				return 0, 0, probes, false, err
			}
			if !present {
				hi = p
				break
			}
			lo, loc = p, c
			if lo == math.MaxInt64 {
				hi = lo // the last token there is
				break
			}
		}
		for hi-lo > 1 {
			m := lo + (hi-lo)/2
			if probes++; probes > maxWalkProbes {
				return 0, 0, probes, false, nil
			}
			c, present, err := b.probe(ctx, key, m)
			if err != nil {
				return 0, 0, probes, false, err
			}
			if present {
				lo, loc = m, c
			} else {
				hi = m
			}
		}
		if lo == base {
			return base, top, probes, true, nil // no claim above base
		}
		top = lo
		if loc.Floor <= lo {
			return lo, top, probes, true, nil
		}
		base = loc.Floor // a floor claim: the next run starts above its floor
	}
}
