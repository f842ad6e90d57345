// Package cluster lets the safety harness inject store faults into servers
// that the test environment (internal/testenv, docs/testenv.md) started:
// kill -9, restart, stop and start of one member of a loopback cluster
// (etcd3, zookeeper3, redisha, nats3), finding its current leader or primary, and
// pausing a whole server or one member with SIGSTOP/SIGCONT.
//
// Every method acts in-process, through package internal/testenv, on one
// state dir, so the processes it touches are exactly the ones testenv
// started there and never a server of someone else. The clusters are not
// part of the default `scripts/testenv up` set; the safety runner (or a
// developer) starts them by name:
//
//	out=$(scripts/testenv up etcd3 zookeeper3 redisha) && eval "$out"
//
// after which FromEnv finds them, or with Up from Go.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/faultproxy"
	"github.com/fencelock/fencelock/internal/testenv"
)

// Names of the loopback clusters testenv can start.
const (
	// Etcd3 is a 3-member etcd cluster, members "1" "2" "3"; its URL is
	// etcd://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3.
	Etcd3 = "etcd3"
	// ZooKeeper3 is a 3-node ZooKeeper ensemble, members "1" "2" "3"; its
	// URL is zk://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3.
	ZooKeeper3 = "zookeeper3"
	// RedisHA is a Redis primary ("1" at first) and its replica ("2"),
	// watched by one Sentinel (member "sentinel"), which promotes the
	// replica when the primary dies; its URL names the Sentinel:
	// redis+sentinel://127.0.0.1:S/fencelock/0.
	RedisHA = "redisha"
	// NATS3 is a cluster of three NATS servers with JetStream, members
	// "1" "2" "3"; its URL names all three with replicas=3:
	// nats://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3?replicas=3. Its
	// leader is the leader of the default bucket's stream (KV_fencelock),
	// which orders every lock write.
	NATS3 = "nats3"
	// RedisCluster is a Redis Cluster of three masters ("1" "2" "3" at
	// first) with a replica each ("4" "5" "6"); its URL names all six:
	// redis+cluster://127.0.0.1:P1,…,127.0.0.1:P6. SlotMaster names the
	// master of a key's slot, MigrateSlot moves a slot live.
	RedisCluster = "rediscluster"
)

// StateEnv names the state dir of the running servers
// (FENCELOCK_TESTENV_STATE).
const StateEnv = testenv.StateEnv

// Errors reported by Testenv's methods; test for them with errors.Is.
var (
	// ErrNoState: FENCELOCK_TESTENV_STATE is not set (or not a state dir),
	// so no server was started by testenv and none may be killed or paused.
	ErrNoState = testenv.ErrNoState
	// ErrNotStarted: the server was never started in this state dir.
	ErrNotStarted = testenv.ErrNotStarted
	// ErrNotRunning: the server or member is not running.
	ErrNotRunning = testenv.ErrNotRunning
	// ErrNoLeader: no member of the cluster is leader (primary) right now,
	// e.g. during an election.
	ErrNoLeader = testenv.ErrNoLeader
)

// Testenv acts on the servers of one state dir. Its methods may be called
// concurrently; each returns when its action has finished.
type Testenv struct {
	// State is the state dir (FENCELOCK_TESTENV_STATE) of the servers.
	State string

	urls  map[string]string // set by Up
	links *peerLinks        // set by UpWithPeerLinks
}

// FromEnv returns the Testenv of the state dir named by
// FENCELOCK_TESTENV_STATE. It fails with ErrNoState when none is set.
func FromEnv() (*Testenv, error) {
	e, err := testenv.FromEnv()
	if err != nil {
		return nil, err
	}
	return &Testenv{State: e.State}, nil
}

// EnvVar returns the environment variable holding the URL of a server or
// cluster started by testenv: FENCELOCK_TEST_ETCD3 for Etcd3.
func EnvVar(name string) string { return testenv.EnvVar(name) }

// Up starts the named servers or clusters in a new state dir of their own
// (variables of the caller's environment that name other servers for them
// are ignored) and returns its Testenv, whose URL method gives their URLs.
// Progress goes to stderr. The caller must call Down. Under CI=true a
// server that cannot be started is an error; otherwise it is left out and
// URL returns "" for it.
func Up(ctx context.Context, names ...string) (*Testenv, error) {
	if len(names) == 0 {
		return nil, errors.New("cluster: Up needs at least one name")
	}
	return up(ctx, nil, names...)
}

// UpWithPeerLinks is Up, with every link between two members of a
// ZooKeeper3 ensemble (quorum and election ports, each direction)
// through a proxy of this process, so that Partition can cut one member
// off from its peers while its clients still reach it. The proxies live
// as long as this process: such a cluster cannot outlive it (Down closes
// them). Other clusters are started as Up starts them.
func UpWithPeerLinks(ctx context.Context, names ...string) (*Testenv, error) {
	if len(names) == 0 {
		return nil, errors.New("cluster: UpWithPeerLinks needs at least one name")
	}
	return up(ctx, &peerLinks{byMember: map[string][]*faultproxy.Proxy{}}, names...)
}

func up(ctx context.Context, links *peerLinks, names ...string) (*Testenv, error) {
	cfg := testenv.Config{CI: testenv.IsCI(), Log: os.Stderr}
	if links != nil {
		cfg.PeerAddr = links.add
	}
	e, vars, err := testenv.Up(ctx, cfg, names...)
	if err != nil {
		links.close()
		return nil, err
	}
	t := &Testenv{State: e.State, urls: map[string]string{}, links: links}
	for _, n := range names {
		t.urls[n] = ""
	}
	for _, v := range vars {
		for _, n := range names {
			if v.Name == EnvVar(n) {
				t.urls[n] = v.Value
			}
		}
	}
	return t, nil
}

// env opens the state dir.
func (t *Testenv) env() (*testenv.Env, error) {
	if t == nil || t.State == "" {
		return nil, ErrNoState
	}
	return testenv.Open(t.State)
}

// Down stops every server of the state dir and removes it. Use it for a
// Testenv made by Up, not for servers someone else started.
func (t *Testenv) Down(ctx context.Context) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	_, err = e.Down(ctx)
	t.links.close()
	return err
}

// URL returns the URL of the named server or cluster: the one Up reported,
// or else the value of its environment variable (EnvVar), "" if unset.
func (t *Testenv) URL(name string) string {
	if u, ok := t.urls[name]; ok {
		return u
	}
	return os.Getenv(EnvVar(name))
}

// Kill kills member of cluster name with SIGKILL, with all its processes,
// and returns once they are gone. Killing a member that is not running
// does nothing.
func (t *Testenv) Kill(ctx context.Context, name, member string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.KillMember(ctx, name, member)
}

// Start starts a stopped or killed member with its ports and data, and
// returns once it serves requests (an etcd member that sees a leader, a
// ZooKeeper node that leads or follows, a Redis server that answers PING).
func (t *Testenv) Start(ctx context.Context, name, member string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.StartMember(ctx, name, member)
}

// Stop stops a member gracefully (SIGTERM; SIGKILL after 20 s).
func (t *Testenv) Stop(ctx context.Context, name, member string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.StopMember(ctx, name, member)
}

// Restart is Kill, then Start.
func (t *Testenv) Restart(ctx context.Context, name, member string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.RestartMember(ctx, name, member)
}

// RestartServer kills a single server (not a cluster) with SIGKILL and
// starts it again with its port and data.
func (t *Testenv) RestartServer(ctx context.Context, name string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.Restart(ctx, name)
}

// Owns reports whether url is the URL testenv recorded for its server name
// in this state dir: only such a server may be killed or paused (a
// developer's own server never is).
func (t *Testenv) Owns(name, url string) bool {
	e, err := t.env()
	return err == nil && e.Owns(name, url)
}

// Leader returns the ID of the member that is the cluster's leader (etcd's
// raft leader, ZooKeeper's leader, the Redis primary as the Sentinel names
// it) right now, asking only members that run and are not paused. It fails
// with ErrNoLeader when there is none, e.g. during an election.
func (t *Testenv) Leader(ctx context.Context, name string) (string, error) {
	e, err := t.env()
	if err != nil {
		return "", err
	}
	return e.Leader(ctx, name)
}

// WaitLeader polls Leader every 50 ms until a member other than those in
// not is leader, and returns its ID; it gives up when ctx ends. Use it
// after killing or pausing the leader.
func (t *Testenv) WaitLeader(ctx context.Context, name string, not ...string) (string, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		id, err := t.Leader(ctx, name)
		switch {
		case err == nil:
			if !slices.Contains(not, id) {
				return id, nil
			}
		case !errors.Is(err, ErrNoLeader):
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("cluster: waiting for a new leader of %s: %w", name, ctx.Err())
		case <-tick.C:
		}
	}
}

// Failover asks the cluster to move leadership to another member while all
// run, and returns once a new leader serves. RedisHA (SENTINEL FAILOVER),
// the PostgreSQL clusters (a switchover) and NATS3 (a stepdown of the
// bucket stream's leader) have it.
func (t *Testenv) Failover(ctx context.Context, name string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.Failover(ctx, name)
}

// Pause stops the server of a backend (all members of a cluster) with
// SIGSTOP, all its processes, and returns once every one is stopped. It
// fails with ErrNotRunning if a server or member is not running. Pausing a
// paused server does nothing.
func (t *Testenv) Pause(ctx context.Context, name string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.Pause(ctx, name)
}

// Resume continues what Pause stopped (SIGCONT) and returns once every
// process runs again. Resuming a running server does nothing.
func (t *Testenv) Resume(ctx context.Context, name string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.Resume(ctx, name)
}

// PauseMember is Pause for one member of a cluster.
func (t *Testenv) PauseMember(ctx context.Context, name, member string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.PauseMember(ctx, name, member)
}

// ResumeMember is Resume for one member of a cluster.
func (t *Testenv) ResumeMember(ctx context.Context, name, member string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.ResumeMember(ctx, name, member)
}

// PID returns the process ID of a backend's server (not a cluster's: use
// MemberPID), or ErrNotRunning.
func (t *Testenv) PID(ctx context.Context, name string) (int, error) {
	e, err := t.env()
	if err != nil {
		return 0, err
	}
	return e.PID(name)
}

// MemberPID returns the process ID of a member of a cluster, or
// ErrNotRunning.
func (t *Testenv) MemberPID(ctx context.Context, name, member string) (int, error) {
	e, err := t.env()
	if err != nil {
		return 0, err
	}
	return e.MemberPID(name, member)
}

// Addr returns the client address (host:port) of a member of a cluster,
// running or not.
func (t *Testenv) Addr(ctx context.Context, name, member string) (string, error) {
	e, err := t.env()
	if err != nil {
		return "", err
	}
	return e.Addr(name, member)
}

// State is what a member is doing.
type State = testenv.State

// States of a member.
const (
	Running = testenv.Running
	Paused  = testenv.Paused  // stopped by SIGSTOP
	Stopped = testenv.Stopped // not running (killed, stopped, or exited)
)

// Member describes one member of a cluster: ID, State, PID (0 when
// Stopped) and Addr (client address, host:port).
type Member = testenv.Member

// Members lists the members of a cluster in order.
func (t *Testenv) Members(ctx context.Context, name string) ([]Member, error) {
	e, err := t.env()
	if err != nil {
		return nil, err
	}
	return e.Members(name)
}

// SlotOf returns the Redis Cluster hash slot of a Redis key (CLUSTER
// KEYSLOT) on the Redis Cluster name.
func (t *Testenv) SlotOf(ctx context.Context, name, key string) (int, error) {
	e, err := t.env()
	if err != nil {
		return 0, err
	}
	return e.SlotOf(ctx, name, key)
}

// SlotMaster returns the member of the Redis Cluster name that serves
// slot now, or ErrNoLeader while none does (its master died and no
// replica has taken over yet).
func (t *Testenv) SlotMaster(ctx context.Context, name string, slot int) (string, error) {
	e, err := t.env()
	if err != nil {
		return "", err
	}
	return e.SlotMaster(ctx, name, slot)
}

// Masters returns the members of the Redis Cluster name that serve
// slots now.
func (t *Testenv) Masters(ctx context.Context, name string) ([]string, error) {
	e, err := t.env()
	if err != nil {
		return nil, err
	}
	return e.Masters(ctx, name)
}

// MigrateSlot moves slot of the Redis Cluster name to the master member
// to, live (SETSLOT IMPORTING and MIGRATING, MIGRATE key by key, SETSLOT
// NODE), waiting step after each stage and key, and returns the member
// it left.
func (t *Testenv) MigrateSlot(ctx context.Context, name string, slot int, to string, step time.Duration) (string, error) {
	e, err := t.env()
	if err != nil {
		return "", err
	}
	return e.MigrateSlot(ctx, name, slot, to, step)
}

// ErrNoPeerLinks: the cluster's member links do not go through proxies of
// this process (it was not started by UpWithPeerLinks, or is not
// ZooKeeper3), so no member can be partitioned from its peers.
var ErrNoPeerLinks = errors.New("cluster: the members' peer links do not go through proxies of this process (start the cluster with UpWithPeerLinks)")

// peerLinks are the proxies of UpWithPeerLinks, by cluster and member:
// every proxy a link of that member goes through, either direction.
type peerLinks struct {
	mu       sync.Mutex
	byMember map[string][]*faultproxy.Proxy // "cluster/member"
	all      []*faultproxy.Proxy
}

// add is testenv.Config.PeerAddr: a proxy for the link from → to.
func (l *peerLinks) add(server, from, to, kind, target string) (string, error) {
	p, err := faultproxy.Listen(target)
	if err != nil {
		return "", err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, p)
	for _, m := range []string{from, to} {
		l.byMember[server+"/"+m] = append(l.byMember[server+"/"+m], p)
	}
	return p.Addr(), nil
}

func (l *peerLinks) member(name, member string) []*faultproxy.Proxy {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byMember[name+"/"+member]
}

func (l *peerLinks) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	all := l.all
	l.all, l.byMember = nil, map[string][]*faultproxy.Proxy{}
	l.mu.Unlock()
	for _, p := range all {
		_ = p.Close()
	}
}

// Partitionable reports whether Partition can cut the members of cluster
// name off from their peers.
func (t *Testenv) Partitionable(name string) bool {
	if t == nil {
		return false
	}
	ms, err := t.Members(context.Background(), name)
	if err != nil || len(ms) == 0 {
		return false
	}
	return len(t.links.member(name, ms[0].ID)) > 0
}

// Partition cuts member off from every other member of cluster name: the
// proxies of its quorum and election links, both directions, hold every
// byte from now on (a network partition TCP has not given up on yet).
// The member runs on and its clients still reach it. It fails with
// ErrNoPeerLinks unless the cluster was started by UpWithPeerLinks.
func (t *Testenv) Partition(ctx context.Context, name, member string) error {
	ps := t.links.member(name, member)
	if len(ps) == 0 {
		return ErrNoPeerLinks
	}
	for _, p := range ps {
		p.SetMode(faultproxy.Blackhole)
	}
	return ctx.Err()
}

// Heal ends a Partition of member: its links' connections, which the
// members gave up on while cut, are reset, and new ones pass. It returns
// at once; the member rejoins its peers by itself (WaitReady waits for
// that).
func (t *Testenv) Heal(ctx context.Context, name, member string) error {
	ps := t.links.member(name, member)
	if len(ps) == 0 {
		return ErrNoPeerLinks
	}
	for _, p := range ps {
		p.SetMode(faultproxy.Reset)
	}
	for _, p := range ps {
		p.SetMode(faultproxy.Pass)
	}
	return ctx.Err()
}

// WaitReady returns once the cluster name passes its readiness probe
// again (every member serves and one leads; a Redis cluster's replicas
// are linked to their primaries), or fails when ctx ends.
func (t *Testenv) WaitReady(ctx context.Context, name string) error {
	e, err := t.env()
	if err != nil {
		return err
	}
	return e.WaitReady(ctx, name)
}
