package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

// root is the repository root, from this package's directory.
const root = "../../.."

func generateFixture(t *testing.T) string {
	t.Helper()
	page, err := Generate(os.DirFS("testdata/results"))
	if err != nil {
		t.Fatal(err)
	}
	return string(page)
}

// row returns the table row of the page that starts with "| name |".
func row(t *testing.T, page, name string) string {
	t.Helper()
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, "| "+name+" |") {
			return l
		}
	}
	t.Fatalf("no row %q in:\n%s", name, page)
	return ""
}

// TestTableGivesMediansOfRuns checks the cells of the fixture's tables: a
// rate is the median of the runs' rates and a ratio the median of the
// runs' ratios with their range (not the ratio of the median rates), the
// reference library has 1, and a library missing from a workload has a
// dash.
func TestTableGivesMediansOfRuns(t *testing.T) {
	page := generateFixture(t)
	// Redis, 1 goroutine: fencelock 600, 640, 620 acq+rel/s and 0.90,
	// 0.80, 0.99 × raw (the ratio of the median rates would be 1.22).
	want := "| **fencelock** | 620 | 0.90 (0.80–0.99) | 2,550 | 0.68 (0.66–0.70) |"
	if got := row(t, page, "**fencelock**"); got != want {
		t.Errorf("fencelock's Redis row is\n%s\nwant\n%s", got, want)
	}
	if got, want := row(t, page, "raw"), "| raw | 510 | 1 | 3,880 | 1 |"; got != want {
		t.Errorf("raw's Redis row is\n%s\nwant\n%s", got, want)
	}
	// ZooKeeper, two runs: the median is the mean of both; raw is not in
	// the contended run, whose ratios are to zklock.
	zk := page[strings.Index(page, "## ZooKeeper"):]
	if got, want := row(t, zk, "raw"), "| raw | 1,000 | 1 | – | – |"; got != want {
		t.Errorf("raw's ZooKeeper row is\n%s\nwant\n%s", got, want)
	}
	if got, want := row(t, zk, "zklock"), "| zklock | 740 | 0.74 (0.70–0.78) | 45.0 | 1 |"; got != want {
		t.Errorf("zklock's ZooKeeper row is\n%s\nwant\n%s", got, want)
	}
	if !strings.Contains(zk, "| 8 contenders, one key: handoffs/s | × zklock |") {
		t.Errorf("the ZooKeeper table has no contended columns to zklock:\n%s", zk)
	}
}

// TestTableOrdersLibraries checks that raw comes first, then fencelock,
// then its variants, then the peers.
func TestTableOrdersLibraries(t *testing.T) {
	page := generateFixture(t)
	var got []string
	redis := page[strings.Index(page, "## Redis"):strings.Index(page, "## ZooKeeper")]
	for _, l := range strings.Split(redis, "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| library") {
			got = append(got, strings.TrimSpace(strings.Split(l, "|")[1]))
		}
	}
	want := []string{"raw", "**fencelock**", "fencelock-backend-only", "redislock", "redsync"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Redis rows %v, want %v", got, want)
	}
}

// TestPageSaysHowItWasMeasured checks that each table is followed by its
// run count, command, server, Go, CPUs and load, that a load above the CPU
// count is called out, and that only stores with results have a section.
func TestPageSaysHowItWasMeasured(t *testing.T) {
	page := generateFixture(t)
	want := "3 runs of `cd bench/redis && go test -run '^$' -bench '^BenchmarkInterleaved$' -benchtime 20x -count N .`; redis 7.0.15, go1.26.8, 2 CPUs (AMD EPYC); load average 4.69 at the start, 9.01 at the end."
	if !strings.Contains(page, want) {
		t.Errorf("the Redis table's note is missing; want %q in:\n%s", want, page)
	}
	redis, zk := page[strings.Index(page, "## Redis"):strings.Index(page, "## ZooKeeper")], page[strings.Index(page, "## ZooKeeper"):]
	const busyNote = "The load was above the CPU count"
	if !strings.Contains(redis, busyNote) {
		t.Errorf("the Redis run's load (4.69, 9.01 on 2 CPUs) is not called busy:\n%s", redis)
	}
	if strings.Contains(zk, busyNote) {
		t.Errorf("the ZooKeeper run's load (0.50, 1.50 on 2 CPUs) is called busy:\n%s", zk)
	}
	for _, absent := range []string{"## PostgreSQL", "## etcd", "## MongoDB"} {
		if strings.Contains(page, absent) {
			t.Errorf("the page has %q but the fixture has no results for it", absent)
		}
	}
}

// TestGenerateRefusesWhatItCannotDescribe checks that a results file of an
// unknown store, a library without a description, a file without
// benchmark lines and a folder without results are errors, not a page
// with gaps.
func TestGenerateRefusesWhatItCannotDescribe(t *testing.T) {
	line := "BenchmarkInterleaved/goroutines=1-2 1 1 ns/op 10 raw-ops/s 9 x-ops/s 0.9 x/raw\n"
	for name, files := range map[string]fstest.MapFS{
		"unknown store":     {"cassandra.txt": {Data: []byte(line)}},
		"unknown library":   {"redis.txt": {Data: []byte(line)}},
		"no benchmark line": {"redis.txt": {Data: []byte("go: go1.26\n")}},
		"no results":        {"README": {Data: []byte("x")}},
	} {
		if page, err := Generate(files); err == nil {
			t.Errorf("%s: Generate made a page:\n%s", name, page)
		}
	}
}

// TestPageIsGeneratedFromResults checks that docs/performance.md is what
// the generator makes of bench/results, so that the page cannot drift
// from its numbers (or be edited by hand).
func TestPageIsGeneratedFromResults(t *testing.T) {
	want, err := Generate(os.DirFS(filepath.Join(root, "bench/results")))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, "docs/performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/performance.md is not what bench/results make: run `go run ./internal/cmd/perfpage` at the repository root (and bench/run first, if the results are old)")
	}
}

// TestPageIsNoLabNotebook checks that the page, made of the real results,
// carries no date, commit hash, machine path or tracker number: the
// history is in git.
func TestPageIsNoLabNotebook(t *testing.T) {
	page, err := Generate(os.DirFS(filepath.Join(root, "bench/results")))
	if err != nil {
		t.Fatal(err)
	}
	for what, re := range map[string]*regexp.Regexp{
		"a date":           regexp.MustCompile(`\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b`),
		"a time of day":    regexp.MustCompile(`\b[0-2][0-9]:[0-5][0-9]\b`),
		"a commit hash":    regexp.MustCompile(`\b[0-9a-f]{7,40}\b`),
		"a machine path":   regexp.MustCompile(`/(work|home|root|tmp)/`),
		"a tracker number": regexp.MustCompile(`(?i)\b(issue|task) [0-9]+|#[0-9]+\b`),
	} {
		for _, m := range re.FindAllString(string(page), -1) {
			if what == "a commit hash" && !strings.ContainsAny(m, "0123456789") {
				continue // a word of the letters a-f
			}
			t.Errorf("the page has %s: %q", what, m)
		}
	}
}

// TestLinksToPageAnchorsExist checks that every link to
// performance.md#anchor in the README, docs and bench names a heading of
// the generated page.
func TestLinksToPageAnchorsExist(t *testing.T) {
	page, err := Generate(os.DirFS(filepath.Join(root, "bench/results")))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, l := range strings.Split(string(page), "\n") {
		if h, ok := strings.CutPrefix(l, "## "); ok {
			anchors[anchor(h)] = true
		}
	}
	link := regexp.MustCompile(`performance\.md#([A-Za-z0-9_-]+)`)
	files := []string{filepath.Join(root, "README.md")}
	for _, glob := range []string{"docs/*.md", "docs/*/*.md", "bench/*/*.go"} {
		m, _ := filepath.Glob(filepath.Join(root, glob))
		files = append(files, m...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			if !anchors[m[1]] {
				t.Errorf("%s links to performance.md#%s, which the page has no heading for", f, m[1])
			}
		}
	}
}

// anchor is GitHub's anchor of a heading: lower case, spaces to hyphens,
// other punctuation dropped.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ' || r == '-':
			b.WriteRune('-')
		case r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestTableShowsCostsBesideRates checks the columns beside the rates: a
// lone caller's latencies and the per-grant counts, medians of the runs,
// a dash for a library that did not report one.
func TestTableShowsCostsBesideRates(t *testing.T) {
	lines := "command: x\n" +
		"BenchmarkInterleaved/goroutines=1-2 1 1 ns/op 100 raw-acq+rel/s 1000 raw-p50-µs 3000 raw-p99-µs 90 fencelock-acq+rel/s 0.9 fencelock/raw 1100 fencelock-p50-µs 3500 fencelock-p99-µs\n" +
		"BenchmarkInterleaved/goroutines=1-2 1 1 ns/op 100 raw-acq+rel/s 1200 raw-p50-µs 3200 raw-p99-µs 90 fencelock-acq+rel/s 0.9 fencelock/raw 1300 fencelock-p50-µs 3700 fencelock-p99-µs\n" +
		"BenchmarkInterleaved/goroutines=16-2 1 1 ns/op 100 raw-acq+rel/s 2 raw-rtt/grant 4 raw-commands/grant 110 fencelock-acq+rel/s 1.1 fencelock/raw 0.5 fencelock-rtt/grant\n" +
		"BenchmarkInterleaved/goroutines=16-2 1 1 ns/op 100 raw-acq+rel/s 2 raw-rtt/grant 6 raw-commands/grant 110 fencelock-acq+rel/s 1.1 fencelock/raw 1.5 fencelock-rtt/grant\n"
	page, err := Generate(fstest.MapFS{"redis.txt": {Data: []byte(lines)}})
	if err != nil {
		t.Fatal(err)
	}
	p := string(page)
	head := "| library | 1 goroutine: acq+rel/s | × raw | p50 µs | p99 µs | 16 goroutines, a key each: acq+rel/s | × raw | round trips/grant | commands/grant |"
	if !strings.Contains(p, head) {
		t.Errorf("no heading %q in:\n%s", head, p)
	}
	for name, want := range map[string]string{
		"raw":           "| raw | 100 | 1 | 1,100 | 3,100 | 100 | 1 | 2.00 | 5.00 |",
		"**fencelock**": "| **fencelock** | 90.0 | 0.90 (0.90–0.90) | 1,200 | 3,600 | 110 | 1.10 (1.10–1.10) | 1.00 | – |",
	} {
		if got := row(t, p, name); got != want {
			t.Errorf("row\n%s\nwant\n%s", got, want)
		}
	}
}

// TestTableShowsCostsPerHandoff checks that a contended workload's
// per-handoff counts get their columns beside its hand-off rates.
func TestTableShowsCostsPerHandoff(t *testing.T) {
	lines := "command: x\n" +
		"BenchmarkInterleavedContended-2 1 1 ns/op 100 zklock-handoffs/s 5 zklock-requests/handoff 5 zklock-rtt/handoff 60 fencelock-handoffs/s 0.6 fencelock/zklock 11 fencelock-requests/handoff 10 fencelock-rtt/handoff\n"
	page, err := Generate(fstest.MapFS{"zookeeper.txt": {Data: []byte(lines)}})
	if err != nil {
		t.Fatal(err)
	}
	p := string(page)
	for _, h := range []string{"round trips/hand-off", "server requests/hand-off"} {
		if !strings.Contains(p, "| "+h+" |") {
			t.Errorf("no column %q in:\n%s", h, p)
		}
	}
	if got := row(t, p, "**fencelock**"); !strings.Contains(got, "| 10.00 | 11.00 |") {
		t.Errorf("fencelock's row %q lacks its round trips and requests per hand-off", got)
	}
}
