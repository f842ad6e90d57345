package safety

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencelock/fencelock/safety/cluster"
	"github.com/fencelock/fencelock/safety/suite"
)

// redisClusterLockKey is the Redis key of a suite key's lock record (the
// backend's default prefix); its counter shares its slot.
func redisClusterLockKey(key string) string { return "{fencelock:" + key + "}:lock" }

// migrateStep is the pause after each stage of a slot migration and each
// key it moves: long enough for the contenders' calls to meet ASK and
// TRYAGAIN (a script whose lock has moved and whose counter has not).
const migrateStep = 100 * time.Millisecond

// redisClusterControl is the faults of the Redis Cluster rows: the
// master of a held key's slot killed (kill -9) until its replica takes
// over, and the cell's keys moved to another master, live.
func redisClusterControl(ct *cluster.Testenv, row string) *suite.Control {
	name := cluster.RedisCluster
	acked := ""
	if row == redisClusterAcked {
		acked = ", grants and renewals acknowledged by the master's replica (wait_replicas=1, WAIT)"
	}
	return &suite.Control{
		FailoverName: fFailover,
		Setup: map[string]string{
			suite.FaultFailover: "3 masters with a replica each, cluster-node-timeout 2000 ms" + acked + "; the master of a held key's slot killed (kill -9), " +
				"its replica promoted by the Cluster, the old master started again (it rejoins as the new one's replica; the fault ends once it is linked)",
			suite.FaultSlotMigration: "3 masters with a replica each" + acked + "; the slots of the cell's keys, held and waited on, moved to another master live: " +
				"SETSLOT IMPORTING/MIGRATING, MIGRATE key by key, SETSLOT NODE, 100 ms after each step",
		},
		FailoverKey: func(ctx context.Context, key string) (string, error) {
			slot, err := ct.SlotOf(ctx, name, redisClusterLockKey(key))
			if err != nil {
				return "", err
			}
			master, err := awaitSlotMaster(ctx, ct, slot, "")
			if err != nil {
				return "", err
			}
			if err := ct.Kill(ctx, name, master); err != nil {
				return "", err
			}
			promoted, werr := awaitSlotMaster(ctx, ct, slot, master)
			// Always start it again: later rounds need the replica.
			serr := ct.Start(context.WithoutCancel(ctx), name, master)
			if serr == nil {
				serr = waitReady(ctx, ct, name)
			}
			return fmt.Sprintf("(member %s, master of slot %d; member %s promoted)", master, slot, promoted), errors.Join(werr, serr)
		},
		MigrateKeys: func(ctx context.Context, keys []string) (string, error) {
			var moves []string
			done := map[int]bool{}
			for _, k := range keys {
				slot, err := ct.SlotOf(ctx, name, redisClusterLockKey(k))
				if err != nil {
					return strings.Join(moves, ", "), err
				}
				if done[slot] {
					continue
				}
				done[slot] = true
				from, err := awaitSlotMaster(ctx, ct, slot, "")
				if err != nil {
					return strings.Join(moves, ", "), err
				}
				masters, err := ct.Masters(ctx, name)
				if err != nil {
					return strings.Join(moves, ", "), err
				}
				to := ""
				for i, m := range masters {
					if m == from {
						to = masters[(i+1)%len(masters)]
					}
				}
				if to == "" || to == from {
					return strings.Join(moves, ", "), fmt.Errorf("no master to move slot %d to (masters %v)", slot, masters)
				}
				if _, err := ct.MigrateSlot(ctx, name, slot, to, migrateStep); err != nil {
					return strings.Join(moves, ", "), err
				}
				moves = append(moves, fmt.Sprintf("slot %d: member %s to %s", slot, from, to))
			}
			return "(" + strings.Join(moves, ", ") + ")", nil
		},
	}
}

// awaitSlotMaster waits (at most a minute) until a member other than
// not serves slot, and returns it.
func awaitSlotMaster(ctx context.Context, ct *cluster.Testenv, slot int, not string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		m, err := ct.SlotMaster(ctx, cluster.RedisCluster, slot)
		if err == nil && m != not {
			return m, nil
		}
		if err != nil && !errors.Is(err, cluster.ErrNoLeader) {
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for a master of slot %d other than member %q: %w", slot, not, ctx.Err())
		case <-tick.C:
		}
	}
}
