package mongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/fencelock/fencelock/driver"
)

// GarbageAfter belongs to the collection, not to one Backend: a Backend
// trusts its own last token claim as the base of its next one for
// GarbageAfter/2, while any Backend's garbage collection deletes claims
// older than its own GarbageAfter. Two values on one collection let a
// collector with the shorter one delete claims that a Backend with the
// longer one still builds on, and that Backend then issues a token that
// was already issued. So the first Backend on a collection records its
// value there (the document configID, inserted once, never updated), and
// every later one uses it: a Backend whose Options.GarbageAfter is zero
// adopts it, one whose value differs is refused with ErrGarbageAfter.

// configID is the _id of the collection's GarbageAfter document, in the
// records' collection (ns 0 and key = _id, like every claim, so the
// unique (ns, key) index holds it without colliding with a namespace).
const configID = "c/garbageAfter"

// kindConfig marks the collection's GarbageAfter document.
const kindConfig = "config"

// configDoc records the collection's GarbageAfter, in milliseconds.
type configDoc struct {
	ID             string        `bson:"_id"`
	NS             int32         `bson:"ns"`
	Key            string        `bson:"key"`
	Kind           string        `bson:"kind"`
	GarbageAfterMS int64         `bson:"garbageAfterMs"`
	At             bson.DateTime `bson:"at"`
}

// ErrGarbageAfter matches the error of New and Open for an
// Options.GarbageAfter that differs from the value recorded in the
// collection by the first Backend that used it. Nothing is changed in the
// collection. The error (a *GarbageAfterError) also matches
// driver.ErrInvalidOption.
var ErrGarbageAfter = errors.New("mongo: GarbageAfter differs from the collection's")

// GarbageAfterError is the error ErrGarbageAfter matches: the
// collection's recorded value and the one given.
type GarbageAfterError struct {
	Collection string        // database.collection
	Stored     time.Duration // the collection's GarbageAfter
	Given      time.Duration // Options.GarbageAfter
}

// Error says what differs and how to fix it.
func (e *GarbageAfterError) Error() string {
	return fmt.Sprintf("mongo: Options.GarbageAfter is %v, but the collection %s records %v, which every Backend on it must use "+
		"(a collector with a shorter value deletes token claims that a Backend with a longer one still builds on, and tokens go backwards); "+
		"set GarbageAfter to %v or leave it zero to adopt the collection's, or use another collection; "+
		"to change the collection's value, stop every Backend on it and delete the document {_id: %q} (and, on MongoDB, the index fencelock_garbage) first",
		e.Given, e.Collection, e.Stored, e.Stored, configID)
}

// Is matches ErrGarbageAfter and driver.ErrInvalidOption.
func (e *GarbageAfterError) Is(target error) bool {
	return target == ErrGarbageAfter || target == driver.ErrInvalidOption
}

// garbageAfter ties b's GarbageAfter to the collection's (see above):
// it reads the recorded value, or records b's (or, in a collection made
// before values were recorded, the one its TTL index was made with), and
// adopts it; explicit tells whether Options.GarbageAfter was given, in
// which case a different recorded value is refused.
func (b *Backend) garbageAfter(ctx context.Context, explicit bool) error {
	name := b.o.Database + "." + b.o.Collection
	for range 2 {
		var d configDoc
		err := b.locks.FindOne(ctx, bson.D{{Key: "_id", Value: configID}}).Decode(&d)
		if err == nil {
			stored := time.Duration(d.GarbageAfterMS) * time.Millisecond
			if d.Kind != kindConfig || stored <= 0 {
				return fmt.Errorf("mongo: %s: the document {_id: %q} is not a GarbageAfter record: %w", name, configID, ErrOldFormat)
			}
			// The record keeps milliseconds: a value with a finer part
			// (which the options accept) is the same value.
			if stored != b.o.GarbageAfter {
				if explicit && stored != b.o.GarbageAfter.Truncate(time.Millisecond) {
					return &GarbageAfterError{Collection: name, Stored: stored, Given: b.o.GarbageAfter}
				}
				b.o.GarbageAfter = stored
			}
			return nil
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return fmt.Errorf("mongo: reading the GarbageAfter of %s: %w", name, err)
		}
		value := b.o.GarbageAfter
		if !explicit {
			if v, ok, err := b.ttlIndexValue(ctx); err != nil {
				return err
			} else if ok {
				value = v
			}
		}
		_, err = b.locks.InsertOne(ctx, configDoc{ID: configID, Key: configID, Kind: kindConfig,
			GarbageAfterMS: value.Milliseconds(), At: date(time.Now())})
		if err != nil && !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("mongo: recording the GarbageAfter of %s: %w", name, err)
		}
		// Read it back: ours, or another Backend's that came first.
	}
	return fmt.Errorf("mongo: %s: the GarbageAfter record could not be read back", name)
}

// ttlIndexValue returns the expiry of the garbage TTL index, if the
// collection has one (MongoDB; made by an earlier Backend with its own
// GarbageAfter).
func (b *Backend) ttlIndexValue(ctx context.Context) (time.Duration, bool, error) {
	cur, err := b.locks.Indexes().List(ctx)
	if err != nil {
		var ce mongo.CommandError
		if errors.As(err, &ce) && ce.Code == 26 { // NamespaceNotFound: a new collection
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("mongo: listing the indexes of %s.%s: %w", b.o.Database, b.o.Collection, err)
	}
	var ixs []struct {
		Name   string        `bson:"name"`
		Expire bson.RawValue `bson:"expireAfterSeconds"`
	}
	if err := cur.All(ctx, &ixs); err != nil {
		return 0, false, err
	}
	for _, ix := range ixs {
		if n, ok := ix.Expire.AsInt64OK(); ok && ix.Name == "fencelock_garbage" && n > 0 {
			return time.Duration(n) * time.Second, true, nil
		}
	}
	return 0, false, nil
}
