package recipe_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

func ExampleSemaphore() {
	ctx := context.Background()
	store := memory.NewStore()
	a, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "worker-a"})
	b, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "worker-b"})
	defer a.Close()
	defer b.Close()

	// At most two concurrent exports, across every client of the store.
	sa, err := recipe.NewSemaphore(a, "exports", 2)
	if err != nil {
		panic(err)
	}
	sb, _ := recipe.NewSemaphore(b, "exports", 2)
	p1, _ := sa.Acquire(ctx)
	p2, _ := sb.Acquire(ctx)
	// Each permit is a lease on its own slot key, with that slot's
	// fencing token: the resource fences by p.Key(), not "exports".
	fmt.Println(p1.Key() != p2.Key(), p1.Token(), p2.Token())

	if _, err := sb.TryAcquire(ctx); errors.Is(err, fencelock.ErrNotAcquired) {
		fmt.Println("both permits held")
	}
	holders, _ := sa.Holders(ctx)
	fmt.Println(len(holders), "holders")

	// A caller that disagrees on the number of permits is refused.
	s3, _ := recipe.NewSemaphore(b, "exports", 3)
	if _, err := s3.TryAcquire(ctx); errors.Is(err, recipe.ErrPermitsMismatch) {
		fmt.Println("refused:", err)
	}
	p1.Release(ctx)
	p2.Release(ctx)
	// Output:
	// true 1 1
	// both permits held
	// 2 holders
	// refused: recipe: semaphore "exports" used with 3 permits, but "exports/.permit/0" is held by a caller using 2
}
