package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
)

// One Client serves leases of any TTL: here a short lease for a quick task
// next to the Client's default.
func ExampleWithTTL() {
	ctx := context.Background()
	c, _ := fencelock.New(memory.New(), &fencelock.Options{TTL: 15 * time.Second})
	defer c.Close()

	quick, err := c.Acquire(ctx, "tasks/quick", fencelock.WithTTL(3*time.Second))
	if err != nil {
		panic(err)
	}
	long, _ := c.Acquire(ctx, "tasks/long")
	fmt.Println(quick.TTL(), long.TTL())
	// Output: 3s 15s
}

// A leader publishes its address with the lease; anyone reads it with
// Inspect, and the holder replaces it with SetMetadata.
func ExampleWithMetadata() {
	ctx := context.Background()
	store := memory.NewStore()
	leader, _ := fencelock.New(store.Backend(), nil)
	observer, _ := fencelock.New(store.Backend(), nil)
	defer leader.Close()
	defer observer.Close()

	l, err := leader.Acquire(ctx, "leader/api", fencelock.WithMetadata([]byte("10.0.0.7:8080")))
	if err != nil {
		panic(err)
	}
	info, _ := observer.Inspect(ctx, "leader/api")
	fmt.Printf("leader at %s\n", info.Metadata)

	if err := l.SetMetadata(ctx, []byte("10.0.0.7:9090")); err != nil {
		panic(err)
	}
	info, _ = observer.Inspect(ctx, "leader/api")
	fmt.Printf("leader moved to %s\n", info.Metadata)
	// Output:
	// leader at 10.0.0.7:8080
	// leader moved to 10.0.0.7:9090
}

// SetMetadata after the lease has ended changes nothing and says why.
func ExampleLease_SetMetadata() {
	ctx := context.Background()
	c, _ := fencelock.New(memory.New(), nil)
	defer c.Close()

	l, _ := c.Acquire(ctx, "leader/api", fencelock.WithMetadata([]byte("v1")))
	_ = l.Release(ctx)
	err := l.SetMetadata(ctx, []byte("v2"))
	fmt.Println(errors.Is(err, fencelock.ErrNotHeld), string(l.Metadata()))
	// Output: true v1
}

// The owner label is the holder's identity as given; the store's owner
// string adds a suffix that keeps it unique per call, which nobody needs
// to parse.
func ExampleWithLabel() {
	ctx := context.Background()
	store := memory.NewStore()
	c, _ := fencelock.New(store.Backend(), nil)
	defer c.Close()

	if _, err := c.Acquire(ctx, "shards/7", fencelock.WithLabel("worker-3")); err != nil {
		panic(err)
	}
	other, _ := fencelock.New(store.Backend(), nil)
	defer other.Close()
	_, err := other.TryAcquire(ctx, "shards/7")
	var held *fencelock.HeldError
	if errors.As(err, &held) {
		fmt.Println("held by", held.Holder.Label())
	}
	info, _ := other.Inspect(ctx, "shards/7")
	fmt.Println("Inspect:", info.Label())
	// Output:
	// held by worker-3
	// Inspect: worker-3
}

// WithWait bounds how long Acquire waits for a held key; the caller's
// context still bounds the whole call.
func ExampleWithWait() {
	ctx := context.Background()
	store := memory.NewStore()
	a, _ := fencelock.New(store.Backend(), nil)
	b, _ := fencelock.New(store.Backend(), nil)
	defer a.Close()
	defer b.Close()

	if _, err := a.Acquire(ctx, "reports"); err != nil {
		panic(err)
	}
	_, err := b.Acquire(ctx, "reports", fencelock.WithWait(50*time.Millisecond))
	fmt.Println(errors.Is(err, fencelock.ErrNotAcquired))
	// Output: true
}

// A scheduled job that finishes fast still keeps the other instances out
// for its minimum hold (ShedLock's lockAtLeastFor).
func ExampleWithMinHold() {
	ctx := context.Background()
	store := memory.NewStore()
	host1, _ := fencelock.New(store.Backend(), nil)
	host2, _ := fencelock.New(store.Backend(), nil)
	defer host1.Close()
	defer host2.Close()

	err := host1.Do(ctx, "cron/report", func(ctx context.Context, l *fencelock.Lease) error {
		return nil // the job is done at once
	}, fencelock.WithMinHold(time.Minute))
	fmt.Println("host1 ran:", err == nil)

	_, err = host2.TryAcquire(ctx, "cron/report")
	fmt.Println("host2 skips:", errors.Is(err, fencelock.ErrNotAcquired))
	// Output:
	// host1 ran: true
	// host2 skips: true
}
