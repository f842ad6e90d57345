package redis

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/fencelock/fencelock/driver"
	goredis "github.com/redis/go-redis/v9"
)

// describe fills in the backend's description: what Redis guarantees,
// and the warnings found by reading the server's settings at start-up
// (unless Options.SkipChecks), each also logged to Options.Logger.
func (b *Backend) describe(ctx context.Context, o Options) {
	b.desc = driver.Description{
		Name:          "redis",
		Fencing:       "per-key INCR counter that never expires, issued in the same Lua script as the lock; survives a server restart only with appendonly yes and appendfsync always, and a failover only if the replica had it",
		Clock:         "Redis server (PEXPIRE/PTTL)",
		Liveness:      "TTL",
		Scope:         driver.ScopeKey,
		Failover:      "replication is asynchronous: a promoted replica may lack the latest lock (a second holder) and counter values (tokens repeat); a restart keeps them only with appendonly yes and appendfsync always",
		LossDetection: driver.LossByRenewal,
	}
	if b.waitReplicas > 0 {
		b.desc.Failover = fmt.Sprintf("each grant and renewal counts only once %d replicas acknowledged it (WAIT, timeout %v): a replica promoted after a failover has every grant a holder was told of, if every replica is counted and the promoted one did not restart in between", b.waitReplicas, b.waitFor)
	}
	if o.SkipChecks {
		b.desc.Warnings = []string{"server settings not checked (SkipChecks): persistence, eviction and replication unknown"}
	} else {
		b.desc.Warnings = serverWarnings(ctx, b.c, b.waitReplicas)
	}
	if b.waitReplicas > 0 {
		var mu sync.Mutex
		var counts []int
		err := forEachPrimary(ctx, b.c, func(ctx context.Context, node goredis.Cmdable) error {
			_, n := readReplication(ctx, node)
			mu.Lock()
			counts = append(counts, n)
			mu.Unlock()
			return nil
		})
		b.desc.FailoverSafe = err == nil && judgeFailover("", nil, counts, b.waitReplicas, b.waitFor).Met
	}
	for _, w := range b.desc.Warnings {
		b.log.Warn("fencelock/redis: "+w, "prefix", o.Prefix)
	}
}

// Describe implements driver.Describer. Warnings lists what the start-up
// check found in the server's settings that weakens exclusion or fencing.
func (b *Backend) Describe() driver.Description {
	d := b.desc
	d.Warnings = append([]string(nil), b.desc.Warnings...)
	return d
}

// serverWarnings reads the settings of every primary that decide whether
// Redis keeps its promises to a lock: eviction, persistence, replication.
// It returns one warning per finding; a server that refuses CONFIG
// (renamed or disabled, as managed services do) gets a warning that its
// settings are unknown, not an error.
func serverWarnings(ctx context.Context, c goredis.UniversalClient, wait int) []string {
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
		out  []string
	)
	add := func(ws []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range ws {
			if !seen[w] {
				seen[w] = true
				out = append(out, w)
			}
		}
	}
	switch c.(type) {
	case *goredis.ClusterClient:
		if wait > 0 {
			break // judged per primary, with its replicas
		}
		add([]string{"Redis Cluster replicates asynchronously: a failover can lose recently issued tokens and lock records, so tokens can repeat and two holders can overlap"})
	case *goredis.Ring:
		add([]string{"Ring shards keys by client-side hashing: a shard added, removed or marked down moves keys to another shard, where a lock and its counter start afresh (two holders, tokens restart)"})
	}
	err := forEachPrimary(ctx, c, func(ctx context.Context, node goredis.Cmdable) error {
		add(nodeWarnings(ctx, node, wait))
		return nil
	})
	if err != nil {
		add([]string{fmt.Sprintf("could not check every primary (%v): settings partly unknown", oneLine(err))})
	}
	sort.Strings(out)
	return out
}

// configNames are the settings read with CONFIG GET, for the warnings and
// the guarantees alike.
var configNames = []string{"maxmemory-policy", "appendonly", "appendfsync", "save"}

// readConfig reads configNames from one server.
func readConfig(ctx context.Context, c goredis.Cmdable) (map[string]string, error) {
	conf := map[string]string{}
	for _, name := range configNames {
		m, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			return nil, err
		}
		v, ok := m[name]
		if !ok {
			return nil, fmt.Errorf("CONFIG GET %s returned nothing", name)
		}
		conf[name] = v
	}
	return conf, nil
}

func nodeWarnings(ctx context.Context, c goredis.Cmdable, wait int) []string {
	var ws []string
	conf, confErr := readConfig(ctx, c)
	if confErr != nil {
		ws = append(ws, fmt.Sprintf("could not read the server's configuration (%v): eviction and persistence settings unknown; fencing tokens survive a restart only with appendonly yes and appendfsync always, and only maxmemory-policy noeviction keeps counters and locks from being evicted", oneLine(confErr)))
	} else {
		ws = append(ws, configWarnings(conf)...)
	}
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		ws = append(ws, fmt.Sprintf("could not read INFO replication (%v): replication unknown", oneLine(err)))
	} else {
		ws = append(ws, replicationWarnings(info, wait)...)
	}
	return ws
}

// configWarnings judges CONFIG GET results.
func configWarnings(conf map[string]string) []string {
	var ws []string
	switch p := conf["maxmemory-policy"]; {
	case strings.HasPrefix(p, "allkeys-"):
		ws = append(ws, fmt.Sprintf("maxmemory-policy is %s: under memory pressure Redis may evict token counters (tokens restart from 1: fencing broken) and live locks (two holders); use noeviction", p))
	case strings.HasPrefix(p, "volatile-"):
		ws = append(ws, fmt.Sprintf("maxmemory-policy is %s: under memory pressure Redis may evict live locks before their TTL (two holders); use noeviction", p))
	}
	aof := conf["appendonly"] == "yes"
	switch {
	case !aof && strings.TrimSpace(conf["save"]) == "":
		ws = append(ws, `no persistence (appendonly no, save ""): a restart empties the server, so token counters restart from 1 and fencing tokens go backwards; use appendonly yes with appendfsync always`)
	case !aof:
		ws = append(ws, fmt.Sprintf("persistence by RDB snapshots only (save %q): a restart loses the token increments since the last snapshot, so fencing tokens can repeat; use appendonly yes with appendfsync always", conf["save"]))
	case conf["appendfsync"] == "everysec":
		ws = append(ws, "appendfsync everysec: acknowledged tokens survive a crash of Redis itself, but an OS crash or power loss can lose about the last second of them (tokens can repeat); use appendfsync always")
	case conf["appendfsync"] == "no":
		ws = append(ws, "appendfsync no: acknowledged tokens survive a crash of Redis itself, but an OS crash or power loss can lose the last ~30 s of them (tokens can repeat); use appendfsync always")
	}
	return ws
}

// infoFields parses an INFO section into its fields.
func infoFields(info string) map[string]string {
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields
}

// replicationWarnings judges INFO replication; wait is
// Options.WaitReplicas.
func replicationWarnings(info string, wait int) []string {
	fields := infoFields(info)
	switch fields["role"] {
	case "slave", "replica":
		return []string{"connected to a replica (role:slave): lock writes go to a copy that the primary overwrites; connect to the primary"}
	case "master":
		n, _ := strconv.Atoi(fields["connected_slaves"])
		switch {
		case wait > 0 && wait > n:
			return []string{fmt.Sprintf("wait_replicas=%d but only %d replicas are connected: every grant will be refused until enough replicas are connected", wait, n)}
		case wait > 0 && wait < n:
			return []string{fmt.Sprintf("wait_replicas=%d but %d replicas are connected: a grant acknowledged by %d of them can be missing on the replica a failover promotes (two holders, tokens that repeat); set wait_replicas=%d", wait, n, wait, n)}
		case wait > 0:
			return nil
		}
		if n > 0 {
			return []string{fmt.Sprintf("replication is asynchronous (%d replicas connected): a failover can lose recently issued tokens and lock records, so tokens can repeat and two holders can overlap", n)}
		}
	}
	return nil
}

func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", " ")
}
