package suite

import (
	"context"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/report"
)

// FaultSlotMigration: the keys a cell's contenders lock and wait on are
// moved, live, to another node of a sharded store (a Redis Cluster's
// slot migration: SETSLOT IMPORTING/MIGRATING, MIGRATE key by key,
// SETSLOT NODE) while holders renew and contenders wait
// (Control.MigrateKeys). Clients meet the migration's redirections (ASK,
// MOVED, TRYAGAIN). It runs when named in Config.Faults.
const FaultSlotMigration = "slot-migration"

// redisClusterExpectation: a Redis Cluster master replicates to its
// replicas asynchronously, as a Sentinel primary does ("redisha").
var redisClusterExpectation = report.Table{
	{Backend: "rediscluster", Fault: "primary-kill-failover", Expectation: report.Expectation{
		Unsafe:     true,
		Properties: []string{"P1", "P2", "P3", "P4"},
		Why: "A Redis Cluster master replicates to its replicas asynchronously. A lock record or token increment the " +
			"master acknowledged just before it died may be missing on the replica the Cluster promotes: a second " +
			"contender acquires a lock whose holder still believes it holds it, and a token can be issued again. " +
			"Whether a run shows it depends on the timing of the kill.",
		Fix: "Set wait_replicas to the number of replicas of every master (the rediscluster-acked row): a grant or " +
			"renewal counts only once they acknowledged it; or use a single durable Redis primary, or a consensus store.",
	}},
}

func init() { expectations = append(expectations, redisClusterExpectation...) }

// slotMigrationCell: in each round, once a contender holds a key, every
// key of the cell is moved to another node, the held one first.
func slotMigrationCell(be *backendEnv, ctl *Control, prof profile) cellSpec {
	ttl := be.ttl
	return cellSpec{fault: FaultSlotMigration, fencing: true,
		setup: ctl.setup(FaultSlotMigration, "the keys' shards moved to another node, live, while they are held and waited on"),
		run: func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.rounds {
				h, err := c.awaitHolder(ctx, 10*ttl)
				if err != nil {
					return i, err
				}
				keys := []string{h.key}
				for _, k := range c.keys {
					if k != h.key {
						keys = append(keys, k)
					}
				}
				desc := fmt.Sprintf("%s of %s while %s holds %s", FaultSlotMigration, strings.Join(keys, ", "), h.lease, h.key)
				from := c.note(history.FaultStart, "", desc)
				what, err := ctl.MigrateKeys(ctx, keys)
				to := c.note(history.FaultEnd, "", desc+" "+what)
				c.mu.Lock()
				c.rounds = append(c.rounds, roundMark{from: from, to: to})
				c.mu.Unlock()
				if err != nil {
					return i + 1, err
				}
				if err := between(ctx, i, prof.rounds, ttl); err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		}}
}
