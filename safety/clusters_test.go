package safety

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/safety/cluster"
	"github.com/fencelock/fencelock/safety/suite"
)

// The loopback clusters (scripts/testenv etcd3, zookeeper3, redisha),
// after the single servers. ZooKeeper's TTL is its session timeout: 2s
// lets a session move to a surviving node after its server died.
var clusterDefs = []backendDef{
	{cluster.Etcd3, "FENCELOCK_TEST_ETCD3", 2 * time.Second, 700 * time.Millisecond},
	{cluster.ZooKeeper3, "FENCELOCK_TEST_ZOOKEEPER3", 2 * time.Second, 700 * time.Millisecond},
	{cluster.RedisHA, "FENCELOCK_TEST_REDISHA", time.Second, 300 * time.Millisecond},
}

// Names of the clusters' failover cells (suite.Control.FailoverName).
const (
	fLeaderKill = "leader-kill"
	fFailover   = "primary-kill-failover"
)

// clusterSet finds the clusters, starting them with scripts/testenv when
// their variables are not set, once per run.
type clusterSet struct {
	once    sync.Once
	started *cluster.Testenv // started by this run: Down at the end
	env     *cluster.Testenv // the state dir of clusters named by the environment
	err     error
}

// get returns the URL of a cluster and the Testenv that controls its
// members (nil when the cluster is not one scripts/testenv started). It
// skips the test when the cluster is not available, or fails it under
// CI.
func (s *clusterSet) get(t *testing.T, def backendDef) (string, *cluster.Testenv) {
	t.Helper()
	s.once.Do(func() {
		var missing []string
		for _, d := range clusterDefs {
			if os.Getenv(d.envVar) == "" {
				missing = append(missing, d.name)
			}
		}
		if env, err := cluster.FromEnv(); err == nil {
			s.env = env
		}
		if len(missing) == 0 {
			return
		}
		t.Logf("safety: starting loopback clusters %v with scripts/testenv", missing)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		s.started, s.err = cluster.Up(ctx, missing...)
	})
	url := os.Getenv(def.envVar)
	ct := s.env
	if url == "" && s.started != nil {
		url, ct = s.started.URL(def.name), s.started
	}
	if url == "" {
		msg := def.envVar + " is not set and scripts/testenv could not start " + def.name
		if s.err != nil {
			msg += ": " + s.err.Error()
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
	if s.started == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.started.Down(ctx); err != nil {
		t.Errorf("stopping the clusters: %v", err)
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
	fault, setup := fLeaderKill, "3 members; the leader killed (kill -9), a new one elected, the old one started again"
	if name == cluster.RedisHA {
		fault, setup = fFailover, "primary + replica + Sentinel; the primary killed (kill -9), the replica promoted, the old primary started again as a replica"
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
			return "(member " + leader + ")", errors.Join(werr, serr)
		},
	}
	if name != cluster.RedisHA {
		addMembers(ct, name, ctl)
	}
	return ctl
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
}
