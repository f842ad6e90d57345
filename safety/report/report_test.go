package report

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/history"
)

// result returns a check result in which exactly the given properties
// failed, with staleAttempted stale writes.
func result(staleAttempted int, failed ...string) check.Result {
	var r check.Result
	for i := 1; i <= 8; i++ {
		id := fmt.Sprintf("P%d", i)
		p := check.Property{ID: id, Name: "name of " + id, Rule: "rule of " + id, OK: true, Checked: 3}
		for _, f := range failed {
			if f == id {
				p.OK, p.Count = false, 2
				p.Violations = []check.Violation{{Msg: "broke " + id + " | badly", Events: []history.Event{{T: 5, Proc: "c1", Kind: history.Acquired, Key: "k", Lease: "c1-1", Token: 3}}}}
			}
		}
		r.Properties = append(r.Properties, p)
	}
	r.Stats.StaleAttempted = staleAttempted
	r.Stats.Acquisitions = 300
	r.Stats.Writes = 3000
	return r
}

func TestClassify(t *testing.T) {
	redisRestart := Expectation{Unsafe: true, Properties: []string{"P1", "P2"}, Why: "counter lost", Fix: "appendfsync always"}
	pause := Expectation{Tolerate: []string{"P3"}}
	control := Expectation{Control: true, Properties: []string{"P1"}}
	cases := []struct {
		name    string
		r       check.Result
		e       Expectation
		want    Verdict
		problem bool
	}{
		{"all hold, no stale write", result(0), Expectation{}, Safe, false},
		{"all hold, stale writes rejected", result(12), Expectation{}, SafeWithFencing, false},
		{"tolerated overlap under a pause", result(0, "P3"), pause, SafeWithFencing, false},
		{"overlap where none is tolerated", result(0, "P3"), Expectation{}, UnsafeUnexpected, true},
		{"tolerated P3 does not excuse P1", result(5, "P1", "P3"), pause, UnsafeUnexpected, true},
		{"expected failures", result(3, "P1", "P2"), redisRestart, UnsafeExpected, false},
		{"part of the expected failures", result(3, "P2"), redisRestart, UnsafeExpected, false},
		{"expected cell that happened to hold", result(0), redisRestart, Safe, false},
		{"failure beyond the expected ones", result(3, "P2", "P5"), redisRestart, UnsafeUnexpected, true},
		{"unsafe with any property", result(0, "P7"), Expectation{Unsafe: true}, UnsafeExpected, false},
		{"control caught", result(40, "P1"), control, UnsafeExpected, false},
		{"control caught along with others", result(40, "P1", "P3"), control, UnsafeExpected, false},
		{"control not caught", result(40), control, SafeWithFencing, true},
		{"control caught the wrong property", result(40, "P3"), control, UnsafeExpected, true},
		{"control with any property, none failed", result(0), Expectation{Control: true}, Safe, true},
		{"control with any property, one failed", result(0, "P6"), Expectation{Control: true}, UnsafeExpected, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCell("redis", "fault", tc.r, tc.e)
			if c.Verdict != tc.want {
				t.Errorf("verdict %s, want %s", c.Verdict, tc.want)
			}
			if p := c.Problem(); (p != "") != tc.problem {
				t.Errorf("Problem() = %q, want a problem: %v", p, tc.problem)
			}
			r := Report{Cells: []Cell{NewCell("etcd", "x", result(0), Expectation{}), c}}
			if r.Failed() != tc.problem {
				t.Errorf("Report.Failed() = %v, want %v (problems %q)", r.Failed(), tc.problem, r.Problems())
			}
		})
	}
}

func TestTableLookup(t *testing.T) {
	tab := Table{
		{Backend: "redis", Fault: "server-restart", Expectation: Expectation{Unsafe: true, Why: "redis restart"}},
		{Backend: "*", Fault: "holder-pause", Expectation: Expectation{Tolerate: []string{"P3"}}},
		{Backend: "redis", Fault: "*", Expectation: Expectation{Why: "redis other"}},
	}
	cases := []struct{ b, f, why string }{
		{"redis", "server-restart", "redis restart"},
		{"redis", "holder-pause", ""}, // the pause rule comes first
		{"redis", "blackhole", "redis other"},
		{"postgres", "server-restart", ""},
	}
	for _, c := range cases {
		if got := tab.Lookup(c.b, c.f).Why; got != c.why {
			t.Errorf("Lookup(%s, %s).Why = %q, want %q", c.b, c.f, got, c.why)
		}
	}
	if got := tab.Lookup("etcd", "holder-pause").Tolerate; !reflect.DeepEqual(got, []string{"P3"}) {
		t.Errorf("wildcard backend: Tolerate = %v", got)
	}
	if got := tab.Lookup("etcd", "blackhole"); !reflect.DeepEqual(got, Expectation{}) {
		t.Errorf("no match: %+v, want the zero Expectation", got)
	}
}

func sample() Report {
	claim := &driver.Description{Name: "redis", Fencing: "per-key INCR counter", Clock: "server", Liveness: "TTL", Warnings: []string{"appendfsync everysec | not always"}}
	cells := []Cell{
		NewCell("postgres", "holder-pause", result(40, "P3"), Expectation{Tolerate: []string{"P3"}, Why: "a paused holder's belief outlives its lease"}),
		NewCell("postgres", "server-restart", result(0), Expectation{}),
		NewCell("redis", "holder-pause", result(35), Expectation{Tolerate: []string{"P3"}}),
		NewCell("redis", "server-restart", result(3, "P1", "P2"), Expectation{Unsafe: true, Properties: []string{"P1", "P2"},
			Why: "the token counter is lost with the last second of writes", Fix: "appendfsync always"}),
		NewCell("memory", "fencing-off", result(50, "P1"), Expectation{Control: true, Properties: []string{"P1"}}),
	}
	for i := range cells {
		cells[i].Seed = int64(100 + i)
		cells[i].Duration = 42 * time.Second
		cells[i].Rounds = 10
		cells[i].Config = check.Config{TTL: time.Second, Slack: 250 * time.Millisecond}
		if cells[i].Backend == "redis" {
			cells[i].Claim = claim
			cells[i].Setup = "appendfsync everysec"
		}
		cells[i].Result.Stats.DetectionMargin = check.Dist{N: 4, Min: 80 * time.Millisecond, P50: 95 * time.Millisecond, P99: 120 * time.Millisecond, Max: 130 * time.Millisecond}
	}
	st := &cells[1].Result.Stats // the engine's optional paths
	st.Rotations, st.RotatedAccepted, st.OldTokenWrites, st.BatchRenewals, st.MaxBatch, st.Waits = 4, 4, 4, 3, 2, 7
	return Report{
		Profile:  "quick",
		Seed:     7,
		Started:  time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Duration: 9 * time.Minute,
		Repro:    "cd safety && go test -run 'TestSafety/{backend}/{fault}' -args -safety.seed={seed}",
		Env:      map[string]string{"go": "go1.26"},
		Cells:    cells,
	}
}

func TestJSONRoundTrip(t *testing.T) {
	r := sample()
	var b bytes.Buffer
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	got, err := ReadJSON(&b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Errorf("round trip changed the report:\n got %+v\nwant %+v", got, r)
	}
	if _, err := ReadJSON(strings.NewReader("{")); err == nil {
		t.Error("ReadJSON accepted a truncated document")
	}
}

func TestMarkdown(t *testing.T) {
	r := sample()
	var b bytes.Buffer
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"Profile: **quick**, seed **7**",
		"| backend | holder-pause | server-restart |",
		"| postgres | safe-with-fencing | safe |",
		"| redis | safe-with-fencing | unsafe-expected |",
		"| memory | fencing-off | P1 | P1 | caught |",
		"| redis | per-key INCR counter | server | TTL | appendfsync everysec \\| not always | 2 |",
		"| redis | server-restart | appendfsync everysec | unsafe-expected | 10 | 300 | 0 | 3000 (0) | 3 / 0 | – | – | 0 | 95ms / 120ms |",
		"| postgres | server-restart | – | safe | 10 | 300 | 0 | 3000 (0) | 0 / 0 | 4 (4 / 0) | 3 (2) | 7 | 95ms / 120ms |",
		"### redis / server-restart: unsafe-expected",
		"Why: the token counter is lost with the last second of writes",
		"Fix: appendfsync always",
		"### redis / server-restart: P2 name of P2 (2)",
		"broke P2 | badly",
		"t=5 c1 acquired key=k lease=c1-1 token=3",
		"- **P4 name of P4.** rule of P4",
		"cd safety && go test -run 'TestSafety/redis/server-restart' -args -safety.seed=103",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	if strings.Contains(md, "FAILED") {
		t.Error("a passing report says it FAILED")
	}
	// Every table row has as many cells as its header.
	var cols int
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			cols = 0
			continue
		}
		n := strings.Count(strings.ReplaceAll(line, `\|`, ""), "|")
		if cols == 0 {
			cols = n
		} else if n != cols {
			t.Errorf("row has %d separators, header %d: %s", n, cols, line)
		}
	}

	r.Cells[1] = NewCell("postgres", "server-restart", result(0, "P5"), Expectation{})
	r.Cells[4] = NewCell("memory", "fencing-off", result(0), Expectation{Control: true, Properties: []string{"P1"}})
	b.Reset()
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	md = b.String()
	for _, want := range []string{
		"**This run FAILED:**",
		"- postgres/server-restart: UNSAFE-UNEXPECTED: P5 name of P5 (2 violations): broke P5 \\| badly",
		"- memory/fencing-off: negative control did not fail: P1 held (must fail)",
		"| postgres | safe-with-fencing | **UNSAFE-UNEXPECTED** |",
		"| memory | fencing-off | P1 | – | **NOT CAUGHT** |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("failing report lacks %q", want)
		}
	}
}

// TestMarkdownNotRun: requested cells that did not run are "not run" in
// the matrix (a new column where no cell of the fault ran; "*" marks the
// whole row) and listed with their reason; a report without any has no
// such section. ReproHint replaces the testenv sentence.
func TestMarkdownNotRun(t *testing.T) {
	r := sample()
	var b bytes.Buffer
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "## Not run") || strings.Contains(b.String(), "not run") {
		t.Error("a report without NotRun has a not-run section or cell")
	}
	if !strings.Contains(b.String(), "scripts/testenv") {
		t.Error("without ReproHint, the Reproduce section lost its testenv sentence")
	}
	r.NotRun = []NotRun{
		{Backend: "redis", Fault: "server-kill", Why: "no command | to kill it"},
		{Backend: "etcd", Fault: "*", Why: "open: connection refused"},
		{Backend: "redis", Fault: "control-fencing-off", Why: "time bound reached"},
	}
	r.ReproHint = "Rerun one cell:"
	b.Reset()
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"| backend | holder-pause | server-restart | server-kill |",
		"| postgres | safe-with-fencing | safe | – |",
		"| redis | safe-with-fencing | unsafe-expected | not run |",
		"| etcd | not run | not run | not run |",
		"## Not run",
		"| redis | server-kill | no command \\| to kill it |",
		"| etcd | * | open: connection refused |",
		"| redis | control-fencing-off | time bound reached |",
		"Rerun one cell:",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	if strings.Contains(md, "scripts/testenv") {
		t.Error("ReproHint did not replace the testenv sentence")
	}
}

// TestMarkdownPropertiesOfEveryCell: the Properties section lists every
// property some cell was judged by, not only the first cell's: a
// semaphore cell's S1 and S2 follow P1..P8.
func TestMarkdownPropertiesOfEveryCell(t *testing.T) {
	r := sample()
	sem := result(0)
	sem.Properties = append(sem.Properties, check.Property{ID: "S1", Name: "name of S1", Rule: "rule of S1", OK: true, Checked: 5})
	r.Cells = append(r.Cells, NewCell("redis", "sem-baseline", sem, Expectation{}))
	var b bytes.Buffer
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	p8, s1 := strings.Index(md, "- **P8 name of P8.**"), strings.Index(md, "- **S1 name of S1.** rule of S1")
	if p8 < 0 || s1 < p8 {
		t.Errorf("Properties section: P8 at %d, S1 at %d; want both, S1 after P8", p8, s1)
	}
	if n := strings.Count(md, "- **P1 name of P1.**"); n != 1 {
		t.Errorf("P1 listed %d times", n)
	}
}
