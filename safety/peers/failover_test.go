package peers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/safety/cluster"
	"github.com/fencelock/fencelock/safety/peers"
	"github.com/fencelock/fencelock/safety/report"
	"github.com/fencelock/fencelock/safety/suite"
)

// clusterSet is the loopback clusters of the failover cells
// (peers.Failovers), started by scripts/testenv's Go side in a state dir
// of their own while the first cells run on the single servers.
type clusterSet struct {
	done chan struct{} // closed once te and err are set
	te   *cluster.Testenv
	err  error
}

// startClusters starts the clusters of peers.Failovers in the background.
func startClusters(t *testing.T) *clusterSet {
	names := make([]string, len(peers.Failovers))
	for i, fo := range peers.Failovers {
		names[i] = fo.Cluster
	}
	s := &clusterSet{done: make(chan struct{})}
	t.Logf("peers: starting the failover cells' clusters %v with scripts/testenv", names)
	go func() {
		defer close(s.done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		s.te, s.err = cluster.Up(ctx, names...)
	}()
	return s
}

// get waits for the clusters and returns the URL of one and its
// Testenv; "" and why when it could not be started.
func (s *clusterSet) get(name string) (string, *cluster.Testenv, string) {
	<-s.done
	if s.err != nil {
		return "", nil, "scripts/testenv could not start " + name + ": " + s.err.Error()
	}
	if u := s.te.URL(name); u != "" {
		return u, s.te, ""
	}
	return "", nil, "scripts/testenv could not start " + name + " (its server binary is not installed: scripts/install-servers)"
}

// down stops the clusters (every PID testenv recorded in their state
// dir), once they are started.
func (s *clusterSet) down(t *testing.T) {
	<-s.done
	if s.te == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.te.Down(ctx); err != nil {
		t.Errorf("stopping the failover cells' clusters: %v", err)
	}
}

// runFailover runs a library's failover cell on its store's cluster:
// the fault, TTL, slack and setup of fencelock's row of that cluster in
// the safety report. Under CI a cluster that could not be started fails
// the test; otherwise the cell is listed as not run.
func runFailover(t *testing.T, cfg suite.Config, clusters *clusterSet, lib peers.Lib) report.Report {
	t.Helper()
	fo, ok := peers.FailoverOf(lib.Store)
	if !ok {
		return report.Report{}
	}
	url, te, why := clusters.get(fo.Cluster)
	if url == "" {
		if isCI() {
			t.Fatalf("%s/%s: %s", lib.Name, fo.Fault, why)
		}
		t.Logf("%s/%s: %s (the cell is not run)", lib.Name, fo.Fault, why)
		return report.Report{NotRun: notRun(lib.Name, []string{fo.Fault}, why)}
	}
	// Every cell starts on a whole cluster: the previous library's
	// failover started the old leader again, but a Redis replica may
	// still be linking to its new primary.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err := te.WaitReady(ctx, fo.Cluster)
	cancel()
	if err != nil {
		t.Fatalf("%s is not whole before %s's failover cell: %v", fo.Cluster, lib.Name, err)
	}
	b := suite.Backend{Name: lib.Name, URL: url, TTL: fo.TTL, Slack: fo.Slack, NoProxy: true,
		Peer: &suite.Peer{Lib: lib.Name, Tokens: lib.Tokens}, Control: failoverControl(te, fo)}
	r := runPeer(t, cfg, b, []string{suite.FaultFailover})
	// The cell runs under the suite's name (see failoverControl); the
	// report names it as fencelock's row does.
	for i := range r.Cells {
		if r.Cells[i].Fault == suite.FaultFailover {
			r.Cells[i].Fault = fo.Fault
		}
	}
	for i := range r.NotRun {
		if r.NotRun[i].Fault == suite.FaultFailover {
			r.NotRun[i].Fault = fo.Fault
		}
	}
	return r
}

// failoverControl is the failover fault of fencelock's cluster rows (the
// safety module's clusterControl, for redisha, etcd3 and zookeeper3):
// the leader or primary killed with SIGKILL while contenders hold locks,
// a new one elected or promoted, and the old one started again. It sets
// no FailoverName: the suite keeps a Peer's cells by their canonical
// names (suite.PeerFaults), so a renamed failover cell would not run;
// runFailover names the cell after the run.
func failoverControl(te *cluster.Testenv, fo peers.Failover) *suite.Control {
	setup := "3 members; the leader killed (kill -9), a new one elected, the old one started again"
	if fo.Cluster == cluster.RedisHA {
		setup = "primary + replica + Sentinel; the primary killed (kill -9), the replica promoted, the old primary started again as a replica"
	}
	name := fo.Cluster
	return &suite.Control{
		Setup: map[string]string{suite.FaultFailover: setup},
		Failover: func(ctx context.Context) (string, error) {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			leader, err := te.WaitLeader(lctx, name)
			cancel()
			if err != nil {
				return "", err
			}
			if err := te.Kill(ctx, name, leader); err != nil {
				return "", err
			}
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_, werr := te.WaitLeader(wctx, name, leader)
			// Always start it again: the next library's cell needs the
			// cluster whole.
			serr := te.Start(context.WithoutCancel(ctx), name, leader)
			return "(member " + leader + ")", errors.Join(werr, serr)
		},
	}
}
