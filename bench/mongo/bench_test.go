// Package mongobench compares fencelock's MongoDB backend with the raw
// store operations a lock needs at minimum: insert a document whose _id is
// the key (the unique index makes it a lock) and delete it.
//
//	eval "$(scripts/testenv up mongo mongo-pg)"
//	cd bench/mongo && go test -run '^$' -bench . -benchtime 3s
//
// Every benchmark runs once per server: mongo (FENCELOCK_TEST_MONGO;
// FerretDB's SQLite handler under scripts/testenv) and mongo-pg
// (FENCELOCK_TEST_MONGO_PG; FerretDB's PostgreSQL handler). A server whose
// variable is unset is skipped (a failure under CI=true).
package mongobench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/benchkit"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

const database = "fencelock_bench"

// cmds counts the data commands the benchmarks' connections sent.
var cmds atomic.Int64

var monitor = &event.CommandMonitor{Started: func(_ context.Context, ev *event.CommandStartedEvent) {
	switch ev.CommandName {
	case "insert", "update", "delete", "find", "findAndModify":
		cmds.Add(1)
	}
}}

// server is one Mongo-wire server the benchmarks run on: its scripts/testenv
// name (also the sub-benchmark's) and the variable holding its URL.
type server struct{ name, env string }

var servers = []server{
	{"mongo", "FENCELOCK_TEST_MONGO"},
	{"mongo-pg", "FENCELOCK_TEST_MONGO_PG"},
}

// eachServer runs f as a sub-benchmark per server.
func eachServer(b *testing.B, f func(b *testing.B, s server)) {
	for _, s := range servers {
		b.Run(s.name, func(b *testing.B) { f(b, s) })
	}
}

// connect opens a connection to the server, closed when b ends.
func connect(b *testing.B, s server) *mongo.Client {
	mc, err := mongo.Connect(options.Client().ApplyURI(benchkit.ServerURL(b, s.env)).SetMonitor(monitor))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = mc.Disconnect(context.Background()) })
	return mc
}

// collection returns a fresh collection, dropped when b ends.
func collection(b *testing.B, mc *mongo.Client, name string, opts ...options.Lister[options.CollectionOptions]) *mongo.Collection {
	c := mc.Database(database).Collection(name+"_"+benchkit.RandomHex(), opts...)
	b.Cleanup(func() { _ = c.Drop(context.Background()) })
	return c
}

// raw inserts {_id: key} and deletes it, with the same write concern as
// the backend. Waiting retries the insert with the same capped backoff as
// the engine.
func raw(s server) benchkit.Lib {
	return benchkit.Lib{Name: "raw", Setup: func(b *testing.B) benchkit.Lockers {
		j := true
		coll := collection(b, connect(b, s), "raw", options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: &j}))
		try := func(ctx context.Context, key string) (func() error, error) {
			_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "owner", Value: "raw"}, {Key: "expiresAt", Value: time.Now().Add(30 * time.Second)}})
			if mongo.IsDuplicateKeyError(err) {
				return nil, benchkit.ErrHeld
			}
			if err != nil {
				return nil, err
			}
			return func() error {
				_, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "owner", Value: "raw"}})
				return err
			}, nil
		}
		return benchkit.Same(try, benchkit.Poll(try, time.Millisecond, 50*time.Millisecond))
	}}
}

// fencelockLib is the fencelock client on fresh collections: shared, or one
// per goroutine.
func fencelockLib(s server, shared bool) benchkit.Lib {
	return benchkit.FencelockLib("fencelock", shared, func(b *testing.B) func() (*fencelock.Client, error) {
		mc := connect(b, s)
		locks := collection(b, mc, "locks")
		return func() (*fencelock.Client, error) {
			be, err := mongolock.New(context.Background(), mc, &mongolock.Options{Database: database, Collection: locks.Name()})
			if err != nil {
				return nil, err
			}
			return fencelock.New(be, &fencelock.Options{TTL: 30 * time.Second, MinBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond})
		}
	})
}

func libs(s server) []benchkit.Lib { return []benchkit.Lib{raw(s), fencelockLib(s, true)} }

// BenchmarkUncontended: one goroutine, one key, acquire then release.
func BenchmarkUncontended(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) { benchkit.Uncontended(b, libs(s), benchkit.Rate("locks/s")) })
}

// BenchmarkDistinct16: 16 goroutines, each on its own key.
func BenchmarkDistinct16(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) { benchkit.Distinct(b, 16, libs(s), benchkit.Rate("locks/s")) })
}

// BenchmarkContended8: 8 goroutines (fencelock: 8 clients) loop freely on
// one key; each acquisition is one hand-off, its wait one acquire call.
// Reports hand-offs per second, the p50/p99 wait for the key, and the
// commands the server received per hand-off (polling cost).
func BenchmarkContended8(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) {
		benchkit.Contended(b, 8, []benchkit.Lib{raw(s), fencelockLib(s, false)},
			benchkit.Barging(), benchkit.Unit(time.Millisecond), benchkit.ServerCPU(benchkit.TestenvCPU(s.name)),
			benchkit.PerHandoff("cmds/handoff", func() (float64, error) { return float64(cmds.Load()), nil }))
	})
}
