package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

var _ driver.Guarantor = (*Backend)(nil)

// Guarantees implements driver.Guarantor. It reads the ensemble's
// membership from /zookeeper/config (ZooKeeper 3.5 and later) and judges:
//
//   - durable-tokens: met (the transaction log is fsynced before a write
//     is acknowledged; forceSync=no, which clients cannot see, would
//     break it);
//   - failover: met with three or more voting members (a quorum survives
//     the loss of the leader with every znode and zxid); a standalone
//     server, or an unreadable membership, is not met;
//   - server-clock: met (session expiry judged by the leader).
func (b *Backend) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	failover := driver.Measurement{}
	data, _, err := b.conn.Get(ctx, "/zookeeper/config")
	switch {
	case errors.Is(err, zk.ErrNoNode):
		failover.Observed = "ZooKeeper membership unknown (no /zookeeper/config: a server older than 3.5)"
	case err != nil && (errors.Is(err, zk.ErrNoAuth)):
		failover.Observed = "ZooKeeper membership unknown (/zookeeper/config not readable by this client)"
	case err != nil:
		return nil, fmt.Errorf("zookeeper: reading /zookeeper/config: %w", err)
	default:
		voters := 0
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "server.") && !strings.Contains(line, ":observer") {
				voters++
			}
		}
		failover.Met = voters >= 3
		if voters == 0 {
			failover.Observed = "ZooKeeper standalone (no server.N entries in /zookeeper/config): a single server, nothing to fail over to"
		} else {
			failover.Observed = fmt.Sprintf("ZooKeeper ensemble of %d voting members (Zab quorum writes)", voters)
		}
	}
	if !failover.Met {
		failover.Fix = "run an ensemble of 3 or 5 voting members (server.N entries in zoo.cfg) and list them in the URL: zk://h1:2181,h2:2181,h3:2181"
	}
	return map[driver.Guarantee]driver.Measurement{
		driver.DurableTokens: {Met: true, Observed: "ZooKeeper: zxids and znodes are in the transaction log, fsynced before a write is acknowledged"},
		driver.Failover:      failover,
		driver.ServerClock:   {Met: true, Observed: "expiry judged by the ZooKeeper leader (session timeout)"},
	}, nil
}
