package mongo_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"github.com/fencelock/fencelock/internal/testenv"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// server is one Mongo-wire server under test.
type server struct {
	name string // subtest name
	env  string // variable holding its URL
	// testenv is the scripts/testenv name of the server, for restarts.
	testenv string
}

// servers are the Mongo-wire servers every test runs on:
// FENCELOCK_TEST_MONGO (FerretDB with its SQLite handler in this
// repository's test environment, or a real MongoDB you point it at) and
// FENCELOCK_TEST_MONGO_PG (FerretDB with its PostgreSQL handler).
var servers = []server{
	{name: "mongo", env: "FENCELOCK_TEST_MONGO", testenv: "mongo"},
	{name: "mongo_pg", env: "FENCELOCK_TEST_MONGO_PG", testenv: "mongo-pg"},
}

// eachServer runs f as a subtest per server; a server whose variable is
// unset is skipped (a failure under CI). The servers' subtests run at
// once: they are separate processes with separate data, and most of a
// test's time is spent waiting on TTLs, so the module takes about as long
// as its slower server rather than the sum of both.
func eachServer(t *testing.T, f func(t *testing.T, s server, raw string)) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			f(t, s, testenv.URL(t, s.env))
		})
	}
}

func randHex() string {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// testDatabase is the database every test uses; collections are unique per
// run, so runs can share a server.
const testDatabase = "fencelock_test"

// withParams adds fencelock's parameters to the test URL.
func withParams(t testing.TB, raw string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// freshCollection returns a unique collection name and drops the
// collection (and its tokens collection) when the test ends.
func freshCollection(t testing.TB, raw string) string {
	t.Helper()
	locks := "locks_" + randHex()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := mongo.Connect(options.Client().ApplyURI(raw))
		if err != nil {
			return
		}
		defer c.Disconnect(ctx)
		_ = c.Database(testDatabase).Collection(locks).Drop(ctx)
		for _, name := range mongolock.TokenCollections(locks) {
			_ = c.Database(testDatabase).Collection(name).Drop(ctx)
		}
	})
	return locks
}

// isFerretDB reports whether the server at raw is FerretDB (its buildInfo
// has a ferretdbVersion field).
func isFerretDB(t testing.TB, raw string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := mongo.Connect(options.Client().ApplyURI(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(ctx)
	var bi bson.M
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&bi); err != nil {
		t.Fatalf("buildInfo: %v", err)
	}
	_, ok := bi["ferretdbVersion"]
	return ok
}

func TestConformance(t *testing.T) { eachServer(t, testConformance) }

func testConformance(t *testing.T, s server, raw string) {
	u := withParams(t, raw, "database", testDatabase, "collection", freshCollection(t, raw),
		"namespace", "conformance-"+randHex())
	h := conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) { return mongolock.Open(ctx, u) },
		TTL:  2 * time.Second,
	}
	if isFerretDB(t, raw) {
		// FerretDB evaluates every filter other than a lone _id by
		// scanning the whole collection in Go, so the cost of each
		// conditional update grows with the number of held keys; 1000
		// leases renewed every TTL/3 exceed what it serves on 2 cores.
		h.Leases = 100
		h.TTL = 10 * time.Second
		t.Logf("server is FerretDB: ManyLeasesOneClient holds %d leases instead of 1000; TTL %v", h.Leases, h.TTL)
	}
	if n, err := strconv.Atoi(os.Getenv("FENCELOCK_TEST_MONGO_LEASES")); err == nil && n > 0 {
		h.Leases = n
	}
	h.Restart = testenv.Restart(s.testenv)
	conformance.Run(t, h)
}
