// Package mongofence applies fencelock's fencing rule inside MongoDB, in
// the same update as your own, so that a paused holder's late write can
// never land after the next holder's.
//
// The rule, from docs/fencing.md
// (https://github.com/fencelock/fencelock/blob/main/docs/fencing.md):
// a write carrying token T from holder H is accepted if T is greater than
// the highest token the resource has accepted, or if T equals that highest
// token and H is the holder that presented it; an accepted write records T
// and H; anything else is refused and changes nothing. Token 0 is never
// accepted.
//
// Here the resource is a document. Its highest token is the field "fence"
// (FieldToken, an int64: MongoDB compares 64-bit integers exactly) and its
// holder the field "fence_holder" (FieldHolder). UpdateOne and ReplaceOne
// add the rule to your filter, as
//
//	{$and: [<your filter>, {$or: [
//	    {fence: {$lt: T}},
//	    {fence: T, fence_holder: H},
//	    {fence: {$exists: false}}]}]}
//
// and the record to your update ($set of both fields), so the check, the
// record and the write are one single-document update: no transaction
// and no pipeline update is needed (FerretDB runs it too). A document
// without a fence has seen no token.
//
// When the update matches nothing, the document is looked up by your
// filter alone, to tell a refusal (a *fencelock.StaleTokenError, matching
// fencelock.ErrStaleToken, with the document's fence) from an absent
// document (an error matching mongo.ErrNoDocuments).
//
// With upsert (options.UpdateOne().SetUpsert(true)), a refused write to an
// existing document makes MongoDB try to insert one, which fails with a
// duplicate key error when your filter names a unique key; that error is
// reported as the refusal it is. Upsert only with a filter on a unique
// key (such as _id): otherwise a refused write inserts a second document.
//
// The check and the write are atomic where a single-document update is,
// as on MongoDB. Not on FerretDB 1.24: it runs an update as a read and
// then a write, without isolation (docs/backends/mongo.md), so two
// concurrent fenced writes can both pass the filter and land out of
// order. There, serialize the writers of a document yourself, or fence
// another store.
//
// Tokens above 2^63-1 (the largest int64; no fencelock backend that issues
// tokens to users of MongoDB goes past it) are refused with a
// *TokenRangeError before anything is written.
package mongofence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock"
)

// The fields of a fenced document.
const (
	// FieldToken is the field holding the highest token accepted, an
	// int64.
	FieldToken = "fence"
	// FieldHolder is the field holding the holder that presented it.
	FieldHolder = "fence_holder"
)

// attempts bounds the look-ups after an update that matched nothing while
// the document kept changing under it.
const attempts = 3

// ErrTokenRange is matched by every *TokenRangeError.
var ErrTokenRange = errors.New("mongofence: fencing token out of range")

// TokenRangeError reports a token that an int64 cannot hold (above
// 2^63-1). Nothing was written. It matches ErrTokenRange, not
// fencelock.ErrStaleToken: the token was not judged by the rule.
type TokenRangeError struct {
	// Token is the token given.
	Token fencelock.Token
}

// Error implements error.
func (e *TokenRangeError) Error() string {
	return fmt.Sprintf("mongofence: fencing token %d is above 2^63-1, the largest int64 MongoDB stores: "+
		"keep the lock on a backend whose tokens stay below 2^63", e.Token)
}

// Is reports whether target is ErrTokenRange.
func (e *TokenRangeError) Is(target error) bool { return target == ErrTokenRange }

// ErrBadUpdate is matched by the errors of an update or replacement that
// mongofence cannot fence: a pipeline, or one that writes the fence
// fields itself. Nothing was written.
var ErrBadUpdate = errors.New("mongofence: update cannot be fenced")

// Filter returns the rule as a query filter: it matches a document whose
// fence accepts token from holder. Combine it with your filter in an
// $and, and set Record in the same single-document update. For token 0 it
// matches nothing.
func Filter(token fencelock.Token, holder string) (bson.D, error) {
	t, err := tokenInt(token)
	if err != nil {
		return nil, err
	}
	if t == 0 {
		return bson.D{{Key: "_id", Value: bson.D{{Key: "$exists", Value: false}}}}, nil // never
	}
	return bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: FieldToken, Value: bson.D{{Key: "$lt", Value: t}}}},
		bson.D{{Key: FieldToken, Value: t}, {Key: FieldHolder, Value: holder}},
		bson.D{{Key: FieldToken, Value: bson.D{{Key: "$exists", Value: false}}}},
	}}}, nil
}

// Record returns the fields that record token and holder as a document's
// highest: {fence: token, fence_holder: holder}, for a $set.
func Record(token fencelock.Token, holder string) (bson.D, error) {
	t, err := tokenInt(token)
	if err != nil {
		return nil, err
	}
	return bson.D{{Key: FieldToken, Value: t}, {Key: FieldHolder, Value: holder}}, nil
}

func tokenInt(token fencelock.Token) (int64, error) {
	if token > math.MaxInt64 {
		return 0, &TokenRangeError{Token: token}
	}
	return int64(token), nil
}

// UpdateOne updates one document matching filter with update (a document
// of update operators, such as $set) if its fence accepts token from
// holder, and records them in the same update. A refused token returns a
// *fencelock.StaleTokenError and writes nothing; no document matching
// filter returns an error matching mongo.ErrNoDocuments. update must not
// write the fence fields.
func UpdateOne(ctx context.Context, coll *mongo.Collection, filter, update any, token fencelock.Token, holder string, opts ...options.Lister[options.UpdateOneOptions]) (*mongo.UpdateResult, error) {
	rec, err := Record(token, holder)
	if err != nil {
		return nil, err
	}
	upd, err := fencedUpdate(update, rec)
	if err != nil {
		return nil, err
	}
	var o options.UpdateOneOptions
	for _, l := range opts {
		for _, set := range l.List() {
			if err := set(&o); err != nil {
				return nil, err
			}
		}
	}
	upsert := o.Upsert != nil && *o.Upsert
	return fenced(ctx, coll, filter, token, holder, upsert, func(f bson.D) (*mongo.UpdateResult, error) {
		return coll.UpdateOne(ctx, f, upd, opts...)
	})
}

// ReplaceOne replaces one document matching filter with replacement if
// its fence accepts token from holder; the replacement carries the record
// (any fence fields it has are replaced by token and holder). A refused
// token returns a *fencelock.StaleTokenError and writes nothing; no
// document matching filter returns an error matching mongo.ErrNoDocuments.
func ReplaceOne(ctx context.Context, coll *mongo.Collection, filter, replacement any, token fencelock.Token, holder string, opts ...options.Lister[options.ReplaceOptions]) (*mongo.UpdateResult, error) {
	rec, err := Record(token, holder)
	if err != nil {
		return nil, err
	}
	doc, err := toD(replacement, "replacement")
	if err != nil {
		return nil, err
	}
	repl := make(bson.D, 0, len(doc)+2)
	for _, e := range doc {
		if strings.HasPrefix(e.Key, "$") {
			return nil, fmt.Errorf("%w: the replacement has an operator %q: use UpdateOne for updates", ErrBadUpdate, e.Key)
		}
		if e.Key != FieldToken && e.Key != FieldHolder {
			repl = append(repl, e)
		}
	}
	repl = append(repl, rec...)
	var o options.ReplaceOptions
	for _, l := range opts {
		for _, set := range l.List() {
			if err := set(&o); err != nil {
				return nil, err
			}
		}
	}
	upsert := o.Upsert != nil && *o.Upsert
	return fenced(ctx, coll, filter, token, holder, upsert, func(f bson.D) (*mongo.UpdateResult, error) {
		return coll.ReplaceOne(ctx, f, repl, opts...)
	})
}

// fenced runs write with filter and the rule, and tells a refusal from an
// absent document when it matches nothing.
func fenced(ctx context.Context, coll *mongo.Collection, filter any, token fencelock.Token, holder string, upsert bool, write func(bson.D) (*mongo.UpdateResult, error)) (*mongo.UpdateResult, error) {
	rule, err := Filter(token, holder)
	if err != nil {
		return nil, err
	}
	if filter == nil {
		filter = bson.D{}
	}
	f, err := withRule(filter, rule)
	if err != nil {
		return nil, err
	}
	for range attempts {
		var res *mongo.UpdateResult
		err, dup := error(nil), false
		if token != 0 { // 0 is refused unwritten: an upsert would insert it
			res, err = write(f)
			dup = upsert && err != nil && mongo.IsDuplicateKeyError(err)
			switch {
			case err != nil && !dup:
				return nil, fmt.Errorf("mongofence: fenced write to %s: %w", coll.Name(), err)
			case err == nil && (res.MatchedCount > 0 || res.UpsertedCount > 0):
				return res, nil
			}
		}
		// Nothing matched (or the upsert collided): refused, or absent?
		var doc bson.Raw
		err = coll.FindOne(ctx, filter, options.FindOne().
			SetProjection(bson.D{{Key: FieldToken, Value: 1}, {Key: FieldHolder, Value: 1}})).Decode(&doc)
		if errors.Is(err, mongo.ErrNoDocuments) {
			if token == 0 {
				return nil, &fencelock.StaleTokenError{Resource: coll.Name(), Token: token}
			}
			if dup {
				continue // inserted and gone again, or another unique key: write again
			}
			return nil, fmt.Errorf("mongofence: no document in %s matches the filter: %w", coll.Name(), mongo.ErrNoDocuments)
		}
		if err != nil {
			return nil, fmt.Errorf("mongofence: look up the document refused in %s: %w", coll.Name(), err)
		}
		if err := judge(coll.Name(), doc, token, holder); err != nil {
			return nil, err
		}
		// The document accepts the token now: it changed since the write
		// (a concurrent upsert inserted it). Write again.
	}
	return nil, fmt.Errorf("mongofence: the document in %s changed under %d fenced writes in a row: retry the write", coll.Name(), attempts)
}

// judge applies the rule to doc's fence: nil if it accepts token from
// holder, a *fencelock.StaleTokenError if it refuses it.
func judge(coll string, doc bson.Raw, token fencelock.Token, holder string) error {
	resource := coll
	if id, err := doc.LookupErr("_id"); err == nil {
		resource = coll + "/" + id.String()
	}
	v, err := doc.LookupErr(FieldToken)
	if err != nil {
		if token == 0 {
			return &fencelock.StaleTokenError{Resource: resource, Token: token}
		}
		return nil // no fence: no token seen
	}
	high, ok := v.AsInt64OK()
	if !ok || high < 0 {
		return fmt.Errorf("mongofence: the document %s has a %s field of %s, not a token mongofence wrote: "+
			"no fenced write can match it until it is unset or set to an int64", resource, FieldToken, v)
	}
	who, _ := doc.Lookup(FieldHolder).StringValueOK()
	if token != 0 && (uint64(token) > uint64(high) || (uint64(token) == uint64(high) && holder == who)) {
		return nil
	}
	return &fencelock.StaleTokenError{Resource: resource, Token: token, Highest: fencelock.Token(high)}
}

// fencedUpdate returns update with rec added to its $set, after checking
// that it is a document of operators none of which writes a fence field.
func fencedUpdate(update any, rec bson.D) (bson.D, error) {
	doc, err := toD(update, "update")
	if err != nil {
		return nil, err
	}
	out := make(bson.D, 0, len(doc)+1)
	set := false
	for _, op := range doc {
		if !strings.HasPrefix(op.Key, "$") {
			return nil, fmt.Errorf("%w: the update's field %q is not an update operator: use ReplaceOne to replace a document", ErrBadUpdate, op.Key)
		}
		fields, ok := op.Value.(bson.D)
		if !ok {
			return nil, fmt.Errorf("%w: the update's %s is not a document", ErrBadUpdate, op.Key)
		}
		for _, e := range fields {
			for _, f := range []string{FieldToken, FieldHolder} {
				if e.Key == f || strings.HasPrefix(e.Key, f+".") {
					return nil, fmt.Errorf("%w: the update's %s writes %q, which the fenced write records itself", ErrBadUpdate, op.Key, e.Key)
				}
			}
		}
		if op.Key == "$set" {
			fields = append(append(bson.D(nil), fields...), rec...)
			set = true
		}
		out = append(out, bson.E{Key: op.Key, Value: fields})
	}
	if !set {
		out = append(out, bson.E{Key: "$set", Value: rec})
	}
	return out, nil
}

// withRule returns filter with rule added to it. The filter's own fields
// stay at the top level, where an upsert takes the new document's
// equality fields (such as _id) from; the rule joins its $and.
func withRule(filter any, rule bson.D) (bson.D, error) {
	doc, err := toD(filter, "filter")
	if err != nil {
		return nil, err
	}
	out := make(bson.D, 0, len(doc)+1)
	joined := false
	for _, e := range doc {
		if e.Key == "$and" {
			and, ok := e.Value.(bson.A)
			if !ok {
				return nil, fmt.Errorf("%w: the filter's $and is not an array", ErrBadUpdate)
			}
			e.Value = append(append(bson.A(nil), and...), rule)
			joined = true
		}
		out = append(out, e)
	}
	if !joined {
		out = append(out, bson.E{Key: "$and", Value: bson.A{rule}})
	}
	return out, nil
}

// toD turns a document given as any type the driver marshals (bson.D,
// bson.M, a struct) into a bson.D.
func toD(v any, what string) (bson.D, error) {
	if _, ok := v.(bson.A); ok {
		return nil, fmt.Errorf("%w: the %s is a pipeline: give a document", ErrBadUpdate, what)
	}
	raw, err := bson.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: the %s is not a document (a pipeline cannot be fenced): %v", ErrBadUpdate, what, err)
	}
	var d bson.D
	if err := bson.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("%w: the %s: %v", ErrBadUpdate, what, err)
	}
	return d, nil
}
