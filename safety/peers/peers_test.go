package peers_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/safety/cluster"
	"github.com/fencelock/fencelock/safety/peers"
	"github.com/fencelock/fencelock/safety/report"
	"github.com/fencelock/fencelock/safety/suite"
)

var (
	flagSeed   = flag.Int64("peers.seed", 0, "seed of the run (0: random); every run prints its seed")
	flagReport = flag.String("peers.report", "", "write the markdown report to this path (../../docs/safety-peers.md)")
	flagJSON   = flag.String("peers.json", "", "write the JSON report to this path (../../docs/safety-peers.json)")
)

// RoundsVar is the budget variable of a longer run: the rounds of each
// fault per cell (default 1, the quick profile's).
const RoundsVar = "FENCELOCK_PEERS_ROUNDS"

// regenerate is the command that writes docs/safety-peers.md and .json.
const regenerate = "cd safety/peers && go test -race -run TestPeers -timeout 30m -args " +
	"-peers.report=../../docs/safety-peers.md -peers.json=../../docs/safety-peers.json"

// TestMain runs a contender instead of the tests when the harness
// re-executed this binary as one: a peer library's (peers), or
// fencelock's (suite).
func TestMain(m *testing.M) {
	peers.MainIfContender()
	suite.MainIfContender()
	os.Exit(m.Run())
}

// store is one store the peers run on: the shared test server (holder
// faults) and, for the faults that kill or pause it, a server of the
// test's own. TTL and slack are TestSafety's for fencelock's row.
type store struct {
	name, envVar string
	ttl, slack   time.Duration
}

var stores = map[string]store{
	"redis":     {"redis", "FENCELOCK_TEST_REDIS", time.Second, 300 * time.Millisecond},
	"etcd":      {"etcd", "FENCELOCK_TEST_ETCD", 2 * time.Second, 700 * time.Millisecond},
	"zookeeper": {"zookeeper", "FENCELOCK_TEST_ZOOKEEPER", time.Second, 500 * time.Millisecond},
}

// holderFaults run on the shared servers; serverFaults on the test's own.
var (
	holderFaults = []string{suite.FaultBaseline, suite.FaultHolderPause, suite.FaultHolderKill}
	serverFaults = []string{suite.FaultServerKill, suite.FaultServerPause}
)

func isCI() bool { ci := os.Getenv("CI"); return ci == "true" || ci == "1" }

// TestPeers runs every peer library (peers.Libs) through the cells of
// suite.PeerFaults that its stores allow, the same cells as fencelock's
// rows of the safety report (the failover cell on its store's cluster,
// peers.Failovers, which it starts), and writes the peers report. It fails when
// a cell cannot run to the end or runs without a grant or a write, and
// when a library without tokens shows no overlapping write in
// holder-pause (the control of the overlap count); the libraries'
// verdicts are otherwise measured, not asserted.
func TestPeers(t *testing.T) {
	began := time.Now()
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Int64N(1<<53) + 1
	}
	rounds := 1
	if v := os.Getenv(RoundsVar); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of rounds", RoundsVar, v)
		}
		rounds = n
	}
	profile := "quick"
	if rounds > 1 {
		profile = fmt.Sprintf("quick (%d rounds)", rounds)
	}
	t.Logf("peers: profile %s, seed %d (rerun: go test -run TestPeers -args -peers.seed=%d)", profile, seed, seed)

	urls := map[string]string{}
	for name, s := range stores {
		u := os.Getenv(s.envVar)
		if u == "" {
			if isCI() {
				t.Fatalf("%s is not set: under CI every backend's server must be running (out=$(scripts/testenv up) && eval \"$out\")", s.envVar)
			}
			t.Logf("%s is not set: the %s peers are not run", s.envVar, name)
		}
		urls[name] = u
	}
	// The clusters of the failover cells, started meanwhile (in a state
	// dir of their own, stopped by Down: testenv kills the PIDs it
	// recorded there).
	clusters := startClusters(t)
	defer clusters.down(t)

	// Servers of the test's own for the faults that kill and pause
	// them: the shared ones serve other tests.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	own, err := cluster.Up(ctx, "redis", "etcd", "zookeeper")
	cancel()
	if err != nil {
		if isCI() {
			t.Fatalf("starting the servers the server faults kill and pause: %v", err)
		}
		t.Logf("starting the servers the server faults kill and pause: %v (those cells are not run)", err)
	} else {
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := own.Down(ctx); err != nil {
				t.Errorf("stopping the test's own servers: %v", err)
			}
		}()
	}

	rep := peers.Report{
		Profile: profile, Seed: seed, Started: began.UTC().Truncate(time.Second),
		Libs: peers.Libs, Faults: slices.Concat(holderFaults, serverFaults, []string{peers.FailoverFault}),
		Failovers: peers.Failovers,
		Command:   regenerate,
		Env: map[string]string{"go": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH,
			"cpus": strconv.Itoa(runtime.NumCPU()), "race": strconv.FormatBool(raceEnabled), "rounds per fault": strconv.Itoa(rounds)},
	}
	var mu sync.Mutex
	add := func(r report.Report) {
		mu.Lock()
		defer mu.Unlock()
		rep.Cells = append(rep.Cells, r.Cells...)
		rep.NotRun = append(rep.NotRun, r.NotRun...)
	}
	cfg := suite.Config{Profile: profile, Rounds: rounds, Baseline: 5 * time.Second, CellTimeout: 5 * time.Minute, Seed: seed, Logf: t.Logf}

	// One lane per store, at once; a store's libraries one after
	// another (a server fault must hit one library's cells only).
	t.Run("lanes", func(t *testing.T) {
		for _, storeName := range []string{"redis", "etcd", "zookeeper"} {
			t.Run(storeName, func(t *testing.T) {
				t.Parallel()
				s := stores[storeName]
				for _, lib := range peers.Libs {
					if lib.Store != storeName {
						continue
					}
					t.Run(lib.Name, func(t *testing.T) {
						if urls[storeName] == "" {
							t.Skipf("%s is not set", s.envVar)
						}
						b := suite.Backend{Name: lib.Name, URL: urls[storeName], TTL: s.ttl, Slack: s.slack, NoProxy: true,
							Peer: &suite.Peer{Lib: lib.Name, Tokens: lib.Tokens}}
						add(runPeer(t, cfg, b, holderFaults))
						if own == nil || own.URL(storeName) == "" {
							add(report.Report{NotRun: notRun(lib.Name, serverFaults, "no server of the test's own to kill or pause")})
							return
						}
						b.URL = own.URL(storeName)
						b.Control = &suite.Control{
							Restart: func(ctx context.Context) error { return own.RestartServer(ctx, storeName) },
							Pause:   func(ctx context.Context) error { return own.Pause(ctx, storeName) },
							Resume:  func(ctx context.Context) error { return own.Resume(ctx, storeName) },
							Setup: map[string]string{
								suite.FaultServerKill:  "kill -9 and restart with its data (scripts/testenv's server of the test's own)",
								suite.FaultServerPause: "SIGSTOP for 2×TTL, then SIGCONT (scripts/testenv's server of the test's own)",
							},
						}
						add(runPeer(t, cfg, b, serverFaults))
						add(runFailover(t, cfg, clusters, lib))
					})
				}
			})
		}
	})
	sortCells(&rep)
	rep.Duration = time.Since(began).Round(time.Second)
	rep.FencelockSource = "docs/safety.json"
	if main, err := readMainReport(); err != nil {
		t.Logf("fencelock's cells for comparison: %v", err)
	} else {
		for _, c := range main.Cells {
			if _, ok := stores[c.Backend]; ok && slices.Contains(rep.Faults, c.Fault) {
				rep.Fencelock = append(rep.Fencelock, c)
			}
			if slices.ContainsFunc(peers.Failovers, func(fo peers.Failover) bool { return fo.Cluster == c.Backend && fo.Fault == c.Fault }) {
				rep.Fencelock = append(rep.Fencelock, c)
			}
		}
		rep.FencelockSource = fmt.Sprintf("[safety.md](safety.md) (profile %s, seed %d)", main.Profile, main.Seed)
	}
	writeReport(t, rep)
	for _, c := range rep.Cells {
		t.Logf("%s/%s: %s", c.Backend, c.Fault, outcome(c))
	}
}

// runPeer runs one library's cells on one server, each a subtest.
func runPeer(t *testing.T, cfg suite.Config, b suite.Backend, faults []string) report.Report {
	cfg.Backends = []suite.Backend{b}
	cfg.Faults = faults
	cfg.Expect = report.Table{{Backend: b.Name, Fault: "*", Expectation: report.Expectation{
		Unsafe: true,
		Why:    "A peer library: what it does under the fault is measured, not promised (docs/safety-peers.md).",
	}}}
	if !b.Peer.Tokens {
		// The control of the overlap count: a holder that stopped
		// between its check and its write, and resumes after the next
		// holder of its key has written, writes without a token to a
		// resource that accepts it. A run that counts no overlapping
		// write there would hide them everywhere.
		cfg.Expect = slices.Insert(cfg.Expect, 0, report.Rule{Backend: b.Name, Fault: suite.FaultHolderPause, Expectation: report.Expectation{
			Control: true, Properties: []string{"P1"},
			Why: "Negative control of the overlap count: a holder paused between its lock check and its write writes, " +
				"without a token, after the next holder of its key has written; the unfenced resource accepts it.",
		}})
	}
	cfg.Cell = func(_, fault string, run func() suite.CellRun) {
		t.Run(fault, func(t *testing.T) {
			r := run()
			if r.Summary != "" {
				t.Log(r.Summary)
			}
			if r.Err != nil {
				t.Errorf("%v (seed %d)", r.Err, cfg.Seed)
				return
			}
			if p := r.Cell.Problem(); p != "" {
				t.Errorf("%s/%s: %s (seed %d, history: %s)", b.Name, fault, p, cfg.Seed, r.History)
			}
			if st := r.Cell.Result.Stats; st.Acquisitions == 0 || st.Writes == 0 {
				t.Errorf("%s/%s measured nothing: %d acquisitions, %d writes (history: %s)", b.Name, fault, st.Acquisitions, st.Writes, r.History)
			}
		})
	}
	rep, err := suite.Run(context.Background(), cfg)
	if errors.Is(err, suite.ErrConfig) || errors.Is(err, suite.ErrBackend) {
		t.Fatal(err)
	}
	return rep
}

func notRun(lib string, faults []string, why string) []report.NotRun {
	var n []report.NotRun
	for _, f := range faults {
		n = append(n, report.NotRun{Backend: lib, Fault: f, Why: why})
	}
	return n
}

// sortCells orders the cells by library (peers.Libs) and fault.
func sortCells(rep *peers.Report) {
	libIdx := func(name string) int {
		return slices.IndexFunc(peers.Libs, func(l peers.Lib) bool { return l.Name == name })
	}
	slices.SortStableFunc(rep.Cells, func(a, b report.Cell) int {
		if d := libIdx(a.Backend) - libIdx(b.Backend); d != 0 {
			return d
		}
		return faultIdx(rep, a.Fault) - faultIdx(rep, b.Fault)
	})
}

// faultIdx is the column of a cell's fault; the failover faults' is the
// failover column.
func faultIdx(rep *peers.Report, fault string) int {
	if slices.ContainsFunc(rep.Failovers, func(fo peers.Failover) bool { return fo.Fault == fault }) {
		fault = peers.FailoverFault
	}
	return slices.Index(rep.Faults, fault)
}

func outcome(c report.Cell) string {
	lib, _ := peers.LibByName(c.Backend)
	return peers.Outcome(c, lib)
}

// readMainReport reads the committed safety report, whose fencelock
// cells the peers table shows beside the libraries'.
func readMainReport() (report.Report, error) {
	f, err := os.Open(filepath.Join("..", "..", "docs", "safety.json"))
	if err != nil {
		return report.Report{}, err
	}
	defer f.Close()
	return report.ReadJSON(f)
}

// writeReport writes the report to the flags' paths, or to a temporary
// directory.
func writeReport(t *testing.T, rep peers.Report) {
	md, js := *flagReport, *flagJSON
	if md == "" || js == "" {
		dir := t.TempDir()
		if md == "" {
			md = filepath.Join(dir, "safety-peers.md")
		}
		if js == "" {
			js = filepath.Join(dir, "safety-peers.json")
		}
	}
	if err := rep.WriteFiles(md, js); err != nil {
		t.Error(err)
		return
	}
	t.Logf("peers: report written to %s and %s", md, js)
}
