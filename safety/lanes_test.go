package safety

import (
	"slices"
	"sync"
	"testing"

	"github.com/fencelock/fencelock/safety/cluster"
	"github.com/fencelock/fencelock/safety/report"
)

// lanes are the backends of TestSafety, as the lanes they run in: a
// lane's backends one after another, the lanes at once. Backends that
// share a server share a lane: a server kill or pause must only hit the
// cells of the backend it is measured on. mongo-pg keeps its data on the
// postgres server (it runs in the tail, after the lanes), and
// redisha-acked is the redisha cluster again with another URL; dual uses
// the redis and postgres servers and also waits (laneAfter) for the redis
// lane to be done with redis. The lanes are balanced on the quick
// profile's cell times.
var lanes = [][]string{
	{"postgres", "dual", "postgres-faketime", cluster.Etcd3},
	{"redis", "etcd", cluster.RedisHA, redisHAAcked}, // both redisha rows on one cluster
	{"zookeeper", "mongo", cluster.ZooKeeper3, postgresHA},
	{"mysql", "nats", postgresHASync, cluster.NATS3},
	{cluster.RedisCluster, redisClusterAcked}, // both rediscluster rows on one cluster
}

// tail are the backends that run after every lane has ended, one after
// another: FerretDB's PostgreSQL handler (mongo-pg, on the postgres server)
// answers a read-write lock's requests so slowly under the load of four
// lanes that its liveness cells (a waiter served within TTL + poll +
// slack, progress after a fault) failed for want of CPU, not of a bound.
var tail = []string{"mongo-pg"}

// laneAfter names, for a backend, the backends of other lanes whose cells
// must be over before its own start (they use the same servers).
var laneAfter = map[string][]string{
	dualDef.name: {"redis", "postgres"},
}

// runLanes runs each named function as the subtest of that name, in the
// lanes above, then the tail's, and returns when all have returned. A name that no lane
// lists fails the test: a new backend must be placed in a lane, next to
// the backends it shares a server with.
func runLanes(t *testing.T, runs map[string]func(*testing.T)) {
	done := map[string]chan struct{}{}
	for _, lane := range lanes {
		for _, n := range lane {
			done[n] = make(chan struct{})
		}
	}
	for _, n := range tail {
		done[n] = make(chan struct{})
	}
	for n := range runs {
		if done[n] == nil {
			t.Errorf("safety: backend %q is in no lane; add it to lanes in lanes_test.go, with the backends whose servers it uses", n)
		}
	}
	var wg sync.WaitGroup
	for _, lane := range lanes {
		wg.Go(func() {
			for _, n := range lane {
				for _, dep := range laneAfter[n] {
					<-done[dep]
				}
				if f := runs[n]; f != nil {
					t.Run(n, f)
				}
				close(done[n])
			}
		})
	}
	wg.Wait()
	for _, n := range tail {
		if f := runs[n]; f != nil {
			t.Run(n, f)
		}
		close(done[n])
	}
}

// reportSink collects the cells of the lanes into one report.
type reportSink struct {
	mu  sync.Mutex
	rep *report.Report
}

// add appends one backend's cells, not-run cells and environment.
func (s *reportSink) add(sub report.Report) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.Cells = append(s.rep.Cells, sub.Cells...)
	s.rep.NotRun = append(s.rep.NotRun, sub.NotRun...)
	for k, v := range sub.Env {
		s.rep.Env[k] = v
	}
}

// setEnv records one line of the report's environment.
func (s *reportSink) setEnv(k, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.Env[k] = v
}

// sortCells puts the report's cells in the order of the matrix (the
// single servers of backendDefs, dual, the fake-clock server, the
// clusters), whichever lane ended first, keeping each backend's cells in
// the order they ran.
func sortCells(rep *report.Report) {
	var order []string
	for _, d := range backendDefs {
		order = append(order, d.name)
	}
	order = append(order, dualDef.name, "postgres-faketime")
	for _, d := range clusterDefs {
		order = append(order, d.name)
	}
	rank := func(b string) int {
		if i := slices.Index(order, b); i >= 0 {
			return i
		}
		return len(order)
	}
	slices.SortStableFunc(rep.Cells, func(a, b report.Cell) int { return rank(a.Backend) - rank(b.Backend) })
	slices.SortStableFunc(rep.NotRun, func(a, b report.NotRun) int { return rank(a.Backend) - rank(b.Backend) })
}
