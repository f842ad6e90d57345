package mongofence_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance/resource"
	"github.com/fencelock/fencelock/internal/testenv"

	mongofence "github.com/fencelock/fencelock/kit/mongo"
)

// testColl connects to FENCELOCK_TEST_MONGO and returns a collection of
// its own, dropped at the end.
func testColl(t testing.TB) *mongo.Collection {
	t.Helper()
	raw := testenv.URL(t, "FENCELOCK_TEST_MONGO")
	client, err := mongo.Connect(options.Client().ApplyURI(raw).SetTimeout(30 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	coll := client.Database("fencelock_test").Collection("kit_" + hex.EncodeToString(rnd[:]))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = coll.Drop(ctx)
		_ = client.Disconnect(ctx)
	})
	return coll
}

// docResource writes name's value to the document {_id: name} with an
// upserting UpdateOne.
type docResource struct{ coll *mongo.Collection }

func (r docResource) Write(ctx context.Context, name string, token fencelock.Token, holder, value string) error {
	_, err := mongofence.UpdateOne(ctx, r.coll, bson.D{{Key: "_id", Value: name}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "value", Value: value}}}}, token, holder,
		options.UpdateOne().SetUpsert(true))
	return err
}

func (r docResource) Read(ctx context.Context, name string) (string, bool, error) {
	var doc struct {
		Value string `bson:"value"`
	}
	err := r.coll.FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return "", false, nil
	}
	return doc.Value, err == nil, err
}

// replaceResource writes name's value by an upserting ReplaceOne.
type replaceResource struct{ coll *mongo.Collection }

func (r replaceResource) Write(ctx context.Context, name string, token fencelock.Token, holder, value string) error {
	_, err := mongofence.ReplaceOne(ctx, r.coll, bson.D{{Key: "_id", Value: name}},
		bson.D{{Key: "_id", Value: name}, {Key: "value", Value: value}}, token, holder,
		options.Replace().SetUpsert(true))
	return err
}

func (r replaceResource) Read(ctx context.Context, name string) (string, bool, error) {
	return docResource(r).Read(ctx, name)
}

// ferretDB reports whether coll's server is FerretDB, whose update and
// replace are a read and then a write, without isolation
// (docs/backends/mongo.md): no filter-guarded update is atomic there, so
// concurrent fenced writes can land out of order.
func ferretDB(t *testing.T, coll *mongo.Collection) bool {
	t.Helper()
	var bi bson.M
	if err := coll.Database().Client().Database("admin").RunCommand(t.Context(), bson.D{{Key: "buildInfo", Value: 1}}).Decode(&bi); err != nil {
		t.Fatal(err)
	}
	_, ok := bi["ferretdbVersion"]
	return ok
}

// runSuite runs the resource conformance suite over r. On FerretDB it
// runs the rule's table in order instead (one writer at a time), since
// FerretDB does not apply an update atomically.
func runSuite(t *testing.T, coll *mongo.Collection, r resource.Resource) {
	if !ferretDB(t, coll) {
		resource.Run(t, resource.Harness{Resource: func(t *testing.T) resource.Resource { return r }})
		return
	}
	t.Log("FerretDB: its update is a read then a write, without isolation; running the rule's table one writer at a time, not the concurrent cases")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	name := "table-" + hex.EncodeToString(rnd[:])
	last, seen := "", false
	for i, c := range resource.Cases {
		value := fmt.Sprintf("step-%d", i+1)
		err := r.Write(ctx, name, c.Token, c.Holder, value)
		switch {
		case c.Accept && err != nil:
			t.Fatalf("step %d (%s): token %d from %q refused: %v", i+1, c.Why, c.Token, c.Holder, err)
		case !c.Accept && !errors.Is(err, fencelock.ErrStaleToken):
			t.Fatalf("step %d (%s): token %d from %q: %v; want refused with fencelock.ErrStaleToken", i+1, c.Why, c.Token, c.Holder, err)
		case c.Accept:
			last, seen = value, true
		}
		got, ok, err := r.Read(ctx, name)
		if err != nil || got != last || ok != seen {
			t.Fatalf("step %d (%s): Read = %q, %v, %v; want %q", i+1, c.Why, got, ok, err, last)
		}
	}
}

// TestResourceConformanceUpdateOne runs the resource conformance suite
// over an upserting UpdateOne against the shared MongoDB.
func TestResourceConformanceUpdateOne(t *testing.T) {
	coll := testColl(t)
	runSuite(t, coll, docResource{coll})
}

// TestResourceConformanceReplaceOne runs the resource conformance suite
// over an upserting ReplaceOne.
func TestResourceConformanceReplaceOne(t *testing.T) {
	coll := testColl(t)
	runSuite(t, coll, replaceResource{coll})
}

// TestRefusalIsToldFromAbsence: without upsert, an update that matches
// no document reports mongo.ErrNoDocuments, and one refused by a higher
// fence a *fencelock.StaleTokenError with that fence, exactly past 2^53;
// a token past 2^63-1 is refused with a *TokenRangeError.
func TestRefusalIsToldFromAbsence(t *testing.T) {
	coll := testColl(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	set := bson.D{{Key: "$set", Value: bson.D{{Key: "balance", Value: 1}}}}
	_, err := mongofence.UpdateOne(ctx, coll, bson.D{{Key: "_id", Value: "acct"}}, set, 5, "a")
	if !errors.Is(err, mongo.ErrNoDocuments) || errors.Is(err, fencelock.ErrStaleToken) {
		t.Fatalf("update of an absent document: %v; want mongo.ErrNoDocuments", err)
	}
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "acct"}, {Key: "balance", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	const high = 1<<53 + 1
	if _, err := mongofence.UpdateOne(ctx, coll, bson.D{{Key: "_id", Value: "acct"}}, set, high, "a"); err != nil {
		t.Fatalf("first fenced update: %v", err)
	}
	_, err = mongofence.UpdateOne(ctx, coll, bson.D{{Key: "_id", Value: "acct"}}, set, 1<<53, "b")
	var stale *fencelock.StaleTokenError
	if !errors.As(err, &stale) || stale.Highest != high || stale.Token != 1<<53 {
		t.Fatalf("update with 2^53 after 2^53+1: %v; want a *fencelock.StaleTokenError with Highest %d", err, fencelock.Token(high))
	}
	_, err = mongofence.UpdateOne(ctx, coll, bson.D{{Key: "_id", Value: "acct"}}, set, 1<<63, "b")
	if !errors.Is(err, mongofence.ErrTokenRange) {
		t.Fatalf("update with 2^63: %v; want mongofence.ErrTokenRange", err)
	}
	var doc struct {
		Fence  int64  `bson:"fence"`
		Holder string `bson:"fence_holder"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "acct"}}).Decode(&doc); err != nil || doc.Fence != high || doc.Holder != "a" {
		t.Fatalf("document after refusals: %+v, %v; want fence %d from a", doc, err, int64(high))
	}
}

// TestUpdateWritingFenceFieldsIsRefused: an update that writes a fence
// field itself, or a pipeline, is refused with ErrBadUpdate, unwritten.
func TestUpdateWritingFenceFieldsIsRefused(t *testing.T) {
	coll := testColl(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, update := range []any{
		bson.D{{Key: "$set", Value: bson.D{{Key: "fence", Value: 99}}}},
		bson.D{{Key: "$unset", Value: bson.D{{Key: "fence_holder", Value: ""}}}},
		bson.A{bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}},
	} {
		_, err := mongofence.UpdateOne(ctx, coll, bson.D{{Key: "_id", Value: "x"}}, update, 5, "a", options.UpdateOne().SetUpsert(true))
		if !errors.Is(err, mongofence.ErrBadUpdate) {
			t.Errorf("update %v: %v; want ErrBadUpdate", update, err)
		}
	}
	if n, err := coll.CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Fatalf("documents after refused updates: %d, %v; want 0", n, err)
	}
}
