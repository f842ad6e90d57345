package suite_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	_ "github.com/fencelock/fencelock/backend/file"
	_ "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/safety/report"
	"github.com/fencelock/fencelock/safety/suite"
)

// TestMain is what a team's own TestMain looks like: the contenders are
// re-executions of this test binary.
func TestMain(m *testing.M) {
	suite.MainIfContender()
	goleak.VerifyTestMain(m)
}

// TestRun runs a small matrix through the public API against two
// backends a team could have: the file backend in a temporary directory
// (no server, and no host:port for the proxy) and a real Redis
// (FENCELOCK_TEST_REDIS; under CI=true its absence fails the test). It
// checks the verdicts, the numbers, what was not run and why, the files
// written to OutDir, and that the caller's expectation table comes before
// the built-in one.
func TestRun(t *testing.T) {
	redisURL := testenv.URL(t, "FENCELOCK_TEST_REDIS")
	fileURL := "file://" + t.TempDir()
	out := t.TempDir()
	cfg := suite.Config{
		Backends: []suite.Backend{{URL: fileURL}, {URL: redisURL}},
		Faults: []string{suite.FaultHolderKill, suite.FaultBlackhole, suite.FaultStaleOps,
			suite.FaultServerKill, suite.ControlFencingOff},
		Seed:   42,
		OutDir: out,
		// The team's own rule overrides the built-in one for the file
		// backend's fencing-off control: declared expected-safe, its
		// (certain) P1 failure must make it UNSAFE-UNEXPECTED and fail the
		// report on exactly this cell. Under the built-in rule alone it
		// would be a caught control.
		Expect: report.Table{{Backend: "file", Fault: suite.ControlFencingOff,
			Expectation: report.Expectation{Why: "test: declared safe"}}},
		Timeout: 2 * time.Minute,
		Logf:    t.Logf,
	}
	rep, err := suite.Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if rep.Seed != 42 || rep.Profile != "custom" {
		t.Errorf("report seed %d profile %q, want 42 and custom", rep.Seed, rep.Profile)
	}

	type bf struct{ backend, fault string }
	var ran []bf
	for _, c := range rep.Cells {
		ran = append(ran, bf{c.Backend, c.Fault})
		if c.Result.Stats.Acquisitions == 0 || c.Result.Stats.WritesAccepted == 0 {
			t.Errorf("%s/%s: %d acquisitions, %d accepted writes: the workload did not run",
				c.Backend, c.Fault, c.Result.Stats.Acquisitions, c.Result.Stats.WritesAccepted)
		}
		if c.Seed != 42 || c.Rounds == 0 && c.Fault != suite.FaultBaseline {
			t.Errorf("%s/%s: seed %d, %d rounds", c.Backend, c.Fault, c.Seed, c.Rounds)
		}
		switch {
		case c.Backend == "file" && c.Fault == suite.ControlFencingOff:
			if c.Verdict != report.UnsafeUnexpected || c.Expect.Control {
				t.Errorf("file/control-fencing-off: verdict %s, expectation %+v: the caller's rule was not applied first", c.Verdict, c.Expect)
			}
		case c.Fault == suite.ControlFencingOff:
			p1, _ := c.Result.Property("P1")
			if c.Verdict != report.UnsafeExpected || p1.OK || c.Problem() != "" {
				t.Errorf("%s/%s: verdict %s, P1 held %v, problem %q: the control must be caught",
					c.Backend, c.Fault, c.Verdict, p1.OK, c.Problem())
			}
		default:
			if c.Verdict != report.Safe && c.Verdict != report.SafeWithFencing {
				t.Errorf("%s/%s: verdict %s: %s", c.Backend, c.Fault, c.Verdict, c.Problem())
			}
			if c.Result.Stats.StaleAccepted != 0 {
				t.Errorf("%s/%s: %d stale writes accepted", c.Backend, c.Fault, c.Result.Stats.StaleAccepted)
			}
		}
	}
	want := []bf{
		{"file", suite.FaultHolderKill}, {"file", suite.FaultStaleOps}, {"file", suite.ControlFencingOff},
		{"redis", suite.FaultHolderKill}, {"redis", suite.FaultBlackhole}, {"redis", suite.FaultStaleOps}, {"redis", suite.ControlFencingOff},
	}
	if !slices.Equal(ran, want) {
		t.Errorf("cells run: %v, want %v", ran, want)
	}
	if c := rep.Cells[slices.Index(ran, bf{"redis", suite.FaultBlackhole})]; c.Result.Stats.Faults == 0 {
		t.Errorf("redis/blackhole: no fault recorded")
	}
	if got := rep.Problems(); len(got) != 1 || !strings.HasPrefix(got[0], "file/control-fencing-off: UNSAFE-UNEXPECTED: P1") {
		t.Errorf("Problems() = %q, want only file/control-fencing-off's", got)
	}

	notRun := map[bf]string{}
	for _, n := range rep.NotRun {
		notRun[bf{n.Backend, n.Fault}] = n.Why
	}
	for k, want := range map[bf]string{
		{"file", suite.FaultBlackhole}:   "host:port",
		{"file", suite.FaultServerKill}:  "--server-kill",
		{"redis", suite.FaultServerKill}: "--server-kill",
	} {
		if !strings.Contains(notRun[k], want) {
			t.Errorf("NotRun[%v] = %q, want a reason mentioning %q", k, notRun[k], want)
		}
	}
	if len(notRun) != 3 {
		t.Errorf("NotRun = %+v, want exactly 3 entries", rep.NotRun)
	}

	// The files: the report in both forms, the failed cell's history.
	md, err := os.ReadFile(filepath.Join(out, "safety.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## Matrix", "| file |", "not run", "## Not run", "This run FAILED"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("safety.md lacks %q", s)
		}
	}
	f, err := os.Open(filepath.Join(out, "safety.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	back, err := report.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Cells) != len(rep.Cells) || len(back.NotRun) != len(rep.NotRun) || back.Seed != 42 {
		t.Errorf("safety.json: %d cells, %d not run, seed %d; want %d, %d, 42", len(back.Cells), len(back.NotRun), back.Seed, len(rep.Cells), len(rep.NotRun))
	}
	hist, _ := filepath.Glob(filepath.Join(out, "histories", "*.jsonl"))
	if len(hist) != 1 || filepath.Base(hist[0]) != "file-control-fencing-off.jsonl" {
		t.Errorf("histories kept: %v, want only file-control-fencing-off.jsonl (the one failed cell)", hist)
	}
}

// TestRunErrors: a bad config is ErrConfig before anything runs; a backend
// that cannot be opened is ErrBackend, listed as not run, and its URL's
// secret is in neither the error nor the report.
func TestRunErrors(t *testing.T) {
	ctx := context.Background()
	for name, cfg := range map[string]suite.Config{
		"no backend":    {},
		"unknown fault": {Backends: []suite.Backend{{URL: "file:///tmp/x"}}, Faults: []string{"meteor-strike"}},
		"no URL":        {Backends: []suite.Backend{{Name: "a"}}},
		"same name":     {Backends: []suite.Backend{{Name: "a", URL: "file:///tmp/x"}, {Name: "a", URL: "file:///tmp/y"}}},
		"one control":   {Backends: []suite.Backend{{URL: "file:///tmp/x"}}, ControlRounds: 1},
	} {
		if _, err := suite.Run(ctx, cfg); !errors.Is(err, suite.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}

	// A time bound that has run out before the first cell: nothing runs,
	// everything is listed, ErrTimeBound.
	rep, err := suite.Run(ctx, suite.Config{Backends: []suite.Backend{{URL: "file://" + t.TempDir()}}, Timeout: time.Nanosecond})
	if !errors.Is(err, suite.ErrTimeBound) || len(rep.Cells) != 0 || len(rep.NotRun) != 1 || !strings.Contains(rep.NotRun[0].Why, "time bound") {
		t.Errorf("spent time bound: err %v, %d cells, not run %+v; want ErrTimeBound, none, the backend", err, len(rep.Cells), rep.NotRun)
	}

	// A cell whose harness gives up (here: its context ends as it
	// starts) judged nothing: it is in NotRun, with the reason, not left
	// out of the report.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rep, err = suite.Run(cctx, suite.Config{Backends: []suite.Backend{{URL: "file://" + t.TempDir()}},
		Faults: []string{suite.FaultHolderKill}, Logf: t.Logf,
		Cell: func(_, _ string, run func() suite.CellRun) { cancel(); run() }})
	if err == nil || len(rep.Cells) != 0 || len(rep.NotRun) != 1 || rep.NotRun[0].Fault != suite.FaultHolderKill ||
		!strings.Contains(rep.NotRun[0].Why, "could not run to the end") {
		t.Errorf("a cell that could not run: err %v, %d cells, not run %+v; want an error, none, the cell with its reason", err, len(rep.Cells), rep.NotRun)
	}

	const secret = "s3cr3t-pw"
	rep, err = suite.Run(ctx, suite.Config{Backends: []suite.Backend{{URL: "nosuchscheme://user:" + secret + "@127.0.0.1:1/x"}}, EnvURLs: true})
	if !errors.Is(err, suite.ErrBackend) {
		t.Fatalf("unknown scheme: %v, want ErrBackend", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error leaks the URL's password: %v", err)
	}
	if len(rep.Cells) != 0 || len(rep.NotRun) != 1 || rep.NotRun[0].Fault != "*" || rep.NotRun[0].Backend != "nosuchscheme" {
		t.Errorf("report: %d cells, not run %+v; want none and one entry for the whole backend", len(rep.Cells), rep.NotRun)
	}
	for _, n := range rep.NotRun {
		if strings.Contains(n.Why, secret) {
			t.Errorf("report leaks the URL's password: %q", n.Why)
		}
	}
	if u := rep.Env["url nosuchscheme"]; u == "" || strings.Contains(u, secret) {
		t.Errorf("report's URL %q: want it, redacted", u)
	}
}
