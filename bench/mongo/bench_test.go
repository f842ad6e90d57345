// Package mongobench compares fencelock's MongoDB backend with the raw
// store operations a lock needs at minimum: insert a document whose _id is
// the key (the unique index makes it a lock) and delete it.
//
//	eval "$(scripts/testenv up mongo)"
//	cd bench/mongo && go test -bench . -benchtime 3s
package mongobench

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/fencelock/fencelock"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

const database = "fencelock_bench"

func serverURL(b *testing.B) string {
	u := os.Getenv("FENCELOCK_TEST_MONGO")
	if u == "" {
		b.Skip("FENCELOCK_TEST_MONGO is not set")
	}
	return u
}

func suffix() string {
	var r [4]byte
	_, _ = crand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// env is one benchmark's server connection and fresh collections.
type env struct {
	raw           string
	mc            *mongo.Client
	locks, tokens string
	rawColl       *mongo.Collection
	cmds          atomic.Int64 // data commands sent
}

func newEnv(b *testing.B) *env {
	raw := serverURL(b)
	e := &env{raw: raw}
	mon := &event.CommandMonitor{Started: func(_ context.Context, ev *event.CommandStartedEvent) {
		switch ev.CommandName {
		case "insert", "update", "delete", "find", "findAndModify":
			e.cmds.Add(1)
		}
	}}
	mc, err := mongo.Connect(options.Client().ApplyURI(raw).SetMonitor(mon))
	if err != nil {
		b.Fatal(err)
	}
	s := suffix()
	e.mc, e.locks, e.tokens = mc, "locks_"+s, "tokens_"+s
	j := true
	// The raw baseline writes with the same concern as the backend.
	e.rawColl = mc.Database(database).Collection("raw_"+s,
		options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: &j}))
	b.Cleanup(func() {
		ctx := context.Background()
		db := mc.Database(database)
		_ = db.Collection(e.locks).Drop(ctx)
		_ = db.Collection(e.tokens).Drop(ctx)
		_ = e.rawColl.Drop(ctx)
		_ = mc.Disconnect(ctx)
	})
	return e
}

func (e *env) client(b *testing.B) *fencelock.Client {
	be, err := mongolock.New(context.Background(), e.mc, &mongolock.Options{Database: database, Collection: e.locks, TokenCollection: e.tokens})
	if err != nil {
		b.Fatal(err)
	}
	c, err := fencelock.New(be, &fencelock.Options{TTL: 30 * time.Second, MinBackoff: time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// rawLock inserts {_id: key} until it succeeds, sleeping between refused
// attempts with the same capped backoff as the engine; rawUnlock deletes it.
func (e *env) rawLock(ctx context.Context, key string) error {
	backoff := time.Millisecond
	for {
		_, err := e.rawColl.InsertOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "owner", Value: "raw"}, {Key: "expiresAt", Value: time.Now().Add(30 * time.Second)}})
		if err == nil {
			return nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return err
		}
		time.Sleep(backoff/2 + time.Duration(time.Now().UnixNano()%int64(backoff/2+1)))
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

func (e *env) rawUnlock(ctx context.Context, key string) error {
	_, err := e.rawColl.DeleteOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "owner", Value: "raw"}})
	return err
}

// BenchmarkUncontended: one goroutine, one key, acquire then release.
func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	b.Run("raw", func(b *testing.B) {
		e := newEnv(b)
		for b.Loop() {
			if err := e.rawLock(ctx, "k"); err != nil {
				b.Fatal(err)
			}
			if err := e.rawUnlock(ctx, "k"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "locks/s")
	})
	b.Run("fencelock", func(b *testing.B) {
		e := newEnv(b)
		c := e.client(b)
		for b.Loop() {
			l, err := c.TryAcquire(ctx, "k")
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "locks/s")
	})
}

// BenchmarkParallel16: 16 goroutines, each on its own key.
func BenchmarkParallel16(b *testing.B) {
	ctx := context.Background()
	var n atomic.Int64
	b.Run("raw", func(b *testing.B) {
		e := newEnv(b)
		b.SetParallelism(max(1, 16/runtimeProcs()))
		b.RunParallel(func(pb *testing.PB) {
			key := fmt.Sprint("k", n.Add(1))
			for pb.Next() {
				if err := e.rawLock(ctx, key); err != nil {
					b.Error(err)
					return
				}
				if err := e.rawUnlock(ctx, key); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "locks/s")
	})
	b.Run("fencelock", func(b *testing.B) {
		e := newEnv(b)
		c := e.client(b)
		b.SetParallelism(max(1, 16/runtimeProcs()))
		b.RunParallel(func(pb *testing.PB) {
			key := fmt.Sprint("k", n.Add(1))
			for pb.Next() {
				l, err := c.TryAcquire(ctx, key)
				if err != nil {
					b.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "locks/s")
	})
}

// BenchmarkContended8: 8 goroutines take turns on one key; each op is one
// hand-off. Reports hand-offs per second, the p50/p99 wait for the key, and
// the commands the server received per hand-off (polling cost).
func BenchmarkContended8(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, e *env, lock func() (func() error, error)) {
		var (
			mu    sync.Mutex
			waits []time.Duration
			wg    sync.WaitGroup
			left  atomic.Int64
		)
		left.Store(int64(b.N))
		b.ResetTimer()
		cmds0 := e.cmds.Load()
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for left.Add(-1) >= 0 {
					start := time.Now()
					unlock, err := lock()
					if err != nil {
						b.Error(err)
						return
					}
					w := time.Since(start)
					mu.Lock()
					waits = append(waits, w)
					mu.Unlock()
					if err := unlock(); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
		if len(waits) > 0 {
			b.ReportMetric(float64(waits[len(waits)/2].Microseconds())/1000, "p50-wait-ms")
			b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds())/1000, "p99-wait-ms")
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handoffs/s")
		b.ReportMetric(float64(e.cmds.Load()-cmds0)/float64(b.N), "cmds/handoff")
	}
	b.Run("raw", func(b *testing.B) {
		e := newEnv(b)
		run(b, e, func() (func() error, error) {
			if err := e.rawLock(ctx, "hot"); err != nil {
				return nil, err
			}
			return func() error { return e.rawUnlock(ctx, "hot") }, nil
		})
	})
	b.Run("fencelock", func(b *testing.B) {
		e := newEnv(b)
		clients := make(chan *fencelock.Client, 8)
		for range 8 {
			clients <- e.client(b)
		}
		var fence fencelock.Fence
		run(b, e, func() (func() error, error) {
			c := <-clients
			defer func() { clients <- c }()
			l, err := c.Acquire(ctx, "hot")
			if err != nil {
				return nil, err
			}
			if err := fence.Admit("hot", l); err != nil {
				return nil, errors.Join(errors.New("fence refused a holder"), err)
			}
			return func() error { return l.Release(ctx) }, nil
		})
	})
}
