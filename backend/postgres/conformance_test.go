package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
)

// TestConformance runs the shared suite against a real PostgreSQL, on a
// table of its own.
func TestConformance(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) {
			return postgres.Open(ctx, dsn)
		},
		TTL:     time.Second,
		Restart: conformance.TestenvRestart("postgres"),
	})
}
