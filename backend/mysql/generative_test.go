package mysql_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/driver"
)

// TestGenerative runs the generative conformance mode (random programs,
// faults at the driver boundary, histories checked with a fence in the
// loop) against a real MariaDB, on a table of its own, for
// FENCELOCK_GEN_BUDGET.
func TestGenerative(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	generative.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) { return mysql.Open(ctx, dsn) },
		TTL:  time.Second,
	}, nil)
}
