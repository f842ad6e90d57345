package migrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/migrate"
)

// A dual holds every lease on both sides, so it meets a guarantee only
// where both sides do: a memory side (tokens live in the process) makes
// durable-tokens unmet even beside a durable Redis, and the report names
// the side to fix.
func TestDualMeetsAGuaranteeOnlyWhereBothSidesDo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	redisURL := testenv.URL(t, "FENCELOCK_TEST_REDIS")
	pgURL := testenv.URL(t, "FENCELOCK_TEST_POSTGRES")

	// Both sides durable (the test Redis runs with appendfsync always).
	c, err := fencelock.Open(ctx, migrate.DualURL(redisURL, pgURL)+"&require=durable-tokens", nil)
	if err != nil {
		t.Fatalf("Open of a Redis+PostgreSQL dual requiring durable-tokens: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// The old side in memory: refused, naming the old side.
	d, err := migrate.NewDual(memory.New(), mustOpenBackend(t, ctx, redisURL))
	if err != nil {
		t.Fatal(err)
	}
	m, err := d.Guarantees(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := m[driver.DurableTokens]
	if got.Met || !strings.Contains(got.Observed, "old memory") || !strings.Contains(got.Fix, "old memory") {
		t.Errorf("durable-tokens of a memory+Redis dual = %+v; want unmet, observed and fix naming the old memory side", got)
	}
	if _, err := fencelock.New(d, &fencelock.Options{Require: []driver.Guarantee{driver.DurableTokens}}); !errors.Is(err, fencelock.ErrGuaranteeUnmet) {
		t.Errorf("New of a memory+Redis dual requiring durable-tokens: %v; want ErrGuaranteeUnmet", err)
	}
	_ = d.Close()
}

func mustOpenBackend(t *testing.T, ctx context.Context, url string) driver.Backend {
	t.Helper()
	b, _, err := fencelock.OpenBackend(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
