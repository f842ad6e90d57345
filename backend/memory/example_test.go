package memory_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
)

// Two clients share one Store, as two processes share a database; the
// Store can then take a lease away to test the holder's loss handling.
func ExampleStore() {
	ctx := context.Background()
	store := memory.NewStore()
	a, err := fencelock.New(store.Backend(), nil) // two clients, one store
	if err != nil {
		panic(err)
	}
	defer a.Close()
	b, err := fencelock.New(store.Backend(), nil)
	if err != nil {
		panic(err)
	}
	defer b.Close()

	lease, err := a.Acquire(ctx, "jobs/nightly")
	if err != nil {
		panic(err)
	}
	fmt.Println("a holds it with token", lease.Token())
	if _, err := b.TryAcquire(ctx, "jobs/nightly"); errors.Is(err, fencelock.ErrNotAcquired) {
		fmt.Println("b: not acquired")
	}

	// Take it away from a, as an administrator's force-release would.
	if _, err := store.Backend().ForceRelease(ctx, "jobs/nightly"); err != nil {
		panic(err)
	}
	<-lease.Done()
	fmt.Println("a lost it:", errors.Is(lease.Err(), fencelock.ErrLeaseLost))

	next, err := b.TryAcquire(ctx, "jobs/nightly")
	if err != nil {
		panic(err)
	}
	fmt.Println("b holds it with token", next.Token())
	// Output:
	// a holds it with token 1
	// b: not acquired
	// a lost it: true
	// b holds it with token 2
}
