package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ---------------------------------------------------------------- rediscluster

// rediscluster: a Redis Cluster of six redis-server members on loopback,
// masters 1 2 3 at first (slots split in three) and replicas 4 5 6 (of 1
// 2 3), AOF with appendfsync always like the redis server,
// cluster-node-timeout 2000 ms (a replica takes over 2-4 s after its
// master died). A killed master started again rejoins as a replica of
// its successor. Data and nodes.conf in rediscluster/ID/data.
// URL: redis+cluster://127.0.0.1:P1,…,127.0.0.1:P6

// redisClusterNodeTimeout is the members' cluster-node-timeout.
const redisClusterNodeTimeout = 2000 * time.Millisecond

// migrateBound bounds one MIGRATE exchange: the command's own timeout
// (5 s) and the time to send the key and answer.
const migrateBound = 10 * time.Second

func redisClusterServer() *server {
	s := &server{name: "rediscluster", members: []string{"1", "2", "3", "4", "5", "6"}}
	addr := func(u *unit, id string) string { return hostPort(u.port("REDISCLUSTER_PORT_" + id)) }
	redis := servers["redis"]
	if redis == nil {
		redis = redisServer("redis", false)
	}
	s.packages = redis.packages
	s.install = redis.install
	s.init = func(ctx context.Context, u *unit) error {
		for _, id := range s.members {
			for _, k := range []string{"PORT", "BUS_PORT"} {
				if _, err := u.savePort("REDISCLUSTER_" + k + "_" + id); err != nil {
					return err
				}
			}
			_ = os.RemoveAll(u.mdir(id))
			if err := os.MkdirAll(filepath.Join(u.mdir(id), "data"), 0o755); err != nil {
				return err
			}
			conf := fmt.Sprintf(`# made by fencelock testenv (rediscluster, member %s)
port %d
cluster-port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
logfile ""
save ""
appendonly yes
appendfsync always
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout %d
repl-diskless-sync yes
repl-diskless-sync-delay 0
`, id, u.port("REDISCLUSTER_PORT_"+id), u.port("REDISCLUSTER_BUS_PORT_"+id), filepath.Join(u.mdir(id), "data"),
				redisClusterNodeTimeout.Milliseconds())
			if err := os.WriteFile(filepath.Join(u.mdir(id), "redis.conf"), []byte(conf), 0o644); err != nil {
				return err
			}
		}
		return nil
	}
	s.start = func(u *unit, id string) error {
		return u.spawn(id, nil, u.get("REDIS_BIN"), filepath.Join(u.mdir(id), "redis.conf"))
	}
	s.memberReady = func(ctx context.Context, u *unit, id string) error { return redisPing(ctx, addr(u, id)) }
	// ready: before the cluster is formed (setup) every member answers
	// PING; after, every member says cluster_state:ok, three masters
	// serve all slots, and each has a replica whose link is up.
	s.ready = func(ctx context.Context, u *unit) error {
		if !fileExists(filepath.Join(u.dir, "setup-done")) {
			for _, id := range s.members {
				if err := redisPing(ctx, addr(u, id)); err != nil {
					return fmt.Errorf("member %s: %w", id, err)
				}
			}
			return nil
		}
		return redisClusterWhole(ctx, u, s.members, addr)
	}
	// setup forms the cluster once: MEET, a third of the slots to each
	// of 1 2 3, 4 5 6 replicas of them; it returns once it is whole.
	s.setup = func(ctx context.Context, u *unit) error {
		ids := map[string]string{}
		for _, id := range s.members {
			v, err := redisDo(ctx, addr(u, id), "CLUSTER", "MYID")
			if err != nil {
				return fmt.Errorf("member %s: CLUSTER MYID: %w", id, err)
			}
			ids[id], _ = v.(string)
		}
		for _, id := range s.members[1:] {
			if _, err := redisDo(ctx, addr(u, "1"), "CLUSTER", "MEET", "127.0.0.1", u.get("REDISCLUSTER_PORT_"+id), u.get("REDISCLUSTER_BUS_PORT_"+id)); err != nil {
				return fmt.Errorf("CLUSTER MEET %s: %w", id, err)
			}
		}
		ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
		for i, id := range s.members[:3] {
			if _, err := redisDo(ctx, addr(u, id), "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(ranges[i][0]), strconv.Itoa(ranges[i][1])); err != nil {
				return fmt.Errorf("member %s: CLUSTER ADDSLOTSRANGE: %w", id, err)
			}
		}
		for i, id := range s.members[3:] {
			master := ids[s.members[i]]
			// A replica can follow only a master it knows of: wait for
			// the gossip of MEET to reach it.
			if err := u.waitFor(ctx, u.e.Timeout, "rediscluster/"+id+" knowing its master", u.alive, func(ctx context.Context) error {
				_, err := redisDo(ctx, addr(u, id), "CLUSTER", "REPLICATE", master)
				return err
			}); err != nil {
				return err
			}
		}
		return u.waitFor(ctx, u.e.Timeout, "rediscluster", u.alive, func(ctx context.Context) error {
			return redisClusterWhole(ctx, u, s.members, addr)
		})
	}
	s.addr = addr
	s.url = func(u *unit) string { return "redis+cluster://" + joinAddrs(u, s.members, addr) }
	// leader: the master serving slot 0 (a Cluster has a master per
	// slot range; SlotMaster names the one of a key).
	s.leader = func(ctx context.Context, u *unit) (string, error) {
		return redisClusterSlotMaster(ctx, u, s.members, addr, 0)
	}
	s.version = func(ctx context.Context, u *unit) string { return cmdOutput(ctx, u.get("REDIS_BIN"), "--version") }
	return s
}

// redisNode is one line of CLUSTER NODES.
type redisNode struct {
	id, addr, masterID string
	master, fail       bool
	connected          bool
	slots              [][2]int // served ranges (not the migrating/importing marks)
}

// redisClusterNodes reads CLUSTER NODES from the member at addr.
func redisClusterNodes(ctx context.Context, addr string) ([]redisNode, error) {
	v, err := redisDo(ctx, addr, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	text, _ := v.(string)
	var out []redisNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := redisNode{id: f[0], masterID: f[3], connected: f[7] == "connected"}
		n.addr, _, _ = strings.Cut(f[1], "@")
		flags := strings.Split(f[2], ",")
		n.master = slices.Contains(flags, "master")
		n.fail = slices.Contains(flags, "fail") || slices.Contains(flags, "fail?") || slices.Contains(flags, "noaddr")
		for _, sl := range f[8:] {
			if strings.HasPrefix(sl, "[") {
				continue
			}
			lo, hi, isRange := strings.Cut(sl, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 == nil && err2 == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// redisClusterWhole passes when every member says cluster_state:ok and,
// as the first member that answers sees it, three masters serve all
// 16384 slots, none failing, each with a replica whose link is up.
func redisClusterWhole(ctx context.Context, u *unit, members []string, addr func(*unit, string) string) error {
	for _, id := range members {
		v, err := redisDo(ctx, addr(u, id), "CLUSTER", "INFO")
		if s, _ := v.(string); err != nil || !strings.Contains(s, "cluster_state:ok") {
			return fmt.Errorf("member %s: cluster state not ok (%v)", id, err)
		}
	}
	nodes, err := redisClusterNodes(ctx, addr(u, members[0]))
	if err != nil {
		return err
	}
	byID := map[string]redisNode{}
	for _, n := range nodes {
		byID[n.id] = n
	}
	covered, masters := 0, 0
	for _, n := range nodes {
		if n.fail || !n.connected {
			return fmt.Errorf("node %s is failing or not connected", n.addr)
		}
		if !n.master {
			if m, ok := byID[n.masterID]; !ok || !m.master {
				return fmt.Errorf("replica %s follows no master", n.addr)
			}
			info, err := redisDo(ctx, n.addr, "INFO", "replication")
			if s, _ := info.(string); err != nil || !strings.Contains(s, "master_link_status:up") {
				return fmt.Errorf("replica %s not linked yet", n.addr)
			}
			continue
		}
		if len(n.slots) == 0 {
			continue
		}
		masters++
		replicas := 0
		for _, r := range nodes {
			if !r.master && r.masterID == n.id {
				replicas++
			}
		}
		if replicas == 0 {
			return fmt.Errorf("master %s has no replica", n.addr)
		}
		for _, r := range n.slots {
			covered += r[1] - r[0] + 1
		}
	}
	if masters != 3 || covered != 16384 {
		return fmt.Errorf("%d masters serve %d slots", masters, covered)
	}
	return nil
}

// redisClusterSlotMaster returns the member that serves slot, as the
// first active member sees it, if it is active itself.
func redisClusterSlotMaster(ctx context.Context, u *unit, members []string, addr func(*unit, string) string, slot int) (string, error) {
	for _, id := range members {
		if !u.active(id) {
			continue
		}
		nodes, err := redisClusterNodes(ctx, addr(u, id))
		if err != nil {
			continue
		}
		for _, n := range nodes {
			if !n.master || n.fail {
				continue
			}
			for _, r := range n.slots {
				if slot >= r[0] && slot <= r[1] {
					if m := memberAt(u, members, addr, n.addr); m != "" && u.active(m) {
						return m, nil
					}
				}
			}
		}
		break
	}
	return "", ErrNoLeader
}

// memberAt is the member whose client address is a.
func memberAt(u *unit, members []string, addr func(*unit, string) string, a string) string {
	for _, id := range members {
		if addr(u, id) == a {
			return id
		}
	}
	return ""
}

// redisCluster returns the started rediscluster-kind unit name.
func (e *Env) redisCluster(name string) (*unit, error) {
	u, err := e.cluster(name)
	if err != nil {
		return nil, err
	}
	if u.srv.name != "rediscluster" {
		return nil, fmt.Errorf("%w: %s is not a Redis Cluster", ErrNotCluster, name)
	}
	return u, nil
}

// SlotOf returns the Redis Cluster hash slot of key (CLUSTER KEYSLOT on
// a running member of the Redis Cluster name).
func (e *Env) SlotOf(ctx context.Context, name, key string) (int, error) {
	u, err := e.redisCluster(name)
	if err != nil {
		return 0, err
	}
	var last error = ErrNotRunning
	for _, id := range u.srv.members {
		if !u.active(id) {
			continue
		}
		v, err := redisDo(ctx, u.srv.addr(u, id), "CLUSTER", "KEYSLOT", key)
		if n, ok := v.(int64); err == nil && ok {
			return int(n), nil
		}
		last = err
	}
	return 0, last
}

// SlotMaster returns the member of the Redis Cluster name that serves
// slot now, or ErrNoLeader (its master is failing or paused, and no
// replica has taken over yet).
func (e *Env) SlotMaster(ctx context.Context, name string, slot int) (string, error) {
	u, err := e.redisCluster(name)
	if err != nil {
		return "", err
	}
	return redisClusterSlotMaster(ctx, u, u.srv.members, u.srv.addr, slot)
}

// MigrateSlot moves slot of the Redis Cluster name from the master that
// serves it to member to (another master), live, the way redis-cli
// --cluster reshard does: CLUSTER SETSLOT IMPORTING on the target,
// MIGRATING on the source, MIGRATE of the slot's keys one at a time,
// then SETSLOT NODE on the target, the source and the other masters. It
// waits step after each stage and each key, so that clients meet the
// migration's redirections (ASK, TRYAGAIN for a script whose keys are
// split between the two). It returns the member the slot left.
func (e *Env) MigrateSlot(ctx context.Context, name string, slot int, to string, step time.Duration) (string, error) {
	u, err := e.redisCluster(name)
	if err != nil {
		return "", err
	}
	if err := u.checkMember(to); err != nil {
		return "", err
	}
	from, err := e.SlotMaster(ctx, name, slot)
	if err != nil {
		return "", err
	}
	if from == to {
		return from, fmt.Errorf("testenv: %s: slot %d is already served by member %s", name, slot, to)
	}
	src, dst := u.srv.addr(u, from), u.srv.addr(u, to)
	myID := func(a string) (string, error) {
		v, err := redisDo(ctx, a, "CLUSTER", "MYID")
		s, _ := v.(string)
		return s, err
	}
	srcID, err := myID(src)
	if err != nil {
		return from, err
	}
	dstID, err := myID(dst)
	if err != nil {
		return from, err
	}
	sl := strconv.Itoa(slot)
	wait := func() error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(step):
			return nil
		}
	}
	if _, err := redisDo(ctx, dst, "CLUSTER", "SETSLOT", sl, "IMPORTING", srcID); err != nil {
		return from, fmt.Errorf("SETSLOT IMPORTING on member %s: %w", to, err)
	}
	if _, err := redisDo(ctx, src, "CLUSTER", "SETSLOT", sl, "MIGRATING", dstID); err != nil {
		return from, fmt.Errorf("SETSLOT MIGRATING on member %s: %w", from, err)
	}
	if err := wait(); err != nil {
		return from, err
	}
	host, port, _ := strings.Cut(dst, ":")
	for {
		v, err := redisDo(ctx, src, "CLUSTER", "GETKEYSINSLOT", sl, "1")
		if err != nil {
			return from, fmt.Errorf("GETKEYSINSLOT on member %s: %w", from, err)
		}
		keys, _ := v.([]any)
		if len(keys) == 0 {
			break
		}
		k, _ := keys[0].(string)
		// A key that expires between GETKEYSINSLOT and MIGRATE: NOKEY.
		// MIGRATE waits up to its own timeout (5 s) for the target; the
		// exchange gets that and more, or a loaded machine fails it
		// while the key is in flight.
		if _, err := redisDoWithin(ctx, src, migrateBound, "MIGRATE", host, port, k, "0", "5000"); err != nil && !strings.HasPrefix(err.Error(), "NOKEY") {
			return from, fmt.Errorf("MIGRATE %q from member %s: %w", k, from, err)
		}
		if err := wait(); err != nil {
			return from, err
		}
	}
	// The target first: once it owns the slot, the source's redirections
	// (and then its MOVED) all lead there.
	if _, err := redisDo(ctx, dst, "CLUSTER", "SETSLOT", sl, "NODE", dstID); err != nil {
		return from, fmt.Errorf("SETSLOT NODE on member %s: %w", to, err)
	}
	if _, err := redisDo(ctx, src, "CLUSTER", "SETSLOT", sl, "NODE", dstID); err != nil {
		return from, fmt.Errorf("SETSLOT NODE on member %s: %w", from, err)
	}
	var errs []error
	for _, id := range u.srv.members {
		if id == from || id == to || !u.active(id) {
			continue
		}
		if role, _ := redisDo(ctx, u.srv.addr(u, id), "ROLE"); roleName(role) != "master" {
			continue
		}
		if _, err := redisDo(ctx, u.srv.addr(u, id), "CLUSTER", "SETSLOT", sl, "NODE", dstID); err != nil {
			errs = append(errs, fmt.Errorf("SETSLOT NODE on member %s: %w", id, err))
		}
	}
	u.e.logf("%s: slot %d moved from member %s to member %s", name, slot, from, to)
	return from, errors.Join(errs...)
}

// roleName is the first element of a ROLE reply.
func roleName(v any) string {
	if a, ok := v.([]any); ok && len(a) > 0 {
		s, _ := a[0].(string)
		return s
	}
	return ""
}

// Masters returns the members of the Redis Cluster name that serve slots
// now, in member order.
func (e *Env) Masters(ctx context.Context, name string) ([]string, error) {
	u, err := e.redisCluster(name)
	if err != nil {
		return nil, err
	}
	for _, id := range u.srv.members {
		if !u.active(id) {
			continue
		}
		nodes, err := redisClusterNodes(ctx, u.srv.addr(u, id))
		if err != nil {
			continue
		}
		var out []string
		for _, m := range u.srv.members {
			for _, n := range nodes {
				if n.addr == u.srv.addr(u, m) && n.master && !n.fail && len(n.slots) > 0 {
					out = append(out, m)
				}
			}
		}
		return out, nil
	}
	return nil, ErrNotRunning
}
