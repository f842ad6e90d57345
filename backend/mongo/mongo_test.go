package mongo_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// TestBadURLAndOptions needs no server: bad input is refused before
// connecting, and passwords stay out of errors.
func TestBadURLAndOptions(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"mongodb://u:hunter2@127.0.0.1:1/?databse=x",           // typo of ours
		"mongodb://u:hunter2@127.0.0.1:1/?replicaSett=rs0",     // typo of the driver's
		"mongodb://u:hunter2@127.0.0.1:1/?collection=system.x", // reserved
		"mongodb://u:hunter2@127.0.0.1:1/?collection=a$b",      // bad character
		"mongodb://u:hunter2@127.0.0.1:1/bad.db",               // bad database from the path
		"mongodb://u:hunter2@127.0.0.1:1/?database=a/b",        // bad database
		"mongodb://u:hunter2@127.0.0.1:1/?token_collection=x",  // no longer a parameter
		"mongodb://u:hunter2@127.0.0.1:1/?namespace=a%00b",     // control character
		"mongodb://u:hunter2@127.0.0.1:1/?clock_resync=1ms",    // out of range
		"mongodb://u:hunter2@127.0.0.1:1/?maxPoolSize=lots",    // driver rejects
		"mongodb://u:hunter2@127.0.0.1:1/?w=0",                 // unacknowledged
	} {
		_, err := mongolock.Open(ctx, u)
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Open(%q) = %v; want ErrInvalidOption", u, err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Open(%q) error shows the password: %v", u, err)
		}
	}
	for _, o := range []mongolock.Options{
		{Database: "has space"}, {Collection: "1abc"}, {Collection: "a..b"}, {Namespace: strings.Repeat("n", 200)},
		{ClockResync: time.Millisecond}, {GarbageAfter: time.Second},
	} {
		if err := o.Validate(); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Validate(%+v) = %v; want ErrInvalidOption", o, err)
		}
	}
	if err := (*mongolock.Options)(nil).Validate(); err != nil {
		t.Errorf("nil Options: %v", err)
	}
	// Registered schemes.
	for _, s := range []string{"mongodb", "mongodb+srv"} {
		found := false
		for _, r := range fencelock.Schemes() {
			found = found || r == s
		}
		if !found {
			t.Errorf("scheme %q not registered", s)
		}
	}
}

func openTest(t *testing.T, raw string, extra ...string) (*mongolock.Backend, string) {
	t.Helper()
	u := withParams(t, raw, append([]string{"database", testDatabase, "collection", freshCollection(t, raw)}, extra...)...)
	b, err := mongolock.Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, u
}

// TestHeldErrorNamesHolder: a duplicate-key refusal is "held", with the
// holder's owner, token and remaining time.
func TestHeldErrorNamesHolder(t *testing.T) { eachServer(t, testHeldErrorNamesHolder) }

func testHeldErrorNamesHolder(t *testing.T, _ server, raw string) {
	b, _ := openTest(t, raw)
	ctx := context.Background()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "alice", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "bob", TTL: time.Minute})
	var he *driver.HeldError
	if !errors.As(err, &he) || !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("second Acquire = %v; want *HeldError", err)
	}
	if he.Holder.Owner != "alice" || he.Holder.Token != g.Token || he.Holder.Remaining <= 0 || he.Holder.Remaining > time.Minute {
		t.Errorf("HeldError holder = %+v; want alice, token %d, remaining in (0, 1m]", he.Holder, g.Token)
	}
	// The same owner retrying (after an ambiguous reply) gets the
	// existing grant back, as the driver contract says.
	g2, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "alice", TTL: time.Minute})
	if err != nil || g2.Token != g.Token {
		t.Fatalf("retry by the same owner = %+v, %v; want the existing grant with token %d", g2, err, g.Token)
	}
	if err := b.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("second Release = %v; want ErrNotHeld", err)
	}
}

// TestNamespacesShareACollection: two namespaces in one collection do not
// see or block each other.
func TestNamespacesShareACollection(t *testing.T) { eachServer(t, testNamespacesShareACollection) }

func testNamespacesShareACollection(t *testing.T, _ server, raw string) {
	a, u := openTest(t, raw, "namespace", "app-a")
	bu := strings.Replace(u, "namespace=app-a", "namespace=app-b", 1)
	b, err := mongolock.Open(context.Background(), bu)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	for _, be := range []*mongolock.Backend{a, b} {
		if _, err := be.Acquire(ctx, driver.AcquireRequest{Key: "shared/key", Owner: be.Options().Namespace, TTL: time.Minute}); err != nil {
			t.Fatalf("%s: %v", be.Options().Namespace, err)
		}
	}
	for _, be := range []*mongolock.Backend{a, b} {
		infos, err := be.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Owner != be.Options().Namespace {
			t.Errorf("%s: List = %+v; want only its own key", be.Options().Namespace, infos)
		}
	}
}

// TestCallerOwnedClient: New never disconnects the caller's client, and
// Open/Close leave no goroutine behind.
func TestCallerOwnedClient(t *testing.T) { eachServer(t, testCallerOwnedClient) }

func testCallerOwnedClient(t *testing.T, _ server, raw string) {
	locks := freshCollection(t, raw)
	ctx := context.Background()
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	mc, err := mongo.Connect(options.Client().ApplyURI(raw))
	if err != nil {
		t.Fatal(err)
	}
	b, err := mongolock.New(ctx, mc, &mongolock.Options{Database: testDatabase, Collection: locks})
	if err != nil {
		t.Fatal(err)
	}
	c, err := fencelock.New(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryAcquire(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := mc.Ping(ctx, nil); err != nil {
		t.Fatalf("caller's client unusable after Close: %v", err)
	}
	if err := mc.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	// And an owned client is disconnected by Close.
	ob, _ := openTest(t, raw)
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ob.Client().Ping(ctx, nil); err == nil {
		t.Error("owned client still connected after Close")
	}
}

// TestContendedWaitingDoesNotSpin counts the commands that waiters send
// while a key is held: the engine's capped backoff, bounded by the
// holder's remaining TTL, keeps it to a few per waiter per second.
func TestContendedWaitingDoesNotSpin(t *testing.T) { eachServer(t, testContendedWaitingDoesNotSpin) }

func testContendedWaitingDoesNotSpin(t *testing.T, _ server, raw string) {
	locks := freshCollection(t, raw)
	ctx := context.Background()
	var cmds atomic.Int64
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		switch e.CommandName {
		case "insert", "find", "update", "findAndModify", "delete":
			cmds.Add(1)
		}
	}}
	mc, err := mongo.Connect(options.Client().ApplyURI(raw).SetMonitor(mon))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Disconnect(ctx)
	open := func() *fencelock.Client {
		b, err := mongolock.New(ctx, mc, &mongolock.Options{Database: testDatabase, Collection: locks})
		if err != nil {
			t.Fatal(err)
		}
		c, err := fencelock.New(b, &fencelock.Options{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	holder := open()
	l, err := holder.Acquire(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	const waiters, hold = 4, 3 * time.Second
	start := cmds.Load()
	wctx, cancel := context.WithTimeout(ctx, hold)
	defer cancel()
	var wg sync.WaitGroup
	for range waiters {
		w := open()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := w.Acquire(wctx, "hot"); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("waiter: %v; want DeadlineExceeded", err)
			}
		}()
	}
	wg.Wait()
	n := cmds.Load() - start
	perSec := float64(n) / float64(waiters) / hold.Seconds()
	t.Logf("%d waiters sent %d commands in %v while the key was held: %.1f per waiter per second", waiters, n, hold, perSec)
	// Backoff 5ms doubling to 1s: about a dozen attempts in 3s, two
	// commands each (the record and its epoch claims: a live holder is
	// refused before the token claims are read).
	if perSec > 20 {
		t.Errorf("waiters sent %.1f commands per second each; the wait is spinning", perSec)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClockEstimate: the backend's estimate of the server clock has a
// bound of half a loopback round trip.
func TestClockEstimate(t *testing.T) {
	eachServer(t, func(t *testing.T, _ server, raw string) { testClockEstimate(t, raw) })
}

func testClockEstimate(t *testing.T, raw string) {
	b, _ := openTest(t, raw)
	if bd := b.ClockBound(); bd <= 0 || bd > time.Second {
		t.Errorf("ClockBound = %v; want a small positive bound", bd)
	}
	d := b.Describe()
	if d.Name != "mongo" || !strings.Contains(d.Clock, "hello") {
		t.Errorf("Describe = %+v", d)
	}
}

// TestOldFormatRefused: where token claims live in collections of their
// own (FerretDB), a records' collection, or a single Collection+"_tokens"
// collection, that still holds token claims, as earlier versions wrote
// them, is refused with ErrOldFormat: ignoring them would issue its keys'
// tokens from 1 again. Where they share the records' collection, it opens
// and issues the next token above them.
func TestOldFormatRefused(t *testing.T) { eachServer(t, testOldFormatRefused) }

func testOldFormatRefused(t *testing.T, _ server, raw string) {
	ctx := t.Context()
	mc, err := mongo.Connect(options.Client().ApplyURI(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Disconnect(ctx)
	separate := isFerretDB(t, raw) && !mongolock.OneCollection()
	for _, suffix := range []string{"", mongolock.TokensSuffix} {
		if suffix != "" && !separate {
			continue
		}
		locks := freshCollection(t, raw)
		t.Cleanup(func() { _ = mc.Database(testDatabase).Collection(locks + suffix).Drop(context.Background()) })
		for _, tok := range []string{"1", "5"} {
			id := "t/7/default/0000000000000000000" + tok + "/k"
			if _, err := mc.Database(testDatabase).Collection(locks+suffix).InsertOne(ctx, map[string]any{
				"_id": id, "ns": 0, "key": id, "kind": "token", "tns": "default", "tkey": "k", "token": int64(tok[0] - '0'), "at": time.Now(),
			}); err != nil {
				t.Fatal(err)
			}
		}
		b, err := mongolock.New(ctx, mc, &mongolock.Options{Database: testDatabase, Collection: locks})
		switch {
		case separate && !errors.Is(err, mongolock.ErrOldFormat):
			t.Fatalf("New on a collection whose %q holds token claims = %v; want ErrOldFormat", locks+suffix, err)
		case !separate && err != nil:
			t.Fatalf("New (token claims share the records' collection): %v", err)
		case !separate:
			defer b.Close()
			g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if g.Token <= 5 {
				t.Fatalf("token %d not above the existing claim's 5", g.Token)
			}
		}
	}
}

// TestTokenClaimsSpreadOverShards: on FerretDB a key's token claims (and
// its hint) live in the one collection TokenCollection names for it, and
// keys spread over the TokenShards collections, so that a find by _id
// for one key (each of which FerretDB serves with a scan of the whole
// collection) reads few other keys' claims.
func TestTokenClaimsSpreadOverShards(t *testing.T) { eachServer(t, testTokenClaimsSpreadOverShards) }

func testTokenClaimsSpreadOverShards(t *testing.T, _ server, raw string) {
	if !isFerretDB(t, raw) || mongolock.OneCollection() {
		t.Log("token claims share the records' collection here: nothing to spread")
		return
	}
	ctx := t.Context()
	locks := freshCollection(t, raw)
	mc, err := mongo.Connect(options.Client().ApplyURI(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Disconnect(ctx)
	b, err := mongolock.New(ctx, mc, &mongolock.Options{Database: testDatabase, Collection: locks})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const keys = 64
	for i := range keys {
		key := fmt.Sprintf("spread-%d", i)
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "o", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	used := map[string]int{}
	for _, name := range mongolock.TokenCollections(locks) {
		cur, err := mc.Database(testDatabase).Collection(name).Find(ctx, bson.D{{Key: "kind", Value: "token"}})
		if err != nil {
			t.Fatal(err)
		}
		var claims []struct {
			TKey string `bson:"tkey"`
		}
		if err := cur.All(ctx, &claims); err != nil {
			t.Fatal(err)
		}
		for _, c := range claims {
			if want := mongolock.TokenCollection(locks, "default", c.TKey); want != name {
				t.Errorf("claim of %q in %s, want %s", c.TKey, name, want)
			}
			used[name]++
		}
	}
	total := 0
	for _, n := range used {
		total += n
	}
	if total != keys {
		t.Fatalf("%d token claims in the token collections, want %d", total, keys)
	}
	// 64 keys over 32 collections: a fair hash leaves very few empty
	// (expected 32·(31/32)^64 ≈ 4) and none with more than a handful.
	most := 0
	for _, n := range used {
		most = max(most, n)
	}
	if len(used) < mongolock.TokenShards/2 || most > 8 {
		t.Fatalf("64 keys' claims in %d of %d collections, up to %d in one: %v", len(used), mongolock.TokenShards, most, used)
	}
}
