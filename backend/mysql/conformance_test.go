package mysql_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
)

// TestConformance runs the shared suite against a real MariaDB, on a
// table of its own.
func TestConformance(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) {
			return mysql.Open(ctx, dsn)
		},
		TTL:     time.Second,
		Restart: testenv.Restart("mysql"),
	})
}

// TestConformanceStockConfig runs the shared suite against a MariaDB in
// its packaged configuration (FENCELOCK_TEST_MYSQL_STOCK, started by
// `scripts/testenv up mysql-stock`: the distribution's my.cnf, so
// max_connections 151 and a 128 MiB buffer pool), the server a third
// party runs. It fails under CI=true when the variable is missing.
func TestConformanceStockConfig(t *testing.T) {
	base := testenv.URL(t, "FENCELOCK_TEST_MYSQL_STOCK")
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) {
			return mysql.Open(ctx, dsn)
		},
		TTL:     2 * time.Second,
		Restart: testenv.Restart("mysql-stock"),
		Leases:  200,
	})
}
