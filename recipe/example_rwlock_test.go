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
	// 1 holder: write true, 0 slots, "reindex"
	// true
}

func ExampleRWGrant_Upgrade() {
	ctx := context.Background()
	store := memory.NewStore()
	a, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "migrator"})
	b, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "others"})
	defer a.Close()
	defer b.Close()
	ra, _ := recipe.NewRWLock(a, "schema")
	rb, _ := recipe.NewRWLock(b, "schema")
	var fence recipe.RWFence

	// A writer before, then a reader that may decide to write.
	w, _ := rb.Lock(ctx)
	fence.Admit("schema", w)
	w.Release(ctx)
	u, _ := ra.UpgradeableRLock(ctx)
	r, _ := rb.RLock(ctx) // ordinary readers still enter beside it
	fmt.Println(u.Shared(), fence.Admit("schema", u), fence.Admit("schema", r))
	if _, err := rb.TryLock(ctx); errors.Is(err, fencelock.ErrNotAcquired) {
		fmt.Println("no writer while an upgradeable reader holds it")
	}

	// Upgrade waits for the other readers to leave; no writer gets in
	// between the read and the write.
	go r.Release(ctx)
	if err := u.Upgrade(ctx); err != nil {
		panic(err)
	}
	fmt.Println(u.Shared(), u.Token() > w.Token(), fence.Admit("schema", u))
	u.Release(ctx)
	// Output:
	// true <nil> <nil>
	// no writer while an upgradeable reader holds it
	// false true <nil>
}
