// Command perfpage writes docs/performance.md from the benchmark results
// that bench/run leaves in bench/results, one file per store:
//
//	bench/run                       # or: bench/run redis etcd
//	go run ./internal/cmd/perfpage  # from the repository root
//
// Each results file is the raw `go test -bench` output of one store's
// interleaved benchmark, headed by "key: value" lines (command, go, cpus,
// server, load-start, load-end, runs), so benchstat reads it too. The page
// gives, per store, one table of the median rate of every library and the
// median of its per-run ratio to the run's reference (the raw store
// operations), with the range of that ratio.
//
// The page is what this command makes of the results and nothing else: a
// test of this package checks that docs/performance.md is the command's
// output for bench/results, so the page cannot drift from its numbers.
// What the page says about each store and library (its raw operations,
// what a peer lacks) is in this file, next to the code that prints it.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	results := flag.String("results", "bench/results", "the folder of bench/run's STORE.txt files")
	out := flag.String("o", "docs/performance.md", "the page to write")
	flag.Parse()
	page, err := Generate(os.DirFS(*results))
	if err != nil {
		fmt.Fprintln(os.Stderr, "perfpage:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, page, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "perfpage:", err)
		os.Exit(1)
	}
}

// store is what the page says about one store beside its numbers.
type store struct {
	file  string // the results file's name without .txt, bench/<file>
	title string // the page's heading, whose anchor other pages link to
	raw   string // what raw does, and what it leaves out
	// libs describes every library of the store's results but raw and
	// fencelock: a variant of fencelock, or a peer and what it lacks.
	libs map[string]string
	// noPeer, if not empty, says why no peer library is compared.
	noPeer string
	// note, if not empty, is said under the descriptions.
	note string
}

// stores are the stores in the order of the page. A results file of a
// store not listed here is an error: its table would have no words.
var stores = []store{
	{
		file: "postgres", title: "PostgreSQL",
		raw: "an `INSERT … ON CONFLICT DO UPDATE … WHERE expired` upsert that takes a sequence value, and a `DELETE` guarded by owner and token, on a table of fencelock's shape and a pool of 16 connections: no renewal, no loss signal, no waiting without polling.",
		libs: map[string]string{
			"backend":              "the backend's `Acquire` and `Release` alone, without the engine (no lease, renewal or loss watch).",
			"fencelock-nocoalesce": "fencelock on the same URL with `coalesce=off`: every acquire and release alone, as before coalescing.",
			"pglock":               "[cirello.io/pglock](https://github.com/cirello-io/pglock) with its defaults, on lib/pq (the only driver it accepts) and a pool of raw's 16 connections: no fencing token (its record version number is a cycling sequence value only its own statements check), and a blocking acquire that sleeps its lease (20 s) between attempts.",
		},
		note: "With 16 goroutines, fencelock coalesces the acquires and releases that meet in one Client into one statement each (docs/internals.md, \"Coalescing\"): one commit, so one WAL flush, for a batch of grants, where raw and the peers commit each grant alone. A lone caller's acquire goes alone, as before.",
	},
	{
		file: "redis", title: "Redis",
		raw: "`SET NX PX` with a random value and a compare-and-delete script: no fencing token, no renewal, no loss signal.",
		libs: map[string]string{
			"fencelock-backend-only": "the backend's `Acquire` and `Release` alone, without the engine, a backend per goroutine.",
			"fencelock-nocoalesce":   "fencelock on the same URL with `coalesce=off`: every acquire and release alone, as before coalescing.",
			"redislock":              "[bsm/redislock](https://github.com/bsm/redislock): no fencing token (its value is random), no signal when the lock is lost, retries on a timer.",
			"redsync":                "[go-redsync/redsync](https://github.com/go-redsync/redsync) on one server: no fencing token, no loss signal (you extend before `Until()`), retries on a timer.",
		},
		note: "The server has `appendfsync always`: every acknowledged write is on disk, for fencelock and the peers alike. Redis does not count its AOF fsyncs; it makes at most one per event-loop iteration that wrote, so at most one per server read. With 16 goroutines fencelock sends the acquires and releases that meet in one Client as one pipeline of scripts (fewer round trips per grant); Redis already writes the AOF once per event-loop iteration for every connection, so batching saves no fsync, and on a machine where the client and the server share two cores the scripts' CPU sets the rate.",
	},
	{
		file: "redis-stock", title: "Redis, default persistence",
		raw: "as on the durable Redis above.",
		libs: map[string]string{
			"fencelock-backend-only": "as above.",
			"fencelock-nocoalesce":   "as above.",
			"redislock":              "as above.",
			"redsync":                "as above.",
		},
		note: "The server runs its distribution's default persistence (RDB snapshots, no AOF: `scripts/testenv`'s redis-stock), as many installations do: an acknowledged lock can be lost in a crash, and the scripts' CPU, not the disk, bounds the rates.",
	},
	{
		file: "etcd", title: "etcd",
		raw: "a put-if-absent transaction on one lease granted (and kept alive) for the run, and a delete guarded by the create revision: no queue for waiters, no token floor, one lease for every key.",
		libs: map[string]string{
			"fencelock-backend-only":   "the backend's `Acquire` and `Release` alone, without the engine, a backend (and connection) per goroutine.",
			"fencelock-backend-shared": "the backend's `Acquire` and `Release` alone, without the engine, one backend (and connection) shared by the goroutines, as the engine's client has.",
			"concurrency.Mutex":        "etcd's `concurrency.Mutex` on a reused session per goroutine: no token meant for resources outside etcd, no other store; a retried unlock can delete a newer holder.",
		},
		note: "fencelock sends etcd the same two transactions per grant as `concurrency.Mutex` (Raft proposals and WAL fsyncs per grant are equal), on one connection. Its transactions carry more compares (an empty queue and the token floor on acquire; the owner and the lock-delay marker on release), each evaluated by etcd, and the engine adds client work (lease, loss watch): where the client and etcd share two cores, that CPU sets the rate. etcd's batch form, a transaction, is all-or-nothing on its compares, so grants are not coalesced here.",
	},
	{
		file: "zookeeper", title: "ZooKeeper",
		raw: "create an `EPHEMERAL_SEQUENTIAL` znode under the key and delete it: the store's two writes, excluding nobody (it cannot wait, so it is not in the contended run).",
		libs: map[string]string{
			"zklock": "go-zookeeper's `zk.Lock`: no fencing token, no try (it can only wait), no signal when the session is lost.",
		},
		note: "In the contended run every hand-off makes the same two writes (create, delete) for fencelock and `zk.Lock`; fencelock's extra requests are reads and a sync, which no disk write follows. Before it queues, the engine tries once (a look at the queue and its head, and the token floor to name the holder's token in the refusal); once first in the queue, the token is proved (a listing, a `sync` with the leader so that a floor raised anywhere is seen, and the floor's read): `zk.Lock` hands out no token and does neither. A ZooKeeper multi is atomic, so grants are not coalesced here.",
	},
	{
		file: "mongo", title: "MongoDB",
		raw: "insert `{_id: key, owner, expiresAt}` and delete it by `_id` and owner, with the backend's write concern (majority, journaled): no fencing token, no expiry handling.",
		libs: map[string]string{
			"backend": "the backend's `Acquire` and `Release` alone, without the engine (no lease, renewal or loss watch).",
		},
		noPeer: "No peer library is compared.",
	},
	{
		file: "mysql", title: "MySQL/MariaDB",
		raw: "one autocommit `INSERT … ON DUPLICATE KEY UPDATE` that takes a free or expired key with a per-key token, and a `DELETE` guarded by owner, on an InnoDB table and a pool of 16 connections: no stored procedure, no store-wide token counter, no lock delay, no renewal, no loss signal.",
		libs: map[string]string{
			"backend": "the backend's `Acquire` and `Release` alone, without the engine (no lease, renewal or loss watch).",
		},
		noPeer: "No peer library: the usual Go answer, `GET_LOCK()`, is tied to one connection and carries no fencing token.",
	},
	{
		file: "nats", title: "NATS",
		raw: "a key-value `Create` with a per-key TTL and a `Delete` guarded by the revision it returned, on a bucket of the same shape (one value per key, per-message TTLs): no fencing token beyond the revision, no token floor, no renewal, no loss signal.",
		libs: map[string]string{
			"fencelock-backend-only": "the backend's `Acquire` and `Release` alone, without the engine, a backend (and connection) per goroutine.",
		},
		noPeer: "No peer library is compared.",
	},
}

// workloadLabels names the workloads of the benchmarks bench/run runs.
var workloadLabels = map[string]string{
	"InterleavedContended": "8 contenders, one key",
}

// Result is one store's results file.
type Result struct {
	Store  string
	Header map[string]string // the "key: value" lines
	// Benches are the benchmarks in the order of their first line, each
	// with one Run per line.
	Benches []*Bench
}

// Bench is one benchmark (or sub-benchmark) of a results file.
type Bench struct {
	Name string // without "Benchmark" and the "-GOMAXPROCS" suffix
	Runs []map[string]float64
}

var (
	headerLine = regexp.MustCompile(`^([a-z][a-z0-9-]*): (.*)$`)
	procs      = regexp.MustCompile(`-[0-9]+$`)
)

// Parse reads one results file of store.
func Parse(storeName string, r io.Reader) (*Result, error) {
	res := &Result{Store: storeName, Header: map[string]string{}}
	byName := map[string]*Bench{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "Benchmark") {
			f := strings.Fields(line)
			if len(f) < 2 || len(f)%2 != 0 {
				return nil, fmt.Errorf("%s.txt:%d: not a benchmark line of name, iterations and value-unit pairs", storeName, n)
			}
			name := procs.ReplaceAllString(strings.TrimPrefix(f[0], "Benchmark"), "")
			run := map[string]float64{}
			for i := 2; i < len(f); i += 2 {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					return nil, fmt.Errorf("%s.txt:%d: %q is not a number", storeName, n, f[i])
				}
				run[f[i+1]] = v
			}
			b := byName[name]
			if b == nil {
				b = &Bench{Name: name}
				byName[name] = b
				res.Benches = append(res.Benches, b)
			}
			b.Runs = append(b.Runs, run)
			continue
		}
		if m := headerLine.FindStringSubmatch(line); m != nil {
			res.Header[m[1]] = m[2]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(res.Benches) == 0 {
		return nil, fmt.Errorf("%s.txt has no benchmark lines: run bench/run %s", storeName, storeName)
	}
	return res, nil
}

// workload is one benchmark's numbers, per library.
type workload struct {
	label string
	unit  string // of the rates: acq+rel/s, ops/s, handoffs/s
	ref   string // the library the ratios are to
	rates map[string][]float64
	ratio map[string][]float64 // to ref, per run
	// extra holds, per column of extras, each library's values.
	extra map[string]map[string][]float64
}

// extras are the metrics a workload may report per library beside its
// rate ("<lib>-<metric>"), in the order of their columns, and their
// headings: a lone caller's latency, and what a grant or a hand-off costs
// (counted by benchkit.Counted).
var extras = []struct{ metric, heading string }{
	{"p50-µs", "p50 µs"},
	{"p99-µs", "p99 µs"},
	{"rtt/grant", "round trips/grant"},
	{"wal-syncs/grant", "WAL syncs/grant"},
	{"wal-records/grant", "WAL records/grant"},
	{"server-reads/grant", "server reads/grant"},
	{"commands/grant", "commands/grant"},
	{"net-bytes/grant", "bytes/grant"},
	{"requests/grant", "server requests/grant"},
	{"proposals/grant", "Raft proposals/grant"},
	{"wal-fsyncs/grant", "WAL fsyncs/grant"},
	{"fsyncs/grant", "log fsyncs/grant"},
	{"client-cpu-µs/grant", "client CPU µs/grant"},
	{"server-cpu-µs/grant", "server CPU µs/grant"},
	{"rtt/handoff", "round trips/hand-off"},
	{"requests/handoff", "server requests/hand-off"},
	{"writes/handoff", "writes/hand-off"},
	{"reads/handoff", "reads/hand-off"},
	{"fsyncs/handoff", "log fsyncs/hand-off"},
	{"client-cpu-µs/handoff", "client CPU µs/hand-off"},
	{"server-cpu-µs/handoff", "server CPU µs/hand-off"},
}

// split finds the libraries of b: a rate metric is "<lib>-<unit>/s", a
// ratio "<lib>/<ref>" of two of them.
func split(b *Bench) (*workload, error) {
	w := &workload{label: label(b.Name), rates: map[string][]float64{}, ratio: map[string][]float64{}}
	for _, run := range b.Runs {
		for unit, v := range run {
			if !strings.HasSuffix(unit, "/s") {
				continue
			}
			i := strings.LastIndex(unit, "-")
			if i <= 0 {
				continue
			}
			lib, u := unit[:i], unit[i+1:]
			if w.unit != "" && w.unit != u {
				return nil, fmt.Errorf("%s reports rates in %s and %s", b.Name, w.unit, u)
			}
			w.unit = u
			w.rates[lib] = append(w.rates[lib], v)
		}
	}
	for _, run := range b.Runs {
		for unit, v := range run {
			lib, ref, ok := strings.Cut(unit, "/")
			if !ok || w.rates[lib] == nil || w.rates[ref] == nil {
				continue
			}
			if w.ref != "" && w.ref != ref {
				return nil, fmt.Errorf("%s reports ratios to %s and to %s", b.Name, w.ref, ref)
			}
			w.ref = ref
			w.ratio[lib] = append(w.ratio[lib], v)
		}
	}
	w.extra = map[string]map[string][]float64{}
	for _, run := range b.Runs {
		for metric, v := range run {
			for lib := range w.rates {
				rest, ok := strings.CutPrefix(metric, lib+"-")
				if !ok || !slices.ContainsFunc(extras, func(e struct{ metric, heading string }) bool { return e.metric == rest }) {
					continue
				}
				if w.extra[rest] == nil {
					w.extra[rest] = map[string][]float64{}
				}
				w.extra[rest][lib] = append(w.extra[rest][lib], v)
			}
		}
	}
	if len(w.rates) < 2 || w.ref == "" {
		return nil, fmt.Errorf("%s is not an interleaved benchmark (no rates per library and ratios to one of them)", b.Name)
	}
	for lib, rs := range w.rates {
		if len(rs) != len(b.Runs) || lib != w.ref && len(w.ratio[lib]) != len(b.Runs) {
			return nil, fmt.Errorf("%s: %s is missing from some runs", b.Name, lib)
		}
	}
	return w, nil
}

var goroutines = regexp.MustCompile(`goroutines=([0-9]+)$`)

// label names the workload of the benchmark called name.
func label(name string) string {
	if m := goroutines.FindStringSubmatch(name); m != nil {
		if m[1] == "1" {
			return "1 goroutine"
		}
		return m[1] + " goroutines, a key each"
	}
	if l, ok := workloadLabels[name]; ok {
		return l
	}
	return name
}

// order sorts the libraries of a table: the first workload's reference,
// then fencelock and its variants, then the peers, each group by name.
func order(ws []*workload) []string {
	rank := func(lib string) int {
		switch {
		case lib == ws[0].ref:
			return 0
		case lib == "fencelock":
			return 1
		case strings.Contains(lib, "fencelock") || lib == "backend":
			return 2
		}
		return 3
	}
	var libs []string
	for _, w := range ws {
		for lib := range w.rates {
			if !slices.Contains(libs, lib) {
				libs = append(libs, lib)
			}
		}
	}
	slices.SortFunc(libs, func(a, b string) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	return libs
}

// Median returns the median of v (the mean of the middle two if their
// number is even); v is not changed.
func Median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// rate formats a rate: whole numbers with thousands separators from 100
// on, one decimal below.
func rate(v float64) string {
	if v < 100 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// figure formats a per-grant count or a latency: like rate from 100 on,
// two decimals below.
func figure(v float64) string {
	if v >= 100 {
		return rate(v)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// ratio formats the median of the per-run ratios v and their range.
func ratio(v []float64) string {
	lo, hi := slices.Min(v), slices.Max(v)
	return fmt.Sprintf("%.2f (%.2f–%.2f)", Median(v), lo, hi)
}

// Generate returns the page for the results files (STORE.txt) in dir.
func Generate(dir fs.FS) ([]byte, error) {
	var (
		results []*Result
		known   = map[string]bool{}
	)
	for _, s := range stores {
		known[s.file+".txt"] = true
		f, err := dir.Open(s.file + ".txt")
		if errors.Is(err, os.ErrNotExist) {
			results = append(results, nil)
			continue
		}
		if err != nil {
			return nil, err
		}
		r, err := Parse(s.file, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	entries, err := fs.ReadDir(dir, ".")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".txt") && !known[n] {
			return nil, fmt.Errorf("results file %s is of no store the page describes: add it to perfpage's stores", n)
		}
	}
	if !slices.ContainsFunc(results, func(r *Result) bool { return r != nil }) {
		return nil, errors.New("no results files (STORE.txt): run bench/run first")
	}

	var b bytes.Buffer
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# Performance\n\n")
	p("<!-- Generated by `go run ./internal/cmd/perfpage` from bench/results, which `bench/run` writes. Do not edit: run both. -->\n\n")
	p(intro)
	for i, s := range stores {
		r := results[i]
		if r == nil {
			continue
		}
		if err := storeSection(&b, s, r); err != nil {
			return nil, fmt.Errorf("%s.txt: %w", s.file, err)
		}
	}
	p(regenerate)
	return b.Bytes(), nil
}

const intro = `How fast fencelock takes and releases a lock on each store, next to the
same work done with the store's raw operations and with the peer
libraries. Each store's table comes from one ` + "`go test -bench`" + ` command
(bench/STORE), measured this way:

- **Same run, interleaved.** ` + "`benchkit.Interleaved`" + ` gives every library in
  turn a round of acquire+release cycles, round after round, each round
  starting with the next library, so that all of them meet the same load
  on a shared machine. The run is repeated; a rate is the median of the
  runs, and **× raw** is the median of each run's ratio to raw, its range
  in parentheses (ZooKeeper's contended run is compared with ` + "`zk.Lock`" + `).
  Rates move with the machine and its load, given under each table;
  ratios within one run much less.
- **As a user gets it.** fencelock is ` + "`fencelock.Open(ctx, URL, nil)`" + ` on the
  server's URL: default pool, TTL (15 s), renewal and key prefix; only a
  fresh table (PostgreSQL) or collection (MongoDB) is added. Every lease
  passes a ` + "`fencelock.Fence`" + `, so a token that does not increase fails the run.
- **raw** is the least a lock needs on the store, without what fencelock
  adds (fencing token, renewal, loss signal, waiting without polling);
  each store's section says what it does. The peers give less than
  fencelock too; each section says what.
- **Workloads.** One goroutine acquiring and releasing its key, and 16
  goroutines of one process, each on its own key (PostgreSQL: a new key
  every time). ZooKeeper also runs 8 contenders taking turns on one key
  (hand-offs, compared with ` + "`zk.Lock`" + `); the other stores' contended
  benchmarks (` + "`BenchmarkContended8`" + `, ` + "`BenchmarkContended`" + ` in
  bench/STORE) run each library on its own and are not reported here.
- **Beside the rates.** With one goroutine, the p50 and p99 latency of an
  acquire+release, over all rounds. Where a store's run counts them
  (` + "`benchkit.Counted`" + `: after the timed rounds, each library runs once
  more through a proxy that counts round trips), what a grant (an
  acquire and its release) costs with 16 goroutines: the client's round
  trips, and the store's own counters (PostgreSQL's WAL syncs and
  records, Redis's reads, commands and bytes), medians of the runs. The
  store's counters include whatever else it served meanwhile.
- **Durable servers.** The servers are ` + "`scripts/testenv`" + `'s: PostgreSQL
  with fsync and synchronous commit, Redis with ` + "`appendfsync always`" + `
  (and, as a store of its own, Redis in its distribution's default
  persistence), etcd and ZooKeeper fsyncing every write; rates follow
  the disk.

`

const regenerate = `## Regenerate

` + "```" + `
bench/run                       # every store; or: bench/run redis etcd
go run ./internal/cmd/perfpage  # bench/results/*.txt -> docs/performance.md
` + "```" + `

` + "`bench/run`" + ` starts the servers it needs with ` + "`scripts/testenv`" + ` unless their
variables are set, and writes each store's raw ` + "`go test -bench`" + ` output to
bench/results/STORE.txt (benchstat reads it). ` + "`COUNT`" + ` sets the runs per
store (default 6); ` + "`FENCELOCK_BENCH_MINUTES`" + ` the budget for all stores
(default 25), shared equally: a store whose runs would exceed its share
stops early, and its table says how many runs it has. Older measurements
are in the history of bench/results and of this page.
`

// storeSection writes the section of store s.
func storeSection(b *bytes.Buffer, s store, r *Result) error {
	var ws []*workload
	for _, bn := range r.Benches {
		w, err := split(bn)
		if err != nil {
			return err
		}
		ws = append(ws, w)
	}
	libs := order(ws)
	fmt.Fprintf(b, "## %s\n\n", s.title)
	fmt.Fprintf(b, "- **raw**: %s\n", s.raw)
	for _, lib := range libs {
		if lib == "raw" || lib == "fencelock" {
			continue
		}
		d, ok := s.libs[lib]
		if !ok {
			return fmt.Errorf("library %s has no description: add it to perfpage's stores", lib)
		}
		fmt.Fprintf(b, "- **%s**: %s\n", lib, d)
	}
	if s.noPeer != "" {
		fmt.Fprintf(b, "\n%s\n", s.noPeer)
	}
	if s.note != "" {
		fmt.Fprintf(b, "\n%s\n", s.note)
	}
	b.WriteString("\n| library |")
	sep := "\n|---|"
	for _, w := range ws {
		fmt.Fprintf(b, " %s: %s | × %s |", w.label, w.unit, w.ref)
		sep += "---:|---:|"
		for _, e := range extras {
			if w.extra[e.metric] != nil {
				fmt.Fprintf(b, " %s |", e.heading)
				sep += "---:|"
			}
		}
	}
	b.WriteString(sep + "\n")
	for _, lib := range libs {
		name := lib
		if lib == "fencelock" {
			name = "**fencelock**"
		}
		fmt.Fprintf(b, "| %s |", name)
		for _, w := range ws {
			switch {
			case w.rates[lib] == nil:
				b.WriteString(" – | – |")
			case lib == w.ref:
				fmt.Fprintf(b, " %s | 1 |", rate(Median(w.rates[lib])))
			default:
				fmt.Fprintf(b, " %s | %s |", rate(Median(w.rates[lib])), ratio(w.ratio[lib]))
			}
			for _, e := range extras {
				if w.extra[e.metric] == nil {
					continue
				}
				if v := w.extra[e.metric][lib]; v != nil {
					fmt.Fprintf(b, " %s |", figure(Median(v)))
				} else {
					b.WriteString(" – |")
				}
			}
		}
		b.WriteString("\n")
	}
	h := r.Header
	runs := strconv.Itoa(len(r.Benches[0].Runs))
	fmt.Fprintf(b, "\n%s runs of `%s`; %s, %s, %s CPUs (%s); load average %s at the start, %s at the end.\n\n",
		runs, or(h["command"], "?"), or(h["server"], "server version unknown"), or(h["go"], "Go version unknown"),
		or(h["cpus"], "?"), or(h["cpu"], "CPU unknown"), oneMinute(h["load-start"]), oneMinute(h["load-end"]))
	if busy(h) {
		b.Truncate(b.Len() - 2)
		b.WriteString(" The load was above the CPU count (other work shared the machine): rates are low and each ratio's range shows how far single runs strayed.\n\n")
	}
	return nil
}

// busy reports whether the load average at the start or the end of the
// run was above the CPU count.
func busy(h map[string]string) bool {
	cpus, err := strconv.ParseFloat(h["cpus"], 64)
	if err != nil {
		return false
	}
	for _, k := range []string{"load-start", "load-end"} {
		if l, err := strconv.ParseFloat(oneMinute(h[k]), 64); err == nil && l > cpus {
			return true
		}
	}
	return false
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

// oneMinute returns the first (one-minute) figure of a load average line.
func oneMinute(l string) string {
	f := strings.Fields(l)
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}
