package safety

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/migrate"
	_ "github.com/fencelock/fencelock/safety/backends"
	"github.com/fencelock/fencelock/safety/cluster"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/report"
)

// backendDef is one backend of the matrix: its server variable, lease TTL
// and the checker's slack.
type backendDef struct {
	name, envVar string
	ttl, slack   time.Duration
}

// The backends, in the order they run (one after another: store faults
// must not hit another backend's cells). etcd lease TTLs are whole
// seconds of at least 1.5 election timeouts (2s for the test server);
// ZooKeeper's TTL is its session timeout and its server expires sessions
// on 200ms ticks.
var backendDefs = []backendDef{
	{"postgres", "FENCELOCK_TEST_POSTGRES", time.Second, 300 * time.Millisecond},
	{"redis", "FENCELOCK_TEST_REDIS", time.Second, 300 * time.Millisecond},
	{"etcd", "FENCELOCK_TEST_ETCD", 2 * time.Second, 700 * time.Millisecond},
	{"zookeeper", "FENCELOCK_TEST_ZOOKEEPER", time.Second, 500 * time.Millisecond},
	{"mongo", "FENCELOCK_TEST_MONGO", time.Second, 300 * time.Millisecond},
	{"mongo-pg", "FENCELOCK_TEST_MONGO_PG", time.Second, 300 * time.Millisecond},
}

// dualDef is the dual backend of a migration's rolling deploy
// (migrate.Dual, a dual:// URL): every lease held on Redis and on
// PostgreSQL at once. It runs after the backends above, on their servers.
var dualDef = backendDef{"dual", "FENCELOCK_TEST_REDIS+FENCELOCK_TEST_POSTGRES", time.Second, 300 * time.Millisecond}

// dualCells are the cells of the dual backend: the engine's optional
// paths (rotation, batch renewal, waiting) and a holder killed. The
// store and network faults are the two backends' own cells.
func dualCells(be *backendEnv, prof profile) (specs []cellSpec, left []string) {
	all, _ := cellsFor(be, prof, false)
	for _, s := range all {
		if s.fault == fRotation || s.fault == fHolderKill {
			specs = append(specs, s)
		}
	}
	return specs, []string{"every fault but " + fHolderKill + " and " + fRotation + ": they are measured on redis and postgres alone"}
}

// Minimums per backend of a full quick run (issue 9).
const (
	minAcquisitions = 300
	minWrites       = 3000
)

// TestSafety is the fault-injection matrix: every available backend under
// every fault class, plus the negative controls, checked and classified;
// it fails on any UNSAFE-UNEXPECTED cell and on any control that is not
// caught, and writes the report.
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
	t.Logf("safety: profile %s, seed %d (rerun: go test -run TestSafety -args -safety.seed=%d)", prof.name, seed, seed)
	fmt.Fprintf(os.Stderr, "safety: profile %s, seed %d\n", prof.name, seed)

	te, err := findTestenv()
	if err != nil {
		t.Fatal(err)
	}
	rep := report.Report{
		Profile: prof.name,
		Seed:    seed,
		Started: began.UTC().Truncate(time.Second),
		Repro:   "cd safety && go test -race -run 'TestSafety/^{backend}$/^{fault}$' -args -safety.seed={seed}",
		Env: map[string]string{
			"go":       runtime.Version(),
			"platform": runtime.GOOS + "/" + runtime.GOARCH,
			"cpus":     strconv.Itoa(runtime.NumCPU()),
			"race":     strconv.FormatBool(raceEnabled),
		},
	}
	// The mutants run over one real backend: Redis, else PostgreSQL.
	mutantOn := ""
	for _, n := range []string{"FENCELOCK_TEST_REDIS", "FENCELOCK_TEST_POSTGRES"} {
		if os.Getenv(n) != "" && mutantOn == "" {
			mutantOn = n
		}
	}

	for _, def := range backendDefs {
		t.Run(def.name, func(t *testing.T) {
			be := openBackendEnv(t, def, testenv.URL(t, def.envVar), te)
			specs, left := cellsFor(be, prof, def.envVar == mutantOn)
			runBackend(t, &rep, be, specs, left, seed, prof, true)
		})
	}
	t.Run(dualDef.name, func(t *testing.T) {
		url := migrate.DualURL(testenv.URL(t, "FENCELOCK_TEST_REDIS"), testenv.URL(t, "FENCELOCK_TEST_POSTGRES"))
		be := openBackendEnv(t, dualDef, url, nil)
		be.proxy = false // two stores behind one URL
		specs, left := dualCells(be, prof)
		runBackend(t, &rep, be, specs, left, seed, prof, false)
	})
	clusters := &clusterSet{}
	defer clusters.down(t)
	for _, def := range clusterDefs {
		t.Run(def.name, func(t *testing.T) {
			url, ct := clusters.get(t, def)
			be := openBackendEnv(t, def, url, nil)
			be.proxy = false // several hosts, or a Sentinel that names the primary
			specs, left := clusterCells(be, ct, prof)
			runBackend(t, &rep, be, specs, left, seed, prof, false)
		})
	}

	rep.Duration = time.Since(began).Round(time.Second)
	t.Logf("safety: %d cells in %v (seed %d)", len(rep.Cells), rep.Duration, seed)
	if len(rep.Cells) > 0 {
		writeReports(t, rep)
	}
	if rep.Failed() {
		t.Errorf("safety report fails (seed %d):\n%s", seed, strings.Join(rep.Problems(), "\n"))
	}
}

// runBackend runs a backend's cells one after another, adds them to rep,
// and (minimums) checks that a full run of them made enough acquisitions
// and writes.
func runBackend(t *testing.T, rep *report.Report, be *backendEnv, specs []cellSpec, left []string, seed int64, prof profile, minimums bool) {
	for _, l := range left {
		t.Logf("%s: left out: %s", be.name, l)
		rep.Env["left out: "+be.name] = l
	}
	var acq, writes, ran int
	for _, spec := range specs {
		t.Run(spec.fault, func(t *testing.T) {
			ran++
			ctx, cancel := context.WithTimeout(context.Background(), prof.cellTimeout)
			defer cancel()
			rc, h, err := runCell(ctx, be, spec, seed, t.Logf)
			if rc.Backend != "" {
				rep.Cells = append(rep.Cells, rc)
				acq += rc.Result.Stats.Acquisitions
				writes += rc.Result.Stats.Writes
				t.Log(summary(rc))
			}
			if err != nil {
				t.Errorf("%v (seed %d)%s", err, seed, saveHistory(be.name, spec.fault, h))
				return
			}
			if p := rc.Problem(); p != "" {
				t.Errorf("%s (seed %d)%s", p, seed, saveHistory(be.name, spec.fault, h))
			}
		})
	}
	if ran == len(specs) && !t.Failed() {
		t.Logf("%s: %d acquisitions, %d fenced writes in %d cells", be.name, acq, writes, ran)
		if minimums && (acq < minAcquisitions || writes < minWrites) {
			t.Errorf("%s: %d acquisitions and %d writes; a run needs at least %d and %d",
				be.name, acq, writes, minAcquisitions, minWrites)
		}
	}
}

// openBackendEnv prepares a backend's cells: its URL, TTL and its own
// description.
func openBackendEnv(t *testing.T, def backendDef, raw string, te *cluster.Testenv) *backendEnv {
	be := &backendEnv{name: def.name, envVar: def.envVar, url: raw, ttl: def.ttl, slack: def.slack, proxy: true}
	if te.Owns(def.name, raw) {
		be.testenv = te
	}
	if strings.HasPrefix(raw, "zk://") {
		// The lock lives as long as the session: make it the TTL.
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("session_timeout", def.ttl.String())
		u.RawQuery = q.Encode()
		be.url = u.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, _, err := fencelock.OpenBackend(ctx, be.url)
	if err != nil {
		t.Fatalf("open %s: %v", def.name, err)
	}
	defer b.Close()
	be.rules = expectations
	_, waiter := b.(driver.Waiter)
	_, watcher := b.(driver.Watcher)
	be.waits = waiter || watcher
	if d, ok := b.(driver.Describer); ok {
		desc := d.Describe()
		be.claim = &desc
		be.rules = append(be.rules, claimedRules(desc)...)
	}
	return be
}

// summary is one line per cell for the test log.
func summary(c report.Cell) string {
	s := c.Result.Stats
	return fmt.Sprintf("%s/%s: %s in %v: %d rounds, %d acquisitions, %d writes (%d accepted), stale %d attempted / %d accepted, "+
		"detection margin p50 %v p99 %v, orphan p50 %v max %v, failed %v",
		c.Backend, c.Fault, c.Verdict, c.Duration, c.Rounds, s.Acquisitions, s.Writes, s.WritesAccepted,
		s.StaleAttempted, s.StaleAccepted, s.DetectionMargin.P50, s.DetectionMargin.P99, s.OrphanTime.P50, s.OrphanTime.Max,
		c.Result.Failed())
}

// saveHistory keeps a failed cell's history for inspection and returns a
// line saying where, with the first violations.
func saveHistory(backend, fault string, h history.History) string {
	if len(h) == 0 {
		return ""
	}
	f, err := os.CreateTemp("", "fencelock-safety-"+backend+"-"+fault+"-*.jsonl")
	if err != nil {
		return ""
	}
	defer f.Close()
	enc := history.NewEncoder(f)
	for _, ev := range h {
		enc.Encode(ev)
	}
	return "\nhistory: " + f.Name()
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
	for _, out := range []struct {
		path  string
		write func(*os.File) error
	}{
		{md, func(f *os.File) error { return report.WriteMarkdown(f, rep) }},
		{js, func(f *os.File) error { return report.WriteJSON(f, rep) }},
	} {
		f, err := os.Create(out.path)
		if err != nil {
			t.Error(err)
			continue
		}
		if err := out.write(f); err != nil {
			t.Error(err)
		}
		if err := f.Close(); err != nil {
			t.Error(err)
		}
		t.Logf("safety: report written to %s", out.path)
	}
}
