package mongo_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// TestGarbageAfterWithSubMillisecondPartOpens: a GarbageAfter the options
// accept (between 1m and 1 year) but not a whole number of milliseconds
// opens a new collection, and a second Backend given the same value opens
// it too; the collection records the value the Backends use.
func TestGarbageAfterWithSubMillisecondPartOpens(t *testing.T) {
	eachServer(t, testGarbageAfterWithSubMillisecondPartOpens)
}

func testGarbageAfterWithSubMillisecondPartOpens(t *testing.T, _ server, raw string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := connect(t, raw)
	coll := freshCollection(t, raw)
	ga := 90*time.Second + 500*time.Microsecond
	if err := (&mongolock.Options{GarbageAfter: ga}).Validate(); err != nil {
		t.Fatalf("Validate refuses %v: %v", ga, err)
	}
	for i := range 2 {
		b, err := mongolock.New(ctx, client, &mongolock.Options{Database: testDatabase, Collection: coll, GarbageAfter: ga})
		if err != nil {
			t.Fatalf("New #%d with GarbageAfter %v on its own collection: %v", i+1, ga, err)
		}
		got := b.Options().GarbageAfter
		b.Close()
		var d bson.M
		if err := client.Database(testDatabase).Collection(coll).FindOne(ctx, bson.D{{Key: "_id", Value: "c/garbageAfter"}}).Decode(&d); err != nil {
			t.Fatal(err)
		}
		if ms := d["garbageAfterMs"]; fmt.Sprint(ms) != fmt.Sprint(got.Milliseconds()) || got.Truncate(time.Millisecond) != got {
			t.Errorf("Backend uses %v, the collection records %v ms", got, ms)
		}
	}
}

// TestConcurrentOpensAgreeOnGarbageAfter: Backends opened at once on a
// new collection, each with another GarbageAfter, and some with none:
// every one that opens uses one value, the recorded one; every refused
// one is refused with a *GarbageAfterError naming that value.
func TestConcurrentOpensAgreeOnGarbageAfter(t *testing.T) {
	eachServer(t, testConcurrentOpensAgreeOnGarbageAfter)
}

func testConcurrentOpensAgreeOnGarbageAfter(t *testing.T, _ server, raw string) {
	for round := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		client := connect(t, raw)
		coll := freshCollection(t, raw)
		const n = 8
		var wg sync.WaitGroup
		bs := make([]*mongolock.Backend, n)
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				ga := time.Duration(0)
				if i%2 == 0 {
					ga = time.Duration(i+2) * time.Minute
				}
				bs[i], errs[i] = mongolock.New(ctx, client, &mongolock.Options{Database: testDatabase, Collection: coll, GarbageAfter: ga})
			}()
		}
		close(start)
		wg.Wait()
		var d bson.M
		if err := client.Database(testDatabase).Collection(coll).FindOne(ctx, bson.D{{Key: "_id", Value: "c/garbageAfter"}}).Decode(&d); err != nil {
			t.Fatal(err)
		}
		stored := time.Duration(d["garbageAfterMs"].(int64)) * time.Millisecond
		for i := range n {
			if errs[i] != nil {
				var ge *mongolock.GarbageAfterError
				if !errors.As(errs[i], &ge) || ge.Stored != stored {
					t.Errorf("round %d: Backend %d refused with %v; want a GarbageAfterError naming %v", round, i, errs[i], stored)
				}
				continue
			}
			if got := bs[i].Options().GarbageAfter; got != stored {
				t.Errorf("round %d: Backend %d uses %v; the collection records %v", round, i, got, stored)
			}
			bs[i].Close()
		}
		cancel()
	}
}
