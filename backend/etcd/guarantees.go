package etcd

import (
	"context"
	"fmt"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.Guarantor = (*Backend)(nil)

// Guarantees implements driver.Guarantor. It asks the cluster for its
// members (MemberList) and judges:
//
//   - durable-tokens: met (revisions are in the Raft log, fsynced before a
//     write is acknowledged; --unsafe-no-fsync, which clients cannot see,
//     would break it);
//   - failover: met with three or more voting members (a majority
//     survives the loss of the leader with every grant and revision); a
//     single member is not met;
//   - server-clock: met (lease expiry judged by the leader).
func (b *Backend) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	resp, err := b.cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd: listing the cluster's members: %w", err)
	}
	voters := 0
	for _, m := range resp.Members {
		if !m.IsLearner {
			voters++
		}
	}
	failover := driver.Measurement{Met: voters >= 3, Observed: fmt.Sprintf("etcd cluster with %d voting member(s) (Raft majority writes)", voters)}
	if voters < 3 {
		failover.Observed += ": the loss of one member loses quorum or everything"
		failover.Fix = "run 3 or 5 voting members and list them in the URL: etcd://h1:2379,h2:2379,h3:2379"
	}
	return map[driver.Guarantee]driver.Measurement{
		driver.DurableTokens: {Met: true, Observed: "etcd: revisions are in the Raft log, fsynced before a write is acknowledged"},
		driver.Failover:      failover,
		driver.ServerClock:   {Met: true, Observed: "expiry judged by the etcd leader (lease TTL)"},
	}, nil
}
