package redis

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
	goredis "github.com/redis/go-redis/v9"
)

var _ driver.Guarantor = (*Backend)(nil)

// Guarantees implements driver.Guarantor. It reads, on every primary,
// the settings the start-up check reads (CONFIG GET appendonly,
// appendfsync, maxmemory-policy, save; INFO replication), whether or not
// Options.SkipChecks was set, and judges:
//
//   - durable-tokens: met only with appendonly yes, appendfsync always and
//     no allkeys-* eviction on every primary (a server that refuses CONFIG
//     is unknown, hence not met);
//   - failover: met only with Options.WaitReplicas equal to the replicas
//     connected to every primary (judgeFailover); without it never
//     (replication is asynchronous; without replicas there is nothing to
//     fail over to);
//   - server-clock: met (PEXPIRE/PTTL on the server).
func (b *Backend) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		durable []string // observed per primary
		fixes   = map[string]bool{}
		met     = true
		repl    []string
		counts  []int // connected replicas per primary (-1: unknown)
	)
	err := forEachPrimary(ctx, b.c, func(ctx context.Context, node goredis.Cmdable) error {
		obs, fix, ok := judgeDurable(readConfig(ctx, node))
		role, count := readReplication(ctx, node)
		mu.Lock()
		defer mu.Unlock()
		durable = append(durable, obs)
		repl = append(repl, role)
		counts = append(counts, count)
		met = met && ok
		for _, f := range fix {
			fixes[f] = true
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redis: reading the settings of every primary: %w", err)
	}
	if len(durable) == 0 {
		met = false
		durable = []string{"no primary answered"}
	}
	sort.Strings(durable)
	sort.Strings(repl)
	d := driver.Measurement{Met: met, Observed: "Redis " + strings.Join(dedupe(durable), "; ")}
	if !met {
		var fs []string
		for f := range fixes {
			fs = append(fs, f)
		}
		sort.Strings(fs)
		d.Fix = strings.Join(fs, "; ")
	}
	topology := "a single server"
	switch b.c.(type) {
	case *goredis.ClusterClient:
		topology = "Redis Cluster (asynchronous replication)"
	case *goredis.Ring:
		topology = "a Ring of shards hashed by the client"
	}
	return map[driver.Guarantee]driver.Measurement{
		driver.DurableTokens: d,
		driver.Failover:      judgeFailover(topology, dedupe(repl), counts, b.waitReplicas, b.waitFor),
		driver.ServerClock:   {Met: true, Observed: "expiry judged by the Redis server's clock (PEXPIRE/PTTL)"},
	}, nil
}

// readReplication reads one primary's INFO replication: a description
// and its connected replicas (-1 when unknown).
func readReplication(ctx context.Context, node goredis.Cmdable) (string, int) {
	info, err := node.Info(ctx, "replication").Result()
	if err != nil {
		return "replication unknown", -1
	}
	f := infoFields(info)
	n, err := strconv.Atoi(f["connected_slaves"])
	if err != nil {
		n = -1
	}
	return "role:" + f["role"] + ", " + f["connected_slaves"] + " replicas", n
}

// judgeFailover judges the failover guarantee. Without WaitReplicas it
// is never met: replication is asynchronous, so a promoted replica can
// lack the latest grants. With it, met when every primary has at least
// one replica connected and wait counts all of them: each grant and
// renewal a holder was told of was then acknowledged by every replica,
// one of which a failover promotes. Caveats, in Observed: a replica
// acknowledges what it received, in memory, so it must not restart
// between acknowledgement and promotion (WAITAOF would cover that); and a
// replica that was disconnected (and so not counted) must not be
// promoted, which the Sentinel's replica-validity rules see to for long
// disconnections only.
func judgeFailover(topology string, repl []string, counts []int, wait int, timeout time.Duration) driver.Measurement {
	obs := "Redis, " + topology + ", " + strings.Join(repl, "; ")
	if wait == 0 {
		return driver.Measurement{
			Observed: obs + ": replication is asynchronous, so a promoted replica can lack the latest locks and token increments",
			Fix:      "set wait_replicas to the number of replicas of each primary (each grant then waits for their acknowledgement), or use etcd or ZooKeeper (3 or more members), or PostgreSQL with a synchronous standby",
		}
	}
	obs += fmt.Sprintf("; each grant and renewal waits for %d replica acknowledgements (WAIT, timeout %v)", wait, timeout)
	met := len(counts) > 0
	for _, n := range counts {
		met = met && n == wait
	}
	if !met {
		return driver.Measurement{
			Observed: obs + ": not every primary has exactly that many replicas connected",
			Fix:      "set wait_replicas to the number of replicas connected to each primary (INFO replication: connected_slaves): fewer leaves a replica that may not have a grant, more refuses every grant",
		}
	}
	return driver.Measurement{Met: true, Observed: obs + ": every replica acknowledges each grant before it counts, so the one a failover promotes has it " +
		"(as long as that replica does not restart between acknowledgement and promotion, and a replica that was disconnected is not promoted)"}
}

// judgeDurable judges durable-tokens from one server's CONFIG GET results:
// what was observed, the settings that would meet it, and whether it is
// met.
func judgeDurable(conf map[string]string, err error) (observed string, fix []string, met bool) {
	if err != nil {
		return fmt.Sprintf("settings unknown: CONFIG GET refused (%s)", oneLine(err)),
			[]string{"allow CONFIG GET for this user (or ask the provider to confirm appendonly yes, appendfsync always, maxmemory-policy noeviction)"}, false
	}
	observed = fmt.Sprintf("appendonly=%s, appendfsync=%s, maxmemory-policy=%s", conf["appendonly"], conf["appendfsync"], conf["maxmemory-policy"])
	if conf["appendonly"] != "yes" || conf["appendfsync"] != "always" {
		fix = append(fix, "set appendonly yes and appendfsync always (CONFIG SET appendonly yes; CONFIG SET appendfsync always; and in redis.conf)")
	}
	if strings.HasPrefix(conf["maxmemory-policy"], "allkeys-") {
		fix = append(fix, "set maxmemory-policy noeviction (an allkeys-* policy can evict token counters)")
	}
	return observed, fix, len(fix) == 0
}

func dedupe(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
