package bench

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
)

// BenchmarkScale: one client (fencelock.OpenBackend of the URL a user
// would write, its defaults: TTL 15s, renewal every 5s, the 2-connection
// renewal pool) holds 1,000 and 10,000 leases for three renewal
// intervals, and reports the renewal round trips per interval (RenewBatch
// calls; the backend coalesces concurrent ones into fewer statements), the
// client's and the server's CPU, and that no lease was lost. Run it with
// -benchtime 1x.
func BenchmarkScale(b *testing.B) {
	benchkit.Scale(b, []int{1000, 10000}, 3, func(b *testing.B) (driver.Backend, *fencelock.Options) {
		be, o, err := fencelock.OpenBackend(context.Background(), fencelockDSN(b))
		if err != nil {
			b.Fatal(err)
		}
		return be, o
	}, benchkit.ServerCPU(benchkit.TestenvCPU("postgres")))
}
