package recipe_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

func ExampleRWLock() {
	ctx := context.Background()
	store := memory.NewStore()
	a, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "reader-a"})
	b, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "writer-b"})
	defer a.Close()
	defer b.Close()

	ra, err := recipe.NewRWLock(a, "catalog")
	if err != nil {
		panic(err)
	}
	rb, _ := recipe.NewRWLock(b, "catalog")
	var fence recipe.RWFence // the resource's side

	// Two readers at once.
	r1, _ := ra.RLock(ctx)
	r2, _ := ra.RLock(ctx)
	fmt.Println(r1.Shared(), fence.Admit("catalog", r1), fence.Admit("catalog", r2))
	if _, err := rb.TryLock(ctx); errors.Is(err, fencelock.ErrNotAcquired) {
		fmt.Println("writer refused while readers hold it")
	}
	holders, _ := rb.Holders(ctx)
	fmt.Println(len(holders), "holders")
	r1.Release(ctx)
	r2.Release(ctx)

	// One writer; its token is above every grant's before it.
	w, _ := rb.Lock(ctx, fencelock.WithMetadata([]byte("reindex")))
	fmt.Println(w.Token() > r2.Token(), fence.Admit("catalog", w))
	holders, _ = ra.Holders(ctx)
	fmt.Printf("%d holder: write %v, %d slots, %q\n", len(holders), holders[0].Write, holders[0].Slots, holders[0].Metadata)
	w.Release(ctx)

	// A reader that entered before the writer is refused by the resource
	// now: its token is below the writer's.
	fmt.Println(errors.Is(fence.Admit("catalog", r1), fencelock.ErrStaleToken))
	// Output:
	// true <nil> <nil>
	// writer refused while readers hold it
	// 2 holders
	// true <nil>
	// 1 holder: write true, 16 slots, "reindex"
	// true
}
