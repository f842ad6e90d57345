package recipe_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
)

// TestRecipesRefuseNilClient checks that every recipe entry point given a
// nil *fencelock.Client returns an error matching ErrInvalidOption at once,
// instead of a constructor succeeding and its first call panicking.
func TestRecipesRefuseNilClient(t *testing.T) {
	ctx := context.Background()
	check := func(name string, err error) {
		t.Helper()
		var ioe *fencelock.InvalidOptionError
		if !errors.Is(err, fencelock.ErrInvalidOption) || !errors.As(err, &ioe) || ioe.Option != "Client" {
			t.Errorf("%s(nil client): %v (%T), want an *InvalidOptionError for Client", name, err, err)
		}
	}
	_, err := recipe.NewSemaphore(nil, "jobs", 2)
	check("NewSemaphore", err)
	_, err = recipe.NewRWLock(nil, "config")
	check("NewRWLock", err)
	_, err = recipe.CurrentLeader(ctx, nil, "scheduler")
	check("CurrentLeader", err)
	_, err = recipe.Observe(ctx, nil, "scheduler")
	check("Observe", err)
	err = recipe.Elect(ctx, nil, "scheduler", "me", nil, func(context.Context, *fencelock.Lease) error { return nil }, nil)
	check("Elect", err)
}

// Elect without a function to run is refused with a typed error, before
// anything is stored.
func TestElectRefusesNilFn(t *testing.T) {
	c, err := fencelock.Open(context.Background(), "mem://elect-nil-fn", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = recipe.Elect(context.Background(), c, "k", "me", nil, nil, nil)
	if !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Fatalf("Elect(nil fn) = %v; want an error matching ErrInvalidOption", err)
	}
	if info, err := c.Inspect(context.Background(), "k"); err != nil || info.Owner != "" {
		t.Fatalf("Inspect after the refused Elect = %+v, %v; want the key untouched", info, err)
	}
}
