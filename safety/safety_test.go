package safety

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/migrate"
	_ "github.com/fencelock/fencelock/safety/backends"
	"github.com/fencelock/fencelock/safety/cluster"
	"github.com/fencelock/fencelock/safety/report"
	"github.com/fencelock/fencelock/safety/suite"
)

// backendDef is one backend of the matrix: its server variable, lease TTL
// and the checker's slack.
type backendDef struct {
	name, envVar string
	ttl, slack   time.Duration
}

// The single-server backends (lanes_test.go says which run at once). etcd lease TTLs are whole
// seconds of at least 1.5 election timeouts (2s for the test server);
// ZooKeeper's TTL is its session timeout and its server expires sessions
// on 200ms ticks; a ZooKeeper grant is valid for a third of it (a
// follower cut off from its leader answers for a while), so 2s leaves a
// holder 667ms between renewals that each sync with the leader.
var backendDefs = []backendDef{
	{"postgres", "FENCELOCK_TEST_POSTGRES", time.Second, 300 * time.Millisecond},
	{"redis", "FENCELOCK_TEST_REDIS", time.Second, 300 * time.Millisecond},
	{"etcd", "FENCELOCK_TEST_ETCD", 2 * time.Second, 700 * time.Millisecond},
	{"zookeeper", "FENCELOCK_TEST_ZOOKEEPER", 2 * time.Second, 500 * time.Millisecond},
	{"mongo", "FENCELOCK_TEST_MONGO", time.Second, 300 * time.Millisecond},
	{"mongo-pg", "FENCELOCK_TEST_MONGO_PG", time.Second, 300 * time.Millisecond},
	{"mysql", "FENCELOCK_TEST_MYSQL", time.Second, 300 * time.Millisecond},
	{"nats", "FENCELOCK_TEST_NATS", 2 * time.Second, 700 * time.Millisecond},
}

// dualDef is the dual backend of a migration's rolling deploy
// (migrate.Dual, a dual:// URL): every lease held on Redis and on
// PostgreSQL at once. It runs after the backends above, on their servers.
var dualDef = backendDef{"dual", "FENCELOCK_TEST_REDIS+FENCELOCK_TEST_POSTGRES", time.Second, 300 * time.Millisecond}

// dualFaults are the cells of the dual backend: the engine's optional
// paths (rotation, batch renewal, waiting), a holder killed, and a
// semaphore's holder killed (a Semaphore lists its holders, which the
// dual backend merges from both stores). The store and network faults
// are the two backends' own cells.
var dualFaults = []string{suite.FaultHolderKill, suite.FaultRotation, suite.FaultSemHolderKill}

// backendFaults are the faults of a single server: every fault but the
// failover (the clusters have it), and the Redis FLUSHALL and eviction
// faults too (the latter on a Redis of each cell's own).
func backendFaults(mutants bool) []string {
	var fs []string
	for _, f := range suite.DefaultFaults {
		if f != suite.FaultFailover {
			fs = append(fs, f)
		}
	}
	fs = append(fs, suite.FaultRedisFlushall, suite.GroupEviction)
	if mutants {
		fs = append(fs, suite.GroupMutants)
	}
	return fs
}

// profiles size a run (suite.Config's Rounds, Baseline, ControlRounds
// and CellTimeout).
var (
	quick = suite.Config{Profile: "quick", Rounds: 1, Baseline: 5 * time.Second, ControlRounds: 3, CellTimeout: 5 * time.Minute}
	soak  = suite.Config{Profile: "soak", Rounds: 10, Baseline: 60 * time.Second, ControlRounds: 20, CellTimeout: 30 * time.Minute}
)

// Minimums per backend of a full quick run (issue 9).
const (
	minAcquisitions = 300
	minWrites       = 3000
)

// TestSafety is the fault-injection matrix: every available backend under
// every fault class, plus the negative controls, checked and classified;
// it fails on any UNSAFE-UNEXPECTED cell and on any control that is not
// caught, and writes the report. Each backend is one suite.Run, each cell
// a subtest.
func TestSafety(t *testing.T) {
	began := time.Now()
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Int64N(1<<53) + 1
	}
	prof := quick
	if *flagSoak {
		prof = soak
	}
	if *flagRounds > 0 {
		prof.Rounds = *flagRounds
		prof.Profile += fmt.Sprintf(" (%d rounds)", *flagRounds)
	}
	if *flagCell > 0 {
		prof.CellTimeout = *flagCell
	}
	prof.Seed = seed
	prof.Logf = t.Logf
	t.Logf("safety: profile %s, seed %d (rerun: go test -run TestSafety -args -safety.seed=%d)", prof.Profile, seed, seed)
	fmt.Fprintf(os.Stderr, "safety: profile %s, seed %d\n", prof.Profile, seed)

	te, err := findTestenv()
	if err != nil {
		t.Fatal(err)
	}
	rep := report.Report{
		Profile: prof.Profile,
		Seed:    seed,
		Started: began.UTC().Truncate(time.Second),
		Repro:   "cd safety && go test -race -run 'TestSafety/^{backend}$/^{fault}$' -args -safety.seed={seed}",
		Env:     map[string]string{},
	}
	// The mutants run over one real backend: Redis, else PostgreSQL.
	mutantOn := ""
	for _, n := range []string{"FENCELOCK_TEST_REDIS", "FENCELOCK_TEST_POSTGRES"} {
		if os.Getenv(n) != "" && mutantOn == "" {
			mutantOn = n
		}
	}

	// The cells run in lanes, one goroutine each: a lane's backends run
	// one after another, and the lanes at once. A fault on a server must
	// not hit another backend's cells, so the backends that share a server
	// share a lane (mongo-pg keeps its data on the postgres server), and
	// dual, which holds every lease on Redis and on PostgreSQL, waits for
	// both lanes to leave those servers. Most of a cell's time is spent
	// waiting on TTLs and faults, not on the CPU.
	sink := &reportSink{rep: &rep}
	clusters := &clusterSet{}
	defer clusters.down(t)
	single := func(def backendDef) func(*testing.T) {
		return func(t *testing.T) {
			url := testenv.URL(t, def.envVar)
			ownedURL := url // the URL testenv started, for the server's control
			if strings.HasPrefix(def.name, "mongo") {
				// A collection of this run's own: FerretDB reads the
				// whole collection for most operations, so what earlier
				// runs left there would slow this one's waiters.
				url = withParam(t, url, "collection", fmt.Sprintf("safety_%d", time.Now().UnixNano()))
			}
			if def.name == "nats" {
				// A bucket of this run's own.
				url = withParam(t, url, "bucket", fmt.Sprintf("safety_%d", time.Now().UnixNano()))
			}
			b := suite.Backend{Name: def.name, URL: url, TTL: def.ttl, Slack: def.slack, Control: testenvControl(te, def.name, ownedURL)}
			runBackend(t, sink, prof, b, backendFaults(def.envVar == mutantOn), true)
		}
	}
	clustered := func(def backendDef) func(*testing.T) {
		return func(t *testing.T) {
			url, ct := clusters.get(t, def)
			// Several hosts, or a Sentinel that names the primary: no proxy.
			b := suite.Backend{Name: def.name, URL: url, TTL: def.ttl, Slack: def.slack, NoProxy: true, Control: clusterControl(ct, def.name)}
			runBackend(t, sink, prof, b, clusterFaults(def.name), false)
		}
	}
	runs := map[string]func(*testing.T){
		dualDef.name: func(t *testing.T) {
			url := migrate.DualURL(testenv.URL(t, "FENCELOCK_TEST_REDIS"), testenv.URL(t, "FENCELOCK_TEST_POSTGRES"))
			// Two stores behind one URL: no proxy.
			b := suite.Backend{Name: dualDef.name, URL: url, TTL: dualDef.ttl, Slack: dualDef.slack, NoProxy: true}
			sink.setEnv("left out: "+dualDef.name, "every fault but "+strings.Join(dualFaults, ", ")+": they are measured on redis and postgres alone")
			runBackend(t, sink, prof, b, dualFaults, false)
		},
		"postgres-faketime": func(t *testing.T) {
			srv, err := startFaketimePostgres(t)
			if err != nil {
				if ci := os.Getenv("CI"); ci == "true" || ci == "1" {
					t.Fatal(err)
				}
				t.Skip(err)
			}
			b := suite.Backend{Name: "postgres-faketime", URL: srv.url, TTL: time.Second, Slack: 300 * time.Millisecond, Control: srv.control()}
			runBackend(t, sink, prof, b, []string{suite.FaultClockJump}, false)
		},
	}
	for _, def := range backendDefs {
		runs[def.name] = single(def)
	}
	for _, def := range clusterDefs {
		runs[def.name] = clustered(def)
	}
	runLanes(t, runs)

	sortCells(&rep)
	rep.Duration = time.Since(began).Round(time.Second)
	t.Logf("safety: %d cells in %v (seed %d)", len(rep.Cells), rep.Duration, seed)
	if len(rep.Cells) > 0 {
		writeReports(t, rep)
	}
	if rep.Failed() {
		t.Errorf("safety report fails (seed %d):\n%s", seed, strings.Join(rep.Problems(), "\n"))
	}
}

// runBackend runs one backend's cells with suite.Run, each cell a subtest,
// adds them to rep, and (minimums) checks that a full run of them made
// enough acquisitions and writes.
func runBackend(t *testing.T, sink *reportSink, cfg suite.Config, b suite.Backend, faults []string, minimums bool) {
	cfg.Backends = []suite.Backend{b}
	cfg.Faults = faults
	var acq, writes, ran, total int
	cfg.Cell = func(_, fault string, run func() suite.CellRun) {
		total++
		t.Run(fault, func(t *testing.T) {
			ran++
			r := run()
			if r.Summary != "" {
				t.Log(r.Summary)
				acq += r.Cell.Result.Stats.Acquisitions
				writes += r.Cell.Result.Stats.Writes
			}
			hist := ""
			if r.History != "" {
				hist = "\nhistory: " + r.History
			}
			if r.Err != nil {
				t.Errorf("%v (seed %d)", r.Err, cfg.Seed)
				return
			}
			if p := r.Cell.Problem(); p != "" {
				t.Errorf("%s (seed %d)%s", p, cfg.Seed, hist)
			}
		})
	}
	sub, err := suite.Run(context.Background(), cfg)
	if errors.Is(err, suite.ErrConfig) || errors.Is(err, suite.ErrBackend) {
		t.Fatal(err)
	}
	// Cell errors were reported by their subtests.
	sink.add(sub)
	for _, n := range sub.NotRun {
		t.Logf("%s: not run: %s: %s", n.Backend, n.Fault, n.Why)
	}
	if ran == total && !t.Failed() {
		t.Logf("%s: %d acquisitions, %d fenced writes in %d cells", b.Name, acq, writes, ran)
		if minimums && (acq < minAcquisitions || writes < minWrites) {
			t.Errorf("%s: %d acquisitions and %d writes; a run needs at least %d and %d",
				b.Name, acq, writes, minAcquisitions, minWrites)
		}
	}
}

// findTestenv returns the scripts/testenv of FENCELOCK_TESTENV_STATE, or
// nil when the servers were not started by it (a developer's own servers
// are never killed).
func findTestenv() (*cluster.Testenv, error) {
	te, err := cluster.FromEnv()
	if errors.Is(err, cluster.ErrNoState) {
		return nil, nil
	}
	return te, err
}

// testenvControl lets the suite kill, restart and pause a server that
// scripts/testenv started (nil for any other server: a developer's own
// servers are never killed).
func testenvControl(te *cluster.Testenv, name, url string) *suite.Control {
	if te == nil || !te.Owns(name, url) {
		return nil
	}
	return &suite.Control{
		Restart: func(ctx context.Context) error { return te.RestartServer(ctx, name) },
		Pause:   func(ctx context.Context) error { return te.Pause(ctx, name) },
		Resume:  func(ctx context.Context) error { return te.Resume(ctx, name) },
		Setup: map[string]string{
			suite.FaultServerKill:  "kill -9 and restart with its data (scripts/testenv restart)",
			suite.FaultServerPause: "SIGSTOP/SIGCONT of the server (scripts/testenv pause)",
		},
	}
}

// writeReports writes the markdown and JSON reports to the paths of the
// flags, or to a temporary directory.
func writeReports(t *testing.T, rep report.Report) {
	md, js := *flagReport, *flagJSON
	if md == "" || js == "" {
		dir, err := os.MkdirTemp("", "fencelock-safety-report-")
		if err != nil {
			t.Error(err)
			return
		}
		if md == "" {
			md = filepath.Join(dir, "safety.md")
		}
		if js == "" {
			js = filepath.Join(dir, "safety.json")
		}
	}
	if err := suite.WriteReport(md, js, rep); err != nil {
		t.Error(err)
	}
	t.Logf("safety: report written to %s and %s", md, js)
}

// withParam sets one query parameter of a URL.
func withParam(t *testing.T, raw, k, v string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}
