// Package mongobench compares fencelock's MongoDB backend with the raw
// store operations a lock needs at minimum: insert a document whose _id is
// the key (the unique index makes it a lock) and delete it.
//
//	eval "$(scripts/testenv up mongo mongo-pg)"
//	cd bench/mongo && go test -run '^$' -bench Interleaved -benchtime 20x -count 5 .
//	cd bench/mongo && go test -run '^$' -bench Commands -benchtime 500x .
//
// Every benchmark runs once per server: mongo (FENCELOCK_TEST_MONGO;
// FerretDB's SQLite handler under scripts/testenv) and mongo-pg
// (FENCELOCK_TEST_MONGO_PG; FerretDB's PostgreSQL handler). A server whose
// variable is unset is skipped (a failure under CI=true).
//
// fencelock is opened as a user of URLs gets it: fencelock.Open(ctx, URL,
// nil) with the test server's URL and only database= and collection= added
// (a fresh collection per run), so TTL, renewal and pool are the defaults.
// "backend" is the backend's Acquire and Release alone, on New with the
// default Options and the same fresh-collection settings.
package mongobench

import (
	"context"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

const database = "fencelock_bench"

// ttl is the backend-only lease's TTL: fencelock's default, which the
// clients get from the URL.
const ttl = 15 * time.Second

// counter counts the data commands a client sent.
type counter struct{ n atomic.Int64 }

func (c *counter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, ev *event.CommandStartedEvent) {
		switch ev.CommandName {
		case "insert", "update", "delete", "find", "findAndModify", "getMore":
			c.n.Add(1)
		}
	}}
}

// cmds counts the commands of every client the benchmarks connect.
var cmds counter

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

// connect opens a connection to the server, closed when b ends; its
// commands are counted by cmds and by c, if not nil.
func connect(b *testing.B, s server, c *counter) *mongo.Client {
	mon := cmds.monitor()
	if c != nil {
		both := mon.Started
		mine := c.monitor().Started
		mon = &event.CommandMonitor{Started: func(ctx context.Context, ev *event.CommandStartedEvent) { both(ctx, ev); mine(ctx, ev) }}
	}
	mc, err := mongo.Connect(options.Client().ApplyURI(benchkit.ServerURL(b, s.env)).SetMonitor(mon))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = mc.Disconnect(context.Background()) })
	return mc
}

// collection returns a fresh collection name, the collection (and the
// backend's token claims' collection, on FerretDB) dropped when b ends.
func collection(b *testing.B, mc *mongo.Client, name string) string {
	n := name + "_" + benchkit.RandomHex()
	b.Cleanup(func() {
		_ = mc.Database(database).Collection(n).Drop(context.Background())
		for _, t := range mongolock.TokenCollections(n) {
			_ = mc.Database(database).Collection(t).Drop(context.Background())
		}
	})
	return n
}

// raw inserts {_id: key, owner, expiresAt} and deletes it by {_id, owner},
// with the same write concern as the backend (majority, journaled): the
// least a lock needs (exclusion by the unique _id, an owner-checked
// delete), without expiry handling or fencing. Waiting retries the insert
// with capped backoff.
func raw(s server, c *counter) benchkit.Lib {
	return benchkit.Lib{Name: "raw", Setup: func(b *testing.B) benchkit.Lockers {
		j := true
		mc := connect(b, s, c)
		coll := mc.Database(database).Collection(collection(b, mc, "raw"),
			options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: &j}))
		try := func(ctx context.Context, key string) (func() error, error) {
			_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "owner", Value: "raw"}, {Key: "expiresAt", Value: time.Now().Add(ttl)}})
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

// backendLib is the backend's Acquire and Release alone (no engine), one
// Backend shared by the goroutines, with the default Options on a fresh
// collection.
func backendLib(s server, c *counter) benchkit.Lib { return agedBackendLib(s, c, 0) }

// agedBackendLib is backendLib on a collection that already holds the
// token claims of aged other keys, as it would after aged acquisitions
// within GarbageAfter (1 hour): the steady state of a lock service.
func agedBackendLib(s server, c *counter, aged int) benchkit.Lib {
	return benchkit.BackendLib("backend", true, ttl, func(b *testing.B) func() (driver.Backend, error) {
		mc := connect(b, s, c)
		coll := collection(b, mc, "locks")
		return func() (driver.Backend, error) {
			be, err := mongolock.New(context.Background(), mc, &mongolock.Options{Database: database, Collection: coll})
			if err == nil && aged > 0 {
				err = age(mc, be, coll, aged)
			}
			return be, err
		}
	})
}

// age adds n token claims of other keys where the backend keeps them: it
// acquires and releases one key, finds that key's claim (in one of the
// collection's token collections on FerretDB, else in the collection
// itself) and inserts n copies of it for other keys, each where the
// backend keeps that key's claims.
func age(mc *mongo.Client, be driver.Backend, coll string, n int) error {
	ctx := context.Background()
	g, err := be.Acquire(ctx, driver.AcquireRequest{Key: "aged", Owner: "aged", TTL: ttl})
	if err != nil {
		return err
	}
	if err := be.Release(ctx, g); err != nil {
		return err
	}
	var claim bson.M
	split := false
	for _, name := range append(mongolock.TokenCollections(coll), coll) {
		err = mc.Database(database).Collection(name).FindOne(ctx, bson.D{{Key: "kind", Value: "token"}}).Decode(&claim)
		if err == nil {
			split = name != coll
			break
		}
	}
	if err != nil {
		return err
	}
	docs := map[string][]any{}
	for i := range n {
		d := bson.M{}
		for k, v := range claim {
			d[k] = v
		}
		key := "aged-" + strconv.Itoa(i)
		id := "t/7/default/00000000000000000001/" + key
		d["_id"], d["key"], d["tkey"] = id, id, key
		where := coll
		if split {
			where = mongolock.TokenCollection(coll, "default", key)
		}
		docs[where] = append(docs[where], d)
	}
	for where, ds := range docs {
		if err := insertBatches(ctx, mc.Database(database).Collection(where), ds); err != nil {
			return err
		}
	}
	return nil
}

// insertBatches inserts docs into c, 500 per insert.
func insertBatches(ctx context.Context, c *mongo.Collection, docs []any) error {
	for len(docs) > 0 {
		n := min(len(docs), 500)
		if _, err := c.InsertMany(ctx, docs[:n]); err != nil {
			return err
		}
		docs = docs[n:]
	}
	return nil
}

// fencelockURL returns the URL a user would write for a fresh collection:
// the server's URL plus database= and collection=, nothing else.
func fencelockURL(b *testing.B, s server) string {
	u, err := url.Parse(benchkit.ServerURL(b, s.env))
	if err != nil {
		b.Fatal(err)
	}
	q := u.Query()
	q.Set("database", database)
	q.Set("collection", collection(b, connect(b, s, nil), "locks"))
	u.RawQuery = q.Encode()
	return u.String()
}

// fencelockLib is the fencelock client as a URL user gets it,
// fencelock.Open(ctx, URL, nil): shared, or one per goroutine.
func fencelockLib(s server, shared bool) benchkit.Lib {
	return benchkit.FencelockLib("fencelock", shared, func(b *testing.B) func() (*fencelock.Client, error) {
		u := fencelockURL(b, s)
		return func() (*fencelock.Client, error) { return fencelock.Open(context.Background(), u, nil) }
	})
}

func libs(s server) []benchkit.Lib {
	return []benchkit.Lib{raw(s, nil), backendLib(s, nil), fencelockLib(s, true)}
}

// BenchmarkInterleaved: raw, the backend alone and the fencelock client in
// turns of 64 acquire+release (b.N rounds), by 1 goroutine and by 16
// goroutines, each goroutine on its own key; it reports each one's rate and
// its ratio to raw ("fencelock/raw").
func BenchmarkInterleaved(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) {
		for _, g := range []int{1, 16} {
			b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) { benchkit.Interleaved(b, g, 64, libs(s), benchkit.Rate("ops/s")) })
		}
	})
}

// BenchmarkInterleavedAged is BenchmarkInterleaved for raw and the
// backend alone, the backend's collection already holding 3,600 token
// claims of other keys: one acquisition per second over GarbageAfter.
func BenchmarkInterleavedAged(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) {
		for _, g := range []int{1, 16} {
			b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
				benchkit.Interleaved(b, g, 64, []benchkit.Lib{raw(s, nil), agedBackendLib(s, nil, 3600)}, benchkit.Rate("ops/s"))
			})
		}
	})
}

// BenchmarkInterleavedFresh is BenchmarkInterleaved with a new key for
// every acquisition.
func BenchmarkInterleavedFresh(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) {
		for _, g := range []int{1, 16} {
			b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
				benchkit.Interleaved(b, g, 64, libs(s), benchkit.Rate("ops/s"), benchkit.FreshKeys())
			})
		}
	})
}

// BenchmarkCommands: b.N acquire+release of one key by one goroutine, raw
// and the backend alone; reports the commands sent per acquire+release
// (inserts, deletes, finds, ...; not hello) and the documents left in the
// collection.
func BenchmarkCommands(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) {
		for _, fresh := range []bool{false, true} {
			name := "key=same"
			if fresh {
				name = "key=fresh"
			}
			b.Run(name, func(b *testing.B) {
				var c counter
				for _, lib := range []benchkit.Lib{raw(s, &c), backendLib(s, &c)} {
					b.Run(lib.Name, func(b *testing.B) {
						try, _ := lib.Setup(b)(0)
						key := benchkit.UniqueKey()
						ctx := context.Background()
						c.n.Store(0)
						b.ResetTimer()
						for i := range b.N {
							k := key
							if fresh {
								k += "-" + strconv.Itoa(i)
							}
							release, err := try(ctx, k)
							if err != nil {
								b.Fatal(err)
							}
							if err := release(); err != nil {
								b.Fatal(err)
							}
						}
						b.StopTimer()
						b.ReportMetric(float64(c.n.Load())/float64(b.N), "cmds/op")
					})
				}
			})
		}
	})
}

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
		benchkit.Contended(b, 8, []benchkit.Lib{raw(s, nil), fencelockLib(s, false)},
			benchkit.Barging(), benchkit.Unit(time.Millisecond), benchkit.ServerCPU(benchkit.TestenvCPU(s.name)),
			benchkit.PerHandoff("cmds/handoff", func() (float64, error) { return float64(cmds.n.Load()), nil }))
	})
}

// BenchmarkDeleteScan: what one insert and one delete by _id cost on a
// collection that also holds n other documents (shaped like token
// claims), measured separately ("insert-µs", "delete-µs"). On FerretDB
// 1.24 a delete reads the whole collection, even by _id; this is why the
// backend keeps token claims out of the records' collection.
func BenchmarkDeleteScan(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) {
		for _, n := range []int{0, 1000, 10000} {
			b.Run("others="+strconv.Itoa(n), func(b *testing.B) {
				j := true
				mc := connect(b, s, nil)
				coll := mc.Database(database).Collection(collection(b, mc, "scan"),
					options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: &j}))
				ctx := context.Background()
				fillClaims(b, coll, n)
				var ins, del time.Duration
				b.ResetTimer()
				for range b.N {
					id := "r/" + benchkit.RandomHex()
					t0 := time.Now()
					if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "owner", Value: "x"}}); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					if _, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
						b.Fatal(err)
					}
					ins += t1.Sub(t0)
					del += time.Since(t1)
				}
				b.ReportMetric(float64(ins.Microseconds())/float64(b.N), "insert-µs")
				b.ReportMetric(float64(del.Microseconds())/float64(b.N), "delete-µs")
			})
		}
	})
}

// BenchmarkHighestClaimRead times the two ways the backend reads a key's
// highest token claim, in a collection holding n claims of that key (the
// claims an hour of acquisitions leaves, kept for GarbageAfter): one find
// by _id (a step of the walk) and the sorted find over the key's claims.
// FerretDB reads the whole collection for both (SQLite in SQL for the
// _id equality, PostgreSQL with a jsonb filter), and decodes every
// document for the sorted one.
//
//	cd bench/mongo && go test -run '^$' -bench HighestClaimRead -benchtime 20x .
func BenchmarkHighestClaimRead(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) {
		for _, n := range []int{1000, 10000} {
			b.Run("claims="+strconv.Itoa(n), func(b *testing.B) {
				mc := connect(b, s, nil)
				coll := mc.Database(database).Collection(collection(b, mc, "highest"))
				ctx := context.Background()
				fillClaims(b, coll, n)
				var byID, sorted time.Duration
				b.ResetTimer()
				for i := range b.N {
					t0 := time.Now()
					if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: claimID((i * 7919) % n)}}).Err(); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					err := coll.FindOne(ctx, bson.D{{Key: "tns", Value: "default"}, {Key: "tkey", Value: "key"}},
						options.FindOne().SetSort(bson.D{{Key: "tns", Value: -1}, {Key: "tkey", Value: -1}, {Key: "token", Value: -1}})).Err()
					if err != nil {
						b.Fatal(err)
					}
					byID += t1.Sub(t0)
					sorted += time.Since(t1)
				}
				b.ReportMetric(float64(byID.Microseconds())/float64(b.N), "by-id-µs")
				b.ReportMetric(float64(sorted.Microseconds())/float64(b.N), "sorted-µs")
			})
		}
	})
}

// claimID is the _id of the i-th claim fillClaims inserts.
func claimID(i int) string { return "t/7/default/" + strconv.FormatInt(int64(i), 10) + "/key" }

// fillClaims inserts n token claims of one key into coll, as the backend
// keeps them for GarbageAfter, 500 per insert.
func fillClaims(b *testing.B, coll *mongo.Collection, n int) {
	b.Helper()
	var docs []any
	for i := range n {
		docs = append(docs, bson.D{{Key: "_id", Value: claimID(i)}, {Key: "kind", Value: "token"}, {Key: "tns", Value: "default"},
			{Key: "tkey", Value: "key"}, {Key: "token", Value: int64(i)}, {Key: "at", Value: time.Now()}})
		if len(docs) == 500 || i == n-1 {
			if _, err := coll.InsertMany(context.Background(), docs); err != nil {
				b.Fatal(err)
			}
			docs = nil
		}
	}
}

// BenchmarkFindByIDBesideOtherKeys measures what a walk's probe (a find
// of one claim by _id) costs when 26 other keys have 500 token claims
// each (13,000, as a soak's earlier cells leave them), in the two
// FerretDB layouts: every key's claims in one collection
// (layout=one-collection, the layout before TokenShards), and each key's
// in the collection mongolock.TokenCollection names (layout=sharded).
// FerretDB scans a whole collection for every find, even by _id, so the
// probe pays for the claims that share its collection. On MongoDB the
// _id index serves both alike.
func BenchmarkFindByIDBesideOtherKeys(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) {
		for _, layout := range []string{"one-collection", "sharded"} {
			b.Run("layout="+layout, func(b *testing.B) {
				mc := connect(b, s, nil)
				coll := collection(b, mc, "beside")
				ctx := context.Background()
				where := func(key string) *mongo.Collection {
					if layout == "sharded" {
						return mc.Database(database).Collection(mongolock.TokenCollection(coll, "default", key))
					}
					return mc.Database(database).Collection(coll + mongolock.TokensSuffix)
				}
				b.Cleanup(func() { _ = mc.Database(database).Collection(coll + mongolock.TokensSuffix).Drop(context.Background()) })
				docs := map[*mongo.Collection][]any{}
				for k := range 27 {
					key := "other-" + strconv.Itoa(k)
					if k == 26 {
						key = "key"
					}
					c := where(key)
					for tok := range 500 {
						id := "t/7/default/" + strconv.Itoa(tok) + "/" + key
						docs[c] = append(docs[c], bson.D{{Key: "_id", Value: id}, {Key: "kind", Value: "token"}, {Key: "tns", Value: "default"},
							{Key: "tkey", Value: key}, {Key: "token", Value: int64(tok)}, {Key: "at", Value: time.Now()}})
					}
				}
				for c, ds := range docs {
					if err := insertBatches(ctx, c, ds); err != nil {
						b.Fatal(err)
					}
				}
				c := where("key")
				b.ResetTimer()
				for i := range b.N {
					if err := c.FindOne(ctx, bson.D{{Key: "_id", Value: "t/7/default/" + strconv.Itoa((i*7919)%500) + "/key"}}).Err(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	})
}

// twoInserts is the ceiling of a lock whose every state change is an
// insert (the "claim as state" record model of issue 18): an acquisition
// inserts the claim of the key's next token, which is the record, and a
// release inserts that claim's end; nothing is updated or deleted. Both
// go into one collection that keeps every document (as such a design
// would until its garbage collection, which is not run here), with raw's
// write concern. No reads, no expiry, no garbage collection: the most such
// a design could reach, not a lock.
func twoInserts(s server) benchkit.Lib {
	return benchkit.Lib{Name: "two-inserts", Setup: func(b *testing.B) benchkit.Lockers {
		j := true
		mc := connect(b, s, nil)
		coll := mc.Database(database).Collection(collection(b, mc, "claims"),
			options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: &j}))
		var seq atomic.Int64
		try := func(ctx context.Context, key string) (func() error, error) {
			n := strconv.FormatInt(seq.Add(1), 10)
			_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "t/" + key + "/" + n}, {Key: "owner", Value: "raw"}, {Key: "until", Value: time.Now().Add(ttl)}})
			if mongo.IsDuplicateKeyError(err) {
				return nil, benchkit.ErrHeld
			}
			if err != nil {
				return nil, err
			}
			return func() error {
				_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "x/" + key + "/" + n}, {Key: "at", Value: time.Now()}})
				return err
			}, nil
		}
		return benchkit.Same(try, benchkit.Poll(try, time.Millisecond, 50*time.Millisecond))
	}}
}

// BenchmarkTwoInserts compares raw (insert + delete) with twoInserts, the
// ceiling of an insert-only lock, and the backend alone, in one
// interleaved run per server: whether issue 18's goal (acquire + release
// at 0.85x raw) is within reach of a design in which every state change is
// an insert.
func BenchmarkTwoInserts(b *testing.B) {
	eachServer(b, func(b *testing.B, s server) {
		for _, g := range []int{1, 16} {
			b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
				benchkit.Interleaved(b, g, 64, []benchkit.Lib{raw(s, nil), twoInserts(s), backendLib(s, nil)}, benchkit.Rate("ops/s"))
			})
		}
	})
}
