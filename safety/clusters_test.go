package safety

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/safety/cluster"
	"github.com/fencelock/fencelock/safety/suite"
)

// The loopback clusters (scripts/testenv etcd3, zookeeper3, redisha,
// postgresha, postgresha-sync), after the single servers. ZooKeeper's TTL
// is its session timeout: 2s lets a session move to a surviving node
// after its server died. redisha-acked is redisha with replica-acknowledged
// grants (clusterVariants).
var clusterDefs = []backendDef{
	{cluster.Etcd3, "FENCELOCK_TEST_ETCD3", 2 * time.Second, 700 * time.Millisecond},
	{cluster.ZooKeeper3, "FENCELOCK_TEST_ZOOKEEPER3", 2 * time.Second, 700 * time.Millisecond},
	{cluster.RedisHA, "FENCELOCK_TEST_REDISHA", time.Second, 300 * time.Millisecond},
	{redisHAAcked, "FENCELOCK_TEST_REDISHA", time.Second, 300 * time.Millisecond},
	{postgresHA, "FENCELOCK_TEST_POSTGRESHA", time.Second, 300 * time.Millisecond},
	{postgresHASync, "FENCELOCK_TEST_POSTGRESHA_SYNC", time.Second, 300 * time.Millisecond},
	{cluster.NATS3, "FENCELOCK_TEST_NATS3", 2 * time.Second, 700 * time.Millisecond},
	{cluster.RedisCluster, "FENCELOCK_TEST_REDISCLUSTER", time.Second, 300 * time.Millisecond},
	{redisClusterAcked, "FENCELOCK_TEST_REDISCLUSTER", time.Second, 300 * time.Millisecond},
}

// Rows of clusterDefs beyond package cluster's names.
const (
	// redisHAAcked is redisha with wait_replicas=1: a grant or renewal
	// counts only once the replica acknowledged it (WAIT).
	redisHAAcked = "redisha-acked"
	// postgresHA is a PostgreSQL primary with an asynchronous streaming
	// standby; postgresHASync the same with a synchronous one
	// (synchronous_commit = remote_apply).
	postgresHA     = "postgresha"
	postgresHASync = "postgresha-sync"
)

// redisClusterAcked is rediscluster with wait_replicas=1: a grant or
// renewal counts only once the master's replica acknowledged it.
const redisClusterAcked = "rediscluster-acked"

// clusterVariants are rows that run on another row's cluster, with URL
// parameters of their own: the cluster's testenv name and the parameters.
var clusterVariants = map[string]struct{ server, params string }{
	redisHAAcked:      {cluster.RedisHA, "wait_replicas=1&wait_timeout=250ms"},
	redisClusterAcked: {cluster.RedisCluster, "wait_replicas=1&wait_timeout=250ms"},
}

// serverOf is the testenv cluster a row runs on.
func serverOf(name string) string {
	if v, ok := clusterVariants[name]; ok {
		return v.server
	}
	return name
}

// Names of the clusters' failover cells (suite.Control.FailoverName).
const (
	fLeaderKill = "leader-kill"
	fFailover   = "primary-kill-failover"
)

// clusterSet finds the clusters, starting each with scripts/testenv (in
// a state dir of its own) when its variable is not set and a row that
// needs it runs, once per run. Its methods may be called concurrently.
type clusterSet struct {
	envOnce sync.Once
	env     *cluster.Testenv // the state dir of clusters named by the environment

	mu      sync.Mutex
	servers map[string]*startedCluster // by testenv name
}

// startedCluster is one cluster this run starts.
type startedCluster struct {
	once sync.Once
	te   *cluster.Testenv // Down at the end
	err  error
}

// get returns the URL of a cluster and the Testenv that controls its
// members (nil when the cluster is not one scripts/testenv started). It
// skips the test when the cluster is not available, or fails it under
// CI.
func (s *clusterSet) get(t *testing.T, def backendDef) (string, *cluster.Testenv) {
	t.Helper()
	s.envOnce.Do(func() {
		if env, err := cluster.FromEnv(); err == nil {
			s.env = env
		}
	})
	server := serverOf(def.name)
	url := os.Getenv(def.envVar)
	ct := s.env
	var startErr error
	if url == "" {
		s.mu.Lock()
		if s.servers == nil {
			s.servers = map[string]*startedCluster{}
		}
		sc := s.servers[server]
		if sc == nil {
			sc = &startedCluster{}
			s.servers[server] = sc
		}
		s.mu.Unlock()
		sc.once.Do(func() {
			t.Logf("safety: starting loopback cluster %s with scripts/testenv", server)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			up := cluster.Up
			if server == cluster.ZooKeeper3 {
				up = cluster.UpWithPeerLinks // for suite.FaultFollowerPartitioned
			}
			sc.te, sc.err = up(ctx, server)
		})
		if sc.te != nil {
			url, ct = sc.te.URL(server), sc.te
		}
		startErr = sc.err
	}
	if v, ok := clusterVariants[def.name]; ok && url != "" {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		url += sep + v.params
	}
	if url == "" {
		msg := def.envVar + " is not set and scripts/testenv could not start " + server
		if startErr != nil {
			msg += ": " + startErr.Error()
		}
		if ci := os.Getenv("CI"); ci == "true" || ci == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return url, ct
}

// down stops the clusters this run started.
func (s *clusterSet) down(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, sc := range s.servers {
		if sc.te == nil {
			continue
		}
		if err := sc.te.Down(ctx); err != nil {
			t.Errorf("stopping cluster %s: %v", name, err)
		}
	}
}

// clusterControl is the failover fault of a cluster (suite.FaultFailover):
// its leader (or primary) killed with SIGKILL while contenders hold locks,
// a new one elected, and the old one started again. It is nil when the
// cluster was not started by scripts/testenv (ct nil).
func clusterControl(ct *cluster.Testenv, name string) *suite.Control {
	if ct == nil {
		return nil
	}
	row, name := name, serverOf(name)
	fault, setup := fLeaderKill, "3 members; the leader killed (kill -9), a new one elected, the old one started again"
	switch row {
	case cluster.RedisHA:
		fault, setup = fFailover, "primary + replica + Sentinel; the primary killed (kill -9), the replica promoted, the old primary started again as a replica"
	case redisHAAcked:
		fault, setup = fFailover, "primary + replica + Sentinel, grants and renewals acknowledged by the replica (wait_replicas=1, WAIT); the primary killed (kill -9), the replica promoted, the old primary started again as a replica (the fault ends once it is linked: until then no grant is acknowledged)"
	case postgresHA, postgresHASync:
		return postgresFailover(ct, row)
	case cluster.RedisCluster, redisClusterAcked:
		return redisClusterControl(ct, row)
	case cluster.NATS3:
		setup = "3 NATS servers, an R3 bucket; the leader of the bucket's stream killed (kill -9), a new one elected (NATS waits 4-9 s for one), the old one started again (once its /healthz is ok: caught up)"
	}
	ctl := &suite.Control{
		FailoverName: fault,
		Setup:        map[string]string{suite.FaultFailover: setup},
		Failover: func(ctx context.Context) (string, error) {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			leader, err := ct.WaitLeader(lctx, name)
			cancel()
			if err != nil {
				return "", err
			}
			if err := ct.Kill(ctx, name, leader); err != nil {
				return "", err
			}
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_, werr := ct.WaitLeader(wctx, name, leader)
			// Always start it again: later cells need the cluster whole.
			serr := ct.Start(context.WithoutCancel(ctx), name, leader)
			if row == redisHAAcked && serr == nil {
				// Grants wait for a replica: the fault ends once the old
				// primary is the new one's replica again.
				serr = waitReady(ctx, ct, name)
			}
			return "(member " + leader + ")", errors.Join(werr, serr)
		},
	}
	if name != cluster.RedisHA {
		addMembers(ct, name, ctl)
	}
	return ctl
}

// postgresFailover is the failover fault of a PostgreSQL primary and its
// standby, which nothing promotes by itself: the primary killed (kill
// -9), the standby promoted at once (pg_promote, as a failover manager
// would after its check), and the old primary started again as the new
// one's standby (a fresh pg_basebackup).
func postgresFailover(ct *cluster.Testenv, name string) *suite.Control {
	how := "asynchronous streaming replication"
	if name == postgresHASync {
		how = "a synchronous standby, synchronous_commit = remote_apply"
	}
	return &suite.Control{
		FailoverName: fFailover,
		Setup: map[string]string{suite.FaultFailover: "PostgreSQL primary + standby (" + how + "), the URL naming both with target_session_attrs=read-write; " +
			"the primary killed (kill -9), the standby promoted (pg_promote), the old primary started again as its standby (pg_basebackup; the fault ends once it streams)"},
		Failover: func(ctx context.Context) (string, error) {
			e, err := testenv.Open(ct.State)
			if err != nil {
				return "", err
			}
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			primary, err := ct.WaitLeader(lctx, name)
			cancel()
			if err != nil {
				return "", err
			}
			standby := map[string]string{"1": "2", "2": "1"}[primary]
			if err := ct.Kill(ctx, name, primary); err != nil {
				return "", err
			}
			perr := e.Promote(ctx, name, standby)
			// Always start it again: later rounds need the standby (and
			// postgresha-sync's commits wait for it).
			serr := ct.Start(context.WithoutCancel(ctx), name, primary)
			if serr == nil {
				// The fault ends once the old primary streams from the new.
				serr = waitReady(ctx, ct, name)
			}
			return "(member " + primary + "; member " + standby + " promoted)", errors.Join(perr, serr)
		},
	}
}

// waitReady waits until the cluster is whole again (testenv's readiness
// probe: replicas and standbys linked to the primary), at most a minute.
func waitReady(ctx context.Context, ct *cluster.Testenv, name string) error {
	e, err := testenv.Open(ct.State)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return e.WaitReady(wctx, name)
}

// addMembers gives a cluster's control its members, for the member
// faults (suite.FaultMemberPause, FaultMemberIsolated): each contender
// connects to one member, which the suite pauses with SIGSTOP.
func addMembers(ct *cluster.Testenv, name string, ctl *suite.Control) {
	ms, err := ct.Members(context.Background(), name)
	if err != nil || len(ms) < 3 {
		return // the member faults are then listed as not run
	}
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
		ctl.Members = append(ctl.Members, m.Addr)
	}
	ctl.PauseMember = func(ctx context.Context, i int) error { return ct.PauseMember(ctx, name, ids[i]) }
	ctl.ResumeMember = func(ctx context.Context, i int) error { return ct.ResumeMember(ctx, name, ids[i]) }
	ctl.MembersServe = func(ctx context.Context) error { return ct.WaitReady(ctx, name) }
	if !ct.Partitionable(name) {
		return // suite.FaultFollowerPartitioned is then listed as not run
	}
	ctl.PartitionMember = func(ctx context.Context, i int) error { return ct.Partition(ctx, name, ids[i]) }
	ctl.HealMember = func(ctx context.Context, i int) error {
		if err := ct.Heal(ctx, name, ids[i]); err != nil {
			return err
		}
		return ct.WaitReady(ctx, name)
	}
	ctl.MemberLeads = func(ctx context.Context, i int) (bool, error) {
		id, err := ct.Leader(ctx, name)
		if errors.Is(err, cluster.ErrNoLeader) {
			return false, nil
		}
		return id == ids[i], err
	}
}

// clusterFaults are the faults of a cluster row: the failover, and for
// the ensembles (etcd3, zookeeper3, nats3) the member faults too (one member
// paused or isolated under its holder). The primary/replica rows have no
// member a contender could be served by alone.
func clusterFaults(name string) []string {
	faults := []string{suite.FaultFailover}
	if name == cluster.Etcd3 || name == cluster.ZooKeeper3 || name == cluster.NATS3 {
		faults = append(faults, suite.GroupMembers)
	}
	if serverOf(name) == cluster.RedisCluster {
		faults = append(faults, suite.FaultSlotMigration)
	}
	return faults
}
