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
