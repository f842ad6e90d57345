package suite

import (
	"context"
	"fmt"
	"strings"

	"github.com/fencelock/fencelock/safety/history"
)

// FaultSlotMigration: the keys a cell's contenders lock and wait on are
// moved, live, to another node of a sharded store (a Redis Cluster's
// slot migration: SETSLOT IMPORTING/MIGRATING, MIGRATE key by key,
// SETSLOT NODE) while holders renew and contenders wait
// (Control.MigrateKeys). Clients meet the migration's redirections (ASK,
// MOVED, TRYAGAIN). It runs when named in Config.Faults.
const FaultSlotMigration = "slot-migration"

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
