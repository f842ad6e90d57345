package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ---------------------------------------------------------------- etcd3

// etcd3: three tools/etcd-test-server members (1 2 3) with
// -initial-cluster naming all peers; heartbeat 100 ms, election timeout
// 1 s. Data in etcd3/ID/data.
// URL: etcd://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3

func etcd3Server() *server {
	s := &server{name: "etcd3", members: []string{"1", "2", "3"}, packages: noPackages}
	addr := func(u *unit, id string) string { return hostPort(u.port("ETCD_CLIENT_PORT_" + id)) }
	s.install = func(ctx context.Context, u *unit) error { return u.buildEtcd(ctx) }
	s.init = func(ctx context.Context, u *unit) error {
		var peers []string
		for _, id := range s.members {
			if _, err := u.savePort("ETCD_CLIENT_PORT_" + id); err != nil {
				return err
			}
			p, err := u.savePort("ETCD_PEER_PORT_" + id)
			if err != nil {
				return err
			}
			peers = append(peers, fmt.Sprintf("m%s=http://127.0.0.1:%d", id, p))
			_ = os.RemoveAll(u.mdir(id))
			if err := os.MkdirAll(u.mdir(id), 0o755); err != nil {
				return err
			}
		}
		return u.save("ETCD_INITIAL_CLUSTER", strings.Join(peers, ","))
	}
	s.start = func(u *unit, id string) error {
		// -start-timeout 0: a member started while its peers are down waits for them.
		return u.spawn(id, nil, u.get("ETCD_BIN"), "--data-dir", filepath.Join(u.mdir(id), "data"), "--name", "m"+id,
			"--client-port", u.get("ETCD_CLIENT_PORT_"+id), "--peer-port", u.get("ETCD_PEER_PORT_"+id),
			"--initial-cluster", u.get("ETCD_INITIAL_CLUSTER"), "--initial-cluster-token", "fencelock-etcd3",
			"--start-timeout", "0")
	}
	s.memberReady = func(ctx context.Context, u *unit, id string) error { return etcdHealth(ctx, addr(u, id)) }
	s.ready = func(ctx context.Context, u *unit) error {
		for _, id := range s.members {
			if err := etcdHealth(ctx, addr(u, id)); err != nil {
				return fmt.Errorf("member %s: %w", id, err)
			}
		}
		return nil
	}
	s.addr = addr
	s.url = func(u *unit) string { return "etcd://" + joinAddrs(u, s.members, addr) }
	// The member that reports itself raft leader; paused and dead members
	// are not asked.
	s.leader = func(ctx context.Context, u *unit) (string, error) {
		for _, id := range s.members {
			if !u.active(id) {
				continue
			}
			if ok, err := etcdIsLeader(ctx, addr(u, id)); err == nil && ok {
				return id, nil
			}
		}
		return "", ErrNoLeader
	}
	s.version = func(ctx context.Context, u *unit) string { return etcdVersion(ctx, addr(u, "1")) }
	return s
}

func joinAddrs(u *unit, ids []string, addr func(*unit, string) string) string {
	var as []string
	for _, id := range ids {
		as = append(as, addr(u, id))
	}
	return strings.Join(as, ",")
}

// ---------------------------------------------------------------- zookeeper3

// zookeeper3: three QuorumPeerMain nodes (1 2 3) of the zookeeper install;
// tickTime=200, syncLimit=5, election notifications at most every second;
// heap at most 256 MiB. Data (and myid) in zookeeper3/ID/data, config
// zookeeper3/ID/zoo.cfg.
// URL: zk://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3

func zookeeper3Server() *server {
	s := &server{name: "zookeeper3", members: []string{"1", "2", "3"}, packages: zkPackages, install: zkInstall}
	addr := func(u *unit, id string) string { return hostPort(u.port("ZK_CLIENT_PORT_" + id)) }
	s.init = func(ctx context.Context, u *unit) error {
		for _, id := range s.members {
			for _, k := range []string{"CLIENT", "QUORUM", "ELECTION"} {
				if _, err := u.savePort("ZK_" + k + "_PORT_" + id); err != nil {
					return err
				}
			}
		}
		// serversOf are the server.N lines of node from's zoo.cfg: its own
		// peer ports, and the others' as Config.PeerAddr gives them.
		serversOf := func(from string) (string, error) {
			var servers strings.Builder
			for _, id := range s.members {
				q, el := hostPort(u.port("ZK_QUORUM_PORT_"+id)), hostPort(u.port("ZK_ELECTION_PORT_"+id))
				if id != from && u.e.peerAddr != nil {
					var err error
					if q, err = u.e.peerAddr(s.name, from, id, "quorum", q); err != nil {
						return "", err
					}
					if el, err = u.e.peerAddr(s.name, from, id, "election", el); err != nil {
						return "", err
					}
				}
				fmt.Fprintf(&servers, "server.%s=%s:%s\n", id, q, el[strings.LastIndex(el, ":")+1:])
			}
			return servers.String(), nil
		}
		conf := filepath.Join(u.dir, "conf")
		_ = os.RemoveAll(conf)
		if err := os.MkdirAll(conf, 0o755); err != nil {
			return err
		}
		for _, id := range s.members {
			servers, err := serversOf(id)
			if err != nil {
				return err
			}
			data := filepath.Join(u.mdir(id), "data")
			_ = os.RemoveAll(u.mdir(id))
			if err := os.MkdirAll(data, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(data, "myid"), []byte(id+"\n"), 0o644); err != nil {
				return err
			}
			cfg := fmt.Sprintf(`# made by fencelock testenv (zookeeper3, node %s)
tickTime=200
initLimit=50
syncLimit=5
minSessionTimeout=400
maxSessionTimeout=60000
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
extendedTypesEnabled=true
autopurge.purgeInterval=0
reconfigEnabled=false
standaloneEnabled=false
cnxTimeout=1000
%s`, id, data, u.port("ZK_CLIENT_PORT_"+id), servers)
			if err := os.WriteFile(filepath.Join(u.mdir(id), "zoo.cfg"), []byte(cfg), 0o644); err != nil {
				return err
			}
		}
		return os.WriteFile(filepath.Join(conf, "log4j.properties"), []byte(zkLog4j), 0o644)
	}
	s.start = func(u *unit, id string) error {
		return u.spawn(id, nil, u.get("ZK_JAVA"), "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
			"-XX:-UsePerfData", "-Djava.awt.headless=true",
			"-Dlog4j.configuration=file:"+filepath.Join(u.dir, "conf", "log4j.properties"),
			"-Dzookeeper.admin.enableServer=false", "-Dzookeeper.extendedTypesEnabled=true",
			"-Dzookeeper.4lw.commands.whitelist=*", "-Dzookeeper.fastleader.maxNotificationInterval=1000",
			"-cp", zkClasspath(u), "org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(u.mdir(id), "zoo.cfg"))
	}
	s.memberReady = func(ctx context.Context, u *unit, id string) error {
		mode, err := zkMode(ctx, addr(u, id))
		if err == nil && mode != "leader" && mode != "follower" {
			err = fmt.Errorf("mode %s", mode)
		}
		return err
	}
	s.ready = func(ctx context.Context, u *unit) error {
		leaders := 0
		for _, id := range s.members {
			mode, err := zkMode(ctx, addr(u, id))
			switch {
			case err != nil:
				return fmt.Errorf("node %s: %w", id, err)
			case mode == "leader":
				leaders++
			case mode != "follower":
				return fmt.Errorf("node %s: mode %s", id, mode)
			}
		}
		if leaders != 1 {
			return fmt.Errorf("%d leaders", leaders)
		}
		return nil
	}
	s.addr = addr
	s.url = func(u *unit) string { return "zk://" + joinAddrs(u, s.members, addr) }
	s.leader = func(ctx context.Context, u *unit) (string, error) {
		for _, id := range s.members {
			if !u.active(id) {
				continue
			}
			if mode, err := zkMode(ctx, addr(u, id)); err == nil && mode == "leader" {
				return id, nil
			}
		}
		return "", ErrNoLeader
	}
	s.version = func(ctx context.Context, u *unit) string { return zkVersion(ctx, addr(u, "1")) }
	return s
}

// ---------------------------------------------------------------- redisha

// redisha: a Redis primary (member 1 at first), its replica (2) and one
// Sentinel (member sentinel), all redis-server, AOF with appendfsync
// always. Master name fencelock, quorum 1, down-after-milliseconds 1000,
// failover-timeout 5000. Replication is asynchronous.
// URL: redis+sentinel://127.0.0.1:SENTINEL/fencelock/0

const redishaMaster = "fencelock"

func redishaServer() *server {
	s := &server{name: "redisha", members: []string{"1", "2", "sentinel"}}
	addr := func(u *unit, id string) string { return hostPort(u.port("REDISHA_PORT_" + id)) }
	redis := servers["redis"]
	if redis == nil {
		redis = redisServer("redis", false)
	}
	s.packages = redis.packages
	s.install = redis.install
	s.init = func(ctx context.Context, u *unit) error {
		for _, id := range s.members {
			if _, err := u.savePort("REDISHA_PORT_" + id); err != nil {
				return err
			}
			_ = os.RemoveAll(u.mdir(id))
			if err := os.MkdirAll(filepath.Join(u.mdir(id), "data"), 0o755); err != nil {
				return err
			}
		}
		for _, id := range []string{"1", "2"} {
			conf := fmt.Sprintf(`# made by fencelock testenv (redisha, member %s)
port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
logfile ""
save ""
appendonly yes
appendfsync always
repl-diskless-sync yes
repl-diskless-sync-delay 0
`, id, u.port("REDISHA_PORT_"+id), filepath.Join(u.mdir(id), "data"))
			if id == "2" {
				conf += fmt.Sprintf("replicaof 127.0.0.1 %d\n", u.port("REDISHA_PORT_1"))
			}
			if err := os.WriteFile(filepath.Join(u.mdir(id), "redis.conf"), []byte(conf), 0o644); err != nil {
				return err
			}
		}
		conf := fmt.Sprintf(`# made by fencelock testenv (redisha sentinel)
port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
logfile ""
sentinel monitor %s 127.0.0.1 %d 1
sentinel down-after-milliseconds %[3]s 1000
sentinel failover-timeout %[3]s 5000
sentinel parallel-syncs %[3]s 1
# Known from the start: the Sentinel would learn of it from the primary's INFO
# only every 10 s.
sentinel known-replica %[3]s 127.0.0.1 %[5]d
`, u.port("REDISHA_PORT_sentinel"), filepath.Join(u.mdir("sentinel"), "data"), redishaMaster,
			u.port("REDISHA_PORT_1"), u.port("REDISHA_PORT_2"))
		return os.WriteFile(filepath.Join(u.mdir("sentinel"), "sentinel.conf"), []byte(conf), 0o644)
	}
	s.start = func(u *unit, id string) error {
		if id == "sentinel" {
			return u.spawn(id, nil, u.get("REDIS_BIN"), filepath.Join(u.mdir(id), "sentinel.conf"), "--sentinel")
		}
		return u.spawn(id, nil, u.get("REDIS_BIN"), filepath.Join(u.mdir(id), "redis.conf"))
	}
	s.memberReady = func(ctx context.Context, u *unit, id string) error { return redisPing(ctx, addr(u, id)) }
	// sentinelMaster is the member the Sentinel names as primary.
	sentinelMaster := func(ctx context.Context, u *unit) (string, error) {
		v, err := redisDo(ctx, addr(u, "sentinel"), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", redishaMaster)
		if err != nil {
			return "", err
		}
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			return "", fmt.Errorf("the Sentinel names no primary (%v)", v)
		}
		for _, id := range []string{"1", "2"} {
			if a[1] == u.get("REDISHA_PORT_"+id) {
				return id, nil
			}
		}
		return "", fmt.Errorf("the Sentinel names %v, not a member", a)
	}
	role := func(ctx context.Context, u *unit, id string) string {
		v, err := redisDo(ctx, addr(u, id), "ROLE")
		if a, ok := v.([]any); err == nil && ok && len(a) > 0 {
			if s, ok := a[0].(string); ok {
				return s
			}
		}
		return ""
	}
	// ready: the Sentinel names a primary that says so, and sees the
	// replica up with its link to the primary up, so that it can promote it.
	s.ready = func(ctx context.Context, u *unit) error {
		p, err := sentinelMaster(ctx, u)
		if err != nil {
			return err
		}
		r := map[string]string{"1": "2", "2": "1"}[p]
		if role(ctx, u, p) != "master" {
			return fmt.Errorf("member %s is not master yet", p)
		}
		info, err := redisDo(ctx, addr(u, r), "INFO", "replication")
		if s, _ := info.(string); err != nil || !strings.Contains(s, "role:slave") || !strings.Contains(s, "master_link_status:up") {
			return fmt.Errorf("replica %s not linked yet", r)
		}
		v, err := redisDo(ctx, addr(u, "sentinel"), "SENTINEL", "REPLICAS", redishaMaster)
		if err != nil {
			return err
		}
		reps, _ := v.([]any)
		if len(reps) != 1 {
			return fmt.Errorf("the Sentinel sees %d replicas", len(reps))
		}
		kv, _ := reps[0].([]any)
		fields := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			if k, ok := kv[i].(string); ok {
				fields[k] = kv[i+1]
			}
		}
		if fields["flags"] != "slave" || fields["master-link-status"] != "ok" {
			return fmt.Errorf("the Sentinel sees the replica as %v, link %v", fields["flags"], fields["master-link-status"])
		}
		return nil
	}
	s.addr = addr
	s.url = func(u *unit) string {
		return fmt.Sprintf("redis+sentinel://%s/%s/0", addr(u, "sentinel"), redishaMaster)
	}
	// leader: the primary as the Sentinel names it (what clients of the
	// URL use), if that member runs, is not paused and says it is master.
	s.leader = func(ctx context.Context, u *unit) (string, error) {
		id, err := sentinelMaster(ctx, u)
		if err != nil || !u.active(id) || role(ctx, u, id) != "master" {
			return "", ErrNoLeader
		}
		return id, nil
	}
	s.failover = func(ctx context.Context, u *unit) error {
		old, err := s.leader(ctx, u)
		if err != nil {
			return errors.New("testenv: redisha: no primary now, nothing to fail over")
		}
		v, err := redisDo(ctx, addr(u, "sentinel"), "SENTINEL", "FAILOVER", redishaMaster)
		if err != nil || v != "OK" {
			return fmt.Errorf("testenv: redisha: SENTINEL FAILOVER: %v %v", v, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if id, err := s.leader(ctx, u); err == nil && id != old {
				u.e.logf("redisha: primary is now member %s (was %s)", id, old)
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * pollInterval):
			}
		}
		return errors.New("testenv: redisha: no new primary after 30s")
	}
	s.version = func(ctx context.Context, u *unit) string { return cmdOutput(ctx, u.get("REDIS_BIN"), "--version") }
	return s
}

// WaitReady returns once a started server or cluster passes its readiness
// probe again: for a cluster every member serves and one leads, and
// redisha's replica and the PostgreSQL clusters' standby are linked to
// the primary. It fails if a member exits or after Timeout. Use it after
// a fault that the cluster heals by itself (a killed primary started
// again becomes a replica or standby).
func (e *Env) WaitReady(ctx context.Context, name string) error {
	u, err := e.started(name)
	if err != nil {
		return err
	}
	return u.waitReady(ctx, e.Timeout)
}
