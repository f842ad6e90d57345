package migrate_test

import (
	"context"
	"fmt"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/migrate"
)

// A dual client holds its lock on both backends; its token is above
// anything either had issued, and afterwards each backend alone issues
// higher ones still.
func ExampleNewDual() {
	ctx := context.Background()
	old, new := memory.New(), memory.New()
	_ = old.RaiseFloor(ctx, "jobs/nightly", 41) // the old backend's history

	dual, err := migrate.NewDual(old, new)
	if err != nil {
		panic(err)
	}
	c, err := fencelock.New(dual, nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "jobs/nightly")
	if err != nil {
		panic(err)
	}
	fmt.Println("dual token:", l.Token())
	_ = l.Release(ctx)
	// Output: dual token: 42
}

// CopyTokens before the cut-over: the new backend's first token for a key
// is above the old backend's last.
func ExampleCopyTokens() {
	ctx := context.Background()
	old, new := memory.New(), memory.New()
	_ = old.RaiseFloor(ctx, "jobs/nightly", 1000)

	rep, err := migrate.CopyTokens(ctx, old, new, "")
	if err != nil {
		panic(err)
	}
	fmt.Println("raised globally to", rep.Max, rep.Global)

	c, _ := fencelock.New(new, nil)
	defer c.Close()
	l, _ := c.Acquire(ctx, "jobs/nightly")
	fmt.Println("first token on the new backend:", l.Token())
	_ = l.Release(ctx)
	// Output:
	// raised globally to 1000 true
	// first token on the new backend: 1001
}

// The URL form, for configuration: engine options go on the outer URL.
func ExampleDualURL() {
	fmt.Println(migrate.DualURL("redis://cache:6379/0", "postgres://app@db/app") + "&ttl=20s")
	// Output: dual://?old=redis%3A%2F%2Fcache%3A6379%2F0&new=postgres%3A%2F%2Fapp%40db%2Fapp&ttl=20s
}
