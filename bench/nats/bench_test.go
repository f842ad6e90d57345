// Package natsbench compares fencelock's NATS backend with the raw
// JetStream key-value operations a lock needs at least (the limit), in
// one run:
//
//	eval "$(scripts/testenv up nats)"
//	cd bench/nats && go test -run '^$' -bench . -benchtime 3s
//
// FENCELOCK_BENCH_NATS, if set, names the server instead of
// FENCELOCK_TEST_NATS.
//
// fencelock is opened as a user of URLs gets it: fencelock.Open(ctx, URL,
// nil) with the server's URL as it is (the default bucket); the raw
// operations use a jetstream.KeyValue of a bucket of the same shape
// (one value per key, per-message TTLs) on a connection of their own.
package natsbench

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/nats"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
)

const ttl = 10 * time.Second

func serverURL(b *testing.B) string {
	return benchkit.ServerURL(b, "FENCELOCK_BENCH_NATS", "FENCELOCK_TEST_NATS")
}

// raw is what every NATS lock costs at least: a Create with a per-key TTL
// (a write that succeeds only if the key has no value) and a Delete
// guarded by the revision Create returned, on a bucket of its own.
// Waiting spins without backoff (the ceiling).
var raw = benchkit.Lib{Name: "raw", Setup: func(b *testing.B) benchkit.Lockers {
	nc, err := natsgo.Connect(serverURL(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	bucket := "raw-" + benchkit.RandomHex()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, LimitMarkerTTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), bucket) })
	try := func(ctx context.Context, key string) (func() error, error) {
		rev, err := kv.Create(ctx, key, []byte("x"), jetstream.KeyTTL(ttl))
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, benchkit.ErrHeld
		}
		if err != nil {
			return nil, err
		}
		return func() error { return kv.Delete(context.Background(), key, jetstream.LastRevision(rev)) }, nil
	}
	return benchkit.Same(try, benchkit.Poll(try, 0, 0))
}}

// fencelockLib is the fencelock client as a URL user gets it,
// fencelock.Open(ctx, URL, nil): shared, or one per goroutine.
func fencelockLib(name string, shared bool) benchkit.Lib {
	return benchkit.FencelockLib(name, shared, func(b *testing.B) func() (*fencelock.Client, error) {
		u := serverURL(b)
		return func() (*fencelock.Client, error) { return fencelock.Open(context.Background(), u, nil) }
	})
}

// backendOnly calls the backend's Acquire and Release directly
// (fencelock.OpenBackend of the same URL), one backend per goroutine.
var backendOnly = benchkit.BackendLib("fencelock-backend-only", false, ttl, func(b *testing.B) func() (driver.Backend, error) {
	u := serverURL(b)
	return func() (driver.Backend, error) {
		be, _, err := fencelock.OpenBackend(context.Background(), u)
		return be, err
	}
})

var libs = []benchkit.Lib{raw, fencelockLib("fencelock", true), backendOnly}

// BenchmarkInterleaved runs the libraries in turns of 50 acquire+release
// per goroutine, round after round (b.N rounds), adding up the time each
// took, so that on a shared, busy machine every library meets the same
// noise; it reports each one's rate and its ratio to raw
// ("<library>/raw"). Shapes: one goroutine, and 16 goroutines on
// distinct keys.
func BenchmarkInterleaved(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) { benchkit.Interleaved(b, g, 50*g, libs) })
	}
}

// BenchmarkContended8: 8 goroutines take turns on one key; b.N is the
// number of handoffs (see benchkit.Contended). raw spins without backoff.
func BenchmarkContended8(b *testing.B) {
	benchkit.Contended(b, 8, []benchkit.Lib{raw, fencelockLib("fencelock-1client", true), fencelockLib("fencelock-8clients", false)},
		benchkit.Holds(0, time.Millisecond), benchkit.ServerCPU(benchkit.TestenvCPU("nats")))
}
