package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

func ExampleAcquireAll() {
	ctx := context.Background()
	store := memory.NewStore()
	a, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "transfer-a"})
	b, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "transfer-b"})
	defer a.Close()
	defer b.Close()

	// A transfer needs both accounts, or neither. The order the caller
	// names them in does not matter: every caller takes them sorted.
	g, err := recipe.AcquireAll(ctx, a, []string{"account/42", "account/7"}, fencelock.WithWait(time.Second))
	if err != nil {
		panic(err)
	}
	// One lease per key, each with its own token: each account's store
	// fences writes by its own key's token.
	fmt.Println(g.Keys(), g.Token("account/42"), g.Token("account/7"))

	// Another transfer touching account 7 waits (here: gives up at once);
	// it took nothing, so account 9 stays free.
	if _, err := recipe.TryAcquireAll(ctx, b, []string{"account/7", "account/9"}); errors.Is(err, fencelock.ErrNotAcquired) {
		info, _ := b.Inspect(ctx, "account/9")
		fmt.Println("refused; account/9 held:", info.Locked())
	}

	// Released together; lost together (g.Context ends when any key is
	// lost, and the others are released).
	g.Release(ctx)
	g2, _ := recipe.TryAcquireAll(ctx, b, []string{"account/7", "account/9"})
	fmt.Println(g2.Keys(), g2.Token("account/7"))
	g2.Release(ctx)
	// Output:
	// [account/42 account/7] 1 1
	// refused; account/9 held: false
	// [account/7 account/9] 2
}
