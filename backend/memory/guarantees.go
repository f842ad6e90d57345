package memory

import (
	"context"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.Guarantor = (*Backend)(nil)

// Guarantees implements driver.Guarantor: the store lives in the process,
// so tokens survive neither a restart nor a failover; expiry is judged by
// the process's one monotonic clock, shared by every holder.
func (b *Backend) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	const fix = "use a store outside the process: file (one machine), PostgreSQL, Redis with appendfsync always, etcd or ZooKeeper"
	return map[driver.Guarantee]driver.Measurement{
		driver.DurableTokens: {Observed: "memory backend: tokens live in the process and restart from 1 with it", Fix: fix},
		driver.Failover:      {Observed: "memory backend: one process, nothing to fail over to", Fix: "use etcd or ZooKeeper (3 or more members)"},
		driver.ServerClock:   {Met: true, Observed: "expiry judged by the process's monotonic clock, shared by every holder"},
	}, nil
}
