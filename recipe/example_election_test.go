package recipe_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

func ExampleElect() {
	c, _ := fencelock.New(memory.New(), nil)
	defer c.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// Campaign until ctx ends: fn runs while this process leads, with a
	// context cancelled the moment leadership is lost; after a loss Elect
	// campaigns again.
	err := recipe.Elect(ctx, c, "scheduler/leader", "node-1", []byte("10.0.0.1:8080"),
		func(ctx context.Context, l *fencelock.Lease) error {
			fmt.Println("leading with token", l.Token())
			stop() // e.g. on SIGTERM: Elect resigns (releases) once fn returns
			<-ctx.Done()
			return nil
		},
		&recipe.ElectOptions{
			OnStoppedLeading: func(l recipe.Leader, err error) {
				fmt.Printf("%s stopped leading (lost: %v)\n", l.Identity, err != nil)
			},
		})
	fmt.Println("Elect returned:", err) // nil: it resigned when ctx ended
	// Output:
	// leading with token 1
	// node-1 stopped leading (lost: false)
	// Elect returned: <nil>
}

func ExampleCurrentLeader() {
	store := memory.NewStore()
	candidate, _ := fencelock.New(store.Backend(), nil)
	defer candidate.Close()
	follower, _ := fencelock.New(store.Backend(), nil)
	defer follower.Close()
	ctx := context.Background()

	if _, err := recipe.CurrentLeader(ctx, follower, "scheduler/leader"); errors.Is(err, recipe.ErrNoLeader) {
		fmt.Println("no leader yet")
	}
	leading := make(chan struct{})
	campaign, resign := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- recipe.Elect(campaign, candidate, "scheduler/leader", "node-1", []byte("10.0.0.1:8080"),
			func(ctx context.Context, l *fencelock.Lease) error {
				close(leading)
				<-ctx.Done()
				return nil
			}, nil)
	}()
	<-leading
	l, err := recipe.CurrentLeader(ctx, follower, "scheduler/leader")
	if err != nil {
		panic(err)
	}
	fmt.Printf("leader %s at %s (token %d)\n", l.Identity, l.Value, l.Token)
	resign()
	<-done
	if _, err := recipe.CurrentLeader(ctx, follower, "scheduler/leader"); errors.Is(err, recipe.ErrNoLeader) {
		fmt.Println("no leader after it resigned")
	}
	// Output:
	// no leader yet
	// leader node-1 at 10.0.0.1:8080 (token 1)
	// no leader after it resigned
}

func ExampleObserve() {
	store := memory.NewStore()
	observer, _ := fencelock.New(store.Backend(), nil)
	defer observer.Close()
	worker, _ := fencelock.New(store.Backend(), nil)
	defer worker.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	changes, err := recipe.Observe(ctx, observer, "scheduler/leader")
	if err != nil {
		panic(err)
	}
	show := func(l recipe.Leader) {
		if !l.Elected() {
			fmt.Println("no leader")
			return
		}
		fmt.Printf("leader %s at %s (token %d)\n", l.Identity, l.Value, l.Token)
	}
	show(<-changes) // the state now

	lease, err := worker.Acquire(ctx, "scheduler/leader",
		fencelock.WithLabel("node-2"), fencelock.WithMetadata([]byte("10.0.0.2:8080")))
	if err != nil {
		panic(err)
	}
	show(<-changes)
	_ = lease.Release(ctx)
	show(<-changes)
	stop()
	_, open := <-changes
	fmt.Println("channel open after ctx ended:", open)
	// Output:
	// no leader
	// leader node-2 at 10.0.0.2:8080 (token 1)
	// no leader
	// channel open after ctx ended: false
}
