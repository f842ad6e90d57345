//go:build linux

package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/safety/report"
)

// readReport reads the JSON report `fencelock safety` wrote to dir.
func readReport(t *testing.T, dir string) report.Report {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "safety.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := report.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestSafetyCommand runs `fencelock safety` as a user would, on two
// backends: the file backend (no server; its --server-kill is a command
// that leaves a mark, so the server-kill cell runs) and a real Redis
// (FENCELOCK_TEST_REDIS; a failure under CI=true when missing), with an
// expectation file. The contenders are re-executions of the fencelock
// binary. It checks the exit status, the seed printed, the cells and
// their verdicts in the JSON report, what was not run, the kept history
// and that the expectation file was applied.
func TestSafetyCommand(t *testing.T) {
	redisURL := testenv.URL(t, "FENCELOCK_TEST_REDIS")
	f := newFixture(t)
	out := filepath.Join(f.dir, "report")
	mark := filepath.Join(f.dir, "killed")
	expect := filepath.Join(f.dir, "expect.json")
	// A rule that cannot hold: file/holder-kill declared a negative
	// control that must fail P1 (the cell is safe). The report must fail
	// on it, and only on it: exit status 1.
	if err := os.WriteFile(expect, []byte(`[{"backend": "file", "fault": "holder-kill",
		"expectation": {"control": true, "properties": ["P1"], "why": "test rule"}}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := f.run("safety",
		"--url", "file="+f.url, "--server-kill", "touch "+mark,
		"--url", redisURL,
		"--faults", "holder-kill,blackhole,server-kill", "--seed", "7", "--out", out, "--expect", expect, "--timeout", "100s")
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	if code != exitSafetyFailed {
		t.Fatalf("exit status %d, want %d (the expectation file's rule fails the report)", code, exitSafetyFailed)
	}
	if !strings.Contains(stderr, "seed 7 (rerun with --seed 7)") {
		t.Errorf("the seed is not printed first")
	}
	if !strings.Contains(stderr, "file/holder-kill: negative control did not fail") {
		t.Errorf("stderr does not name the failing cell")
	}
	if _, err := os.Stat(mark); err != nil {
		t.Errorf("--server-kill command did not run: %v", err)
	}
	rep := readReport(t, out)
	if rep.Seed != 7 {
		t.Errorf("report seed %d, want 7", rep.Seed)
	}
	var ran []string
	for _, c := range rep.Cells {
		ran = append(ran, c.Backend+"/"+c.Fault)
		if c.Result.Stats.Acquisitions == 0 || c.Result.Stats.WritesAccepted == 0 {
			t.Errorf("%s/%s: no workload", c.Backend, c.Fault)
		}
		if c.Backend+"/"+c.Fault == "file/holder-kill" {
			continue // judged by the test rule
		}
		if c.Verdict != report.Safe && c.Verdict != report.SafeWithFencing {
			t.Errorf("%s/%s: verdict %s: %s", c.Backend, c.Fault, c.Verdict, c.Problem())
		}
	}
	if want := []string{"file/holder-kill", "file/server-kill", "redis/holder-kill", "redis/blackhole"}; !slices.Equal(ran, want) {
		t.Errorf("cells %v, want %v", ran, want)
	}
	if p := rep.Problems(); len(p) != 1 {
		t.Errorf("problems %q, want only file/holder-kill's", p)
	}
	var skipped []string
	for _, n := range rep.NotRun {
		skipped = append(skipped, n.Backend+"/"+n.Fault)
	}
	if want := []string{"file/blackhole", "redis/server-kill"}; !slices.Equal(skipped, want) {
		t.Errorf("not run %v, want %v", skipped, want)
	}
	if _, err := os.Stat(filepath.Join(out, "histories", "file-holder-kill.jsonl")); err != nil {
		t.Errorf("the failed cell's history is not kept: %v", err)
	}
	md, err := os.ReadFile(filepath.Join(out, "safety.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Columns server-kill, holder-kill, blackhole (file/holder-kill is a
	// control by the test rule, so it is not in the matrix).
	if !strings.Contains(string(md), "| redis | not run | safe | safe |") || !strings.Contains(string(md), "## Not run") {
		t.Errorf("safety.md lacks the matrix or the not-run section:\n%s", md)
	}
	for _, s := range []string{"BACKEND", "redis", "blackhole", "not run", "safety.json"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("stdout lacks %q", s)
		}
	}
}

// TestSafetyCommandExit: a clean run exits 0; a backend that cannot be
// opened exits 69 and its URL's password appears nowhere (output, report);
// bad flags exit 64.
func TestSafetyCommandExit(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "ok")
	if _, stderr, code := f.run("safety", "--url", f.url, "--faults", "baseline", "--baseline", "1s", "--out", out); code != exitOK {
		t.Errorf("clean run: exit %d, want 0\n%s", code, stderr)
	} else if rep := readReport(t, out); len(rep.Cells) != 1 || rep.Cells[0].Verdict != report.Safe {
		t.Errorf("clean run: cells %+v, want one safe baseline", rep.Cells)
	}

	const secret = "s3cr3t-Pw"
	bad := filepath.Join(f.dir, "bad")
	stdout, stderr, code := f.run("safety", "--url", "postgres://app:"+secret+"@127.0.0.1:1/x?connect_timeout=2", "--faults", "baseline", "--out", bad)
	if code != exitUnavailable {
		t.Errorf("unreachable backend: exit %d, want %d\n%s", code, exitUnavailable, stderr)
	}
	files, _ := filepath.Glob(filepath.Join(bad, "*"))
	texts := []string{stdout, stderr}
	for _, p := range files {
		b, _ := os.ReadFile(p)
		texts = append(texts, string(b))
	}
	for i, s := range texts {
		if strings.Contains(s, secret) {
			t.Errorf("output %d leaks the URL's password:\n%s", i, s)
		}
	}
	if len(files) != 2 {
		t.Errorf("report files %v, want safety.md and safety.json", files)
	}

	for _, args := range [][]string{
		{"safety"},
		{"safety", "--server-kill", "true", "--url", f.url},
		{"safety", "--url", f.url, "--faults", "meteor"},
		{"safety", "--url", f.url, "--rounds", "0"},
		{"safety", "--url", f.url, "--expect", filepath.Join(f.dir, "missing.json")},
	} {
		if _, stderr, code := f.run(args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", args, code, exitUsage, stderr)
		}
	}
}
