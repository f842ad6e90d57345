package mongo_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// Example opens a client on MongoDB through the registry and runs a job
// under a lock. Every application sharing the collection uses its own
// namespace (the seed's BizType).
func Example() {
	url := os.Getenv("FENCELOCK_TEST_MONGO") // e.g. mongodb://127.0.0.1:27017/app?replicaSet=rs0
	if url == "" {
		return
	}
	ctx := context.Background()
	c, err := fencelock.Open(ctx, url+"?namespace=billing&ttl=15s", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	err = c.Do(ctx, "nightly-invoices", func(ctx context.Context, l *fencelock.Lease) error {
		// ctx is cancelled the moment the lease is lost; pass
		// l.Token() to every write so the storage can fence it.
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
}

// ExampleNew uses a caller-owned *mongo.Client; the backend never
// disconnects it.
func ExampleNew() {
	url := os.Getenv("FENCELOCK_TEST_MONGO")
	if url == "" {
		return
	}
	ctx := context.Background()
	mc, err := mongo.Connect(options.Client().ApplyURI(url))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mc.Disconnect(ctx)
	b, err := mongolock.New(ctx, mc, &mongolock.Options{Database: "app", Namespace: "scheduler"})
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := fencelock.New(b, &fencelock.Options{TTL: 15 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close() // closes b, not mc
	l, err := c.TryAcquire(ctx, "leader")
	if errors.Is(err, fencelock.ErrNotAcquired) {
		return // someone else leads
	} else if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Release(ctx)
}

// elect is the seed's Elect interface written with the core API only:
// Lock is TryAcquire plus a goroutine running the callback with the
// lease's context (cancelled the moment the lease is lost), Unlock cancels
// it and releases, HoldingKeys is Client.Holding, LockedKeys is
// Client.List, Close is Client.Close. (Client.Do is the blocking form of
// Lock: it waits for the key, runs the callback and releases.)
type elect struct {
	c       *fencelock.Client
	prefix  string // the keys this elector manages
	mu      sync.Mutex
	running map[string]*task
}

type task struct {
	lease  *fencelock.Lease
	cancel context.CancelFunc
	done   chan struct{}
}

func newElect(c *fencelock.Client, prefix string) *elect {
	return &elect{c: c, prefix: prefix, running: make(map[string]*task)}
}

// Lock takes key if it is free and runs cb with a context that ends when
// the lock is lost or Unlock is called. ok reports whether it took the key.
func (e *elect) Lock(key string, cb func(ctx context.Context)) (ok bool, err error) {
	l, err := e.c.TryAcquire(context.Background(), e.prefix+key)
	if errors.Is(err, fencelock.ErrNotAcquired) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancel(l.Context())
	t := &task{lease: l, cancel: cancel, done: make(chan struct{})}
	e.mu.Lock()
	e.running[key] = t
	e.mu.Unlock()
	go func() {
		defer close(t.done)
		cb(ctx)
	}()
	return true, nil
}

// Unlock cancels key's task, waits for it, and releases the lock.
func (e *elect) Unlock(key string) error {
	e.mu.Lock()
	t, ok := e.running[key]
	delete(e.running, key)
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("lock of %s not owned", key)
	}
	t.cancel()
	<-t.done
	return t.lease.Release(context.Background())
}

// HoldingKeys returns the keys this instance holds.
func (e *elect) HoldingKeys() []string {
	var keys []string
	for _, k := range e.c.Holding() {
		keys = append(keys, strings.TrimPrefix(k, e.prefix))
	}
	return keys
}

// LockedKeys returns the keys every instance holds, from the store.
func (e *elect) LockedKeys() ([]string, error) {
	infos, err := e.c.List(context.Background(), e.prefix)
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, in := range infos {
		keys = append(keys, strings.TrimPrefix(in.Key, e.prefix))
	}
	return keys, nil
}

// Close stops every task and releases every lock.
func (e *elect) Close() {
	e.mu.Lock()
	keys := make([]string, 0, len(e.running))
	for k := range e.running {
		keys = append(keys, k)
	}
	e.mu.Unlock()
	for _, k := range keys {
		_ = e.Unlock(k)
	}
	_ = e.c.Close()
}

// Example_elect spreads 100 topic subscriptions over 10 instances, each
// holding at most 20, as in the seed: every instance, in turn, tries to
// take one more topic until it holds its fair share; when an instance
// leaves, the others take over its topics, still within the cap. It runs
// on the memory backend so that it runs everywhere; with
// fencelock.Open("mongodb://…?namespace=subscriptions") it is the same
// code on MongoDB.
func Example_elect() {
	const topics, instances, maxPer = 100, 10, 20
	store := memory.NewStore() // one store shared by all instances
	electors := make([]*elect, instances)
	for i := range electors {
		c, err := fencelock.New(store.Backend(), &fencelock.Options{TTL: 10 * time.Second, Owner: fmt.Sprintf("instance-%d", i)})
		if err != nil {
			panic(err)
		}
		electors[i] = newElect(c, "subscriptions/")
	}
	subscribe := func(ctx context.Context) { <-ctx.Done() } // consume the topic until told to stop
	topic := func(n int) string { return fmt.Sprintf("topic-%03d", n) }

	// balance lets each live instance take one more free topic per round
	// until it holds share topics (never more than maxPer).
	balance := func(live []*elect, share int) {
		for progress := true; progress; {
			progress = false
			for i, e := range live {
				if len(e.HoldingKeys()) >= min(share, maxPer) {
					continue
				}
				for n := range topics {
					// Start at a different topic per instance.
					if ok, err := e.Lock(topic((n+i*topics/len(live))%topics), subscribe); err != nil {
						panic(err)
					} else if ok {
						progress = true
						break
					}
				}
			}
		}
	}
	report := func(live []*elect) {
		locked, err := live[0].LockedKeys()
		if err != nil {
			panic(err)
		}
		var counts []int
		for _, e := range live {
			counts = append(counts, len(e.HoldingKeys()))
		}
		sort.Ints(counts)
		fmt.Printf("%d instances hold %d of %d topics; per instance: min %d, max %d\n",
			len(live), len(locked), topics, counts[0], counts[len(counts)-1])
	}

	balance(electors, (topics+instances-1)/instances)
	report(electors)

	// Instance 0 shuts down: its topics are released and picked up.
	electors[0].Close()
	live := electors[1:]
	balance(live, (topics+len(live)-1)/len(live))
	report(live)

	for _, e := range live {
		e.Close()
	}
	// Output:
	// 10 instances hold 100 of 100 topics; per instance: min 10, max 10
	// 9 instances hold 100 of 100 topics; per instance: min 11, max 12
}
