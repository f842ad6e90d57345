package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
)

func Example() {
	ctx := context.Background()
	c, err := fencelock.Open(ctx, "mem://example", &fencelock.Options{TTL: 15 * time.Second})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	lease, err := c.Acquire(ctx, "jobs/nightly")
	if err != nil {
		panic(err)
	}
	fmt.Println("held with token", lease.Token())
	// ... do the work with lease.Context(); pass lease.Token() to the resource ...
	if err := lease.Release(ctx); err != nil {
		panic(err)
	}
	// Output: held with token 1
}

func ExampleClient_TryAcquire() {
	ctx := context.Background()
	store := memory.NewStore()
	a, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "worker-a"})
	b, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "worker-b"})
	defer a.Close()
	defer b.Close()

	if _, err := a.TryAcquire(ctx, "reports"); err != nil {
		panic(err)
	}
	_, err := b.TryAcquire(ctx, "reports")
	var held *fencelock.HeldError
	if errors.As(err, &held) {
		fmt.Println("not acquired; held with token", held.Holder.Token)
	}
	// Output: not acquired; held with token 1
}

func ExampleClient_Do() {
	ctx := context.Background()
	c, _ := fencelock.New(memory.New(), nil)
	defer c.Close()

	// Leader election: fn runs while this process leads; its ctx is
	// cancelled the moment leadership is lost.
	err := c.Do(ctx, "scheduler/leader", func(ctx context.Context, l *fencelock.Lease) error {
		fmt.Println("leading with token", l.Token())
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// leading with token 1
	// err: <nil>
}

func ExampleFence() {
	var fence fencelock.Fence // lives in the protected resource
	store := memory.NewStore()
	c, _ := fencelock.New(store.Backend(), nil)
	defer c.Close()
	ctx := context.Background()

	old, _ := c.Acquire(ctx, "acct")
	store.Expire("acct") // the old holder is paused past its TTL...
	next, _ := c.Acquire(ctx, "acct")

	fmt.Println("new holder:", fence.Admit("acct", next))
	fmt.Println("paused holder:", fence.Admit("acct", old))
	// Output:
	// new holder: <nil>
	// paused holder: fencelock: stale fencing token 1 for "acct" (highest seen 2)
}
