package file

import (
	"context"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.Guarantor = (*Backend)(nil)

// Guarantees implements driver.Guarantor: durable-tokens is met when
// records and counters are synced to disk (the default; not with
// sync=false); failover never (one machine's directory); server-clock is
// met, since every holder of the directory reads the one machine's clock.
func (b *Backend) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	durable := driver.Measurement{Met: true, Observed: "file backend with sync=true: counters are synced to disk when a token is issued"}
	if !b.sync {
		durable = driver.Measurement{Observed: "file backend with sync=false: a machine crash can lose the last tokens issued",
			Fix: "drop sync=false from the URL (Options.NoSync)"}
	}
	clock := "the machine's CLOCK_MONOTONIC, shared by every process on it"
	if !b.clk.monotonic {
		clock = "the machine's wall clock, shared by every process on it"
	}
	return map[driver.Guarantee]driver.Measurement{
		driver.DurableTokens: durable,
		driver.Failover: {Observed: "file backend: one machine's directory, nothing to fail over to",
			Fix: "use etcd or ZooKeeper (3 or more members), or PostgreSQL with a synchronous standby"},
		driver.ServerClock: {Met: true, Observed: "expiry judged by " + clock},
	}, nil
}
