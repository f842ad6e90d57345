package mongo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock/driver"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// connect returns a client of the test server raw, disconnected when the
// test ends.
func connect(t *testing.T, raw string) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(raw))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Disconnect(ctx)
	})
	return c
}

// TestGarbageAfterBelongsToTheCollection: the first Backend on a
// collection records its GarbageAfter there; a later Backend given
// another value is refused with a *GarbageAfterError (matching
// ErrGarbageAfter and driver.ErrInvalidOption) that changes nothing
// stored, and one given none adopts the collection's.
func TestGarbageAfterBelongsToTheCollection(t *testing.T) {
	eachServer(t, testGarbageAfterBelongsToTheCollection)
}

func testGarbageAfterBelongsToTheCollection(t *testing.T, _ server, raw string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := connect(t, raw)
	coll := freshCollection(t, raw)
	first, err := mongolock.New(ctx, client, &mongolock.Options{Database: testDatabase, Collection: coll, GarbageAfter: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	_, err = mongolock.New(ctx, client, &mongolock.Options{Database: testDatabase, Collection: coll, GarbageAfter: 10 * time.Minute})
	var ge *mongolock.GarbageAfterError
	if !errors.As(err, &ge) || !errors.Is(err, mongolock.ErrGarbageAfter) || !errors.Is(err, driver.ErrInvalidOption) {
		t.Fatalf("New with GarbageAfter 10m on a collection of 2h = %v; want a *GarbageAfterError", err)
	}
	if ge.Stored != 2*time.Hour || ge.Given != 10*time.Minute {
		t.Errorf("GarbageAfterError = %+v; want stored 2h, given 10m", ge)
	}
	// The refusal changed nothing: a Backend that adopts the value gets 2h.
	for _, open := range []func() (*mongolock.Backend, error){
		func() (*mongolock.Backend, error) {
			return mongolock.New(ctx, client, &mongolock.Options{Database: testDatabase, Collection: coll})
		},
		func() (*mongolock.Backend, error) {
			return mongolock.Open(ctx, withParams(t, raw, "database", testDatabase, "collection", coll))
		},
	} {
		b, err := open()
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Options().GarbageAfter; got != 2*time.Hour {
			t.Errorf("a Backend without GarbageAfter got %v; want the collection's 2h", got)
		}
		b.Close()
	}
}

// TestTokensRiseAcrossGarbageAfterSettings: one Backend given GarbageAfter
// 2h, others opened without one (the default is 1h), on one collection.
// The first issues a key's tokens 1 and 2 and keeps 2 as its base (for
// GarbageAfter/2 = 1h); the others issue tokens up to 65, the claims of 3
// to 63 being 90 minutes old, and the one that reads the key's highest
// claim at 64 collects garbage. With each Backend's own value, that
// collector (1h) deleted claims 3 to 63, and the first Backend, building
// on its base 2, was granted token 3 again after 65. With the value tied
// to the collection, every token is above every earlier one.
func TestTokensRiseAcrossGarbageAfterSettings(t *testing.T) {
	eachServer(t, testTokensRiseAcrossGarbageAfterSettings)
}

func testTokensRiseAcrossGarbageAfterSettings(t *testing.T, _ server, raw string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := connect(t, raw)
	coll := freshCollection(t, raw)
	long, err := mongolock.New(ctx, client, &mongolock.Options{Database: testDatabase, Collection: coll, GarbageAfter: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	u := withParams(t, raw, "database", testDatabase, "collection", coll)
	others := make([]*mongolock.Backend, 2)
	for i := range others {
		if others[i], err = mongolock.Open(ctx, u); err != nil {
			t.Fatal(err)
		}
		defer others[i].Close()
	}
	const key = "k"
	var last driver.Token
	take := func(b *mongolock.Backend) driver.Token {
		t.Helper()
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "o", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if g.Token <= last {
			t.Fatalf("token %d issued after %d", g.Token, last)
		}
		last = g.Token
		if err := b.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		return g.Token
	}
	take(long)
	take(long)
	for last < 64 {
		take(others[0])
	}
	for tok := int64(3); tok < 64; tok++ {
		if err := others[0].AgeClaim(ctx, key, tok, 90*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// others[1] reads the key's highest claim (64): its garbage
	// collection runs; Close waits for it.
	take(others[1])
	others[1].Close()
	take(long)
}
