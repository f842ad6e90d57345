package peers

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fencelock/fencelock/safety/report"
)

// Report is the peers table: the cells of the peer libraries, and
// fencelock's cells of the same stores and faults (from the main safety
// report) to compare them with.
type Report struct {
	// Profile, Seed, Started and Duration describe the run.
	Profile  string        `json:"profile"`
	Seed     int64         `json:"seed"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration"`
	// Env is the machine and versions.
	Env map[string]string `json:"env,omitempty"`
	// Libs are the libraries measured, Faults the columns.
	Libs   []Lib    `json:"libs"`
	Faults []string `json:"faults"`
	// Cells are the peer libraries' cells (Backend is Lib.Name).
	Cells []report.Cell `json:"cells"`
	// NotRun are the cells left out, with the reason.
	NotRun []report.NotRun `json:"not_run,omitempty"`
	// Failovers are the failover column's cells: each store's loopback
	// cluster and the name of its failover fault there.
	Failovers []Failover `json:"failovers,omitempty"`
	// Fencelock are fencelock's cells of the same stores and faults (and
	// of the same clusters' failover faults), as the main report
	// (FencelockSource) measured them.
	Fencelock       []report.Cell `json:"fencelock,omitempty"`
	FencelockSource string        `json:"fencelock_source,omitempty"`
	// Command regenerates the report.
	Command string `json:"command"`
}

// FailoverFault is the failover column of Report.Faults
// (suite.FaultFailover): a cell of a store's cluster (Failovers).
const FailoverFault = "failover"

// Failover is a store's failover cell: run on a loopback cluster of
// scripts/testenv, with the fault fencelock's row of that cluster in the
// safety report has (the safety module's clusters_test.go).
type Failover struct {
	// Store is the single-server store of the libraries' rows.
	Store string `json:"store"`
	// Cluster is the testenv cluster (fencelock's row in safety.md).
	Cluster string `json:"cluster"`
	// Fault is the failover cell's name on it (suite.Control.FailoverName).
	Fault string `json:"fault"`
	// TTL and Slack are fencelock's row's on that cluster.
	TTL   time.Duration `json:"ttl"`
	Slack time.Duration `json:"slack"`
}

// Failovers are the stores' failover cells: a Redis primary, its replica
// and a Sentinel with the primary killed; three-member etcd and
// ZooKeeper ensembles with the leader killed.
var Failovers = []Failover{
	{Store: "redis", Cluster: "redisha", Fault: "primary-kill-failover", TTL: time.Second, Slack: 300 * time.Millisecond},
	{Store: "etcd", Cluster: "etcd3", Fault: "leader-kill", TTL: 2 * time.Second, Slack: 700 * time.Millisecond},
	{Store: "zookeeper", Cluster: "zookeeper3", Fault: "leader-kill", TTL: 2 * time.Second, Slack: 700 * time.Millisecond},
}

// FailoverOf returns the failover cell of a store.
func FailoverOf(store string) (Failover, bool) {
	for _, f := range Failovers {
		if f.Store == store {
			return f, true
		}
	}
	return Failover{}, false
}

// column returns the cell of a row (a library, or fencelock's store
// when fencelock is set) in column fault: the failover column's cell
// is the store's cluster's failover fault.
func (r Report) column(cells []report.Cell, row, store, fault string, fencelock bool) (report.Cell, bool) {
	if fault == FailoverFault {
		for _, fo := range r.Failovers {
			if fo.Store == store {
				if fencelock {
					row = fo.Cluster
				}
				return cellOf(cells, row, fo.Fault)
			}
		}
		return report.Cell{}, false
	}
	return cellOf(cells, row, fault)
}

// Cell returns the cell of a backend and fault, if any.
func cellOf(cells []report.Cell, backend, fault string) (report.Cell, bool) {
	for _, c := range cells {
		if c.Backend == backend && c.Fault == fault {
			return c, true
		}
	}
	return report.Cell{}, false
}

// Outcome says in a few words what a peer's cell measured: exclusion
// (overlapping writes without tokens, stale writes accepted with them),
// then the other properties that failed.
func Outcome(c report.Cell, lib Lib) string {
	r := c.Result
	st := r.Stats
	failed := r.Failed()
	var parts []string
	if slices.Contains(failed, "P1") {
		if lib.Tokens {
			parts = append(parts, fmt.Sprintf("**UNSAFE**: stale writes accepted: %d", st.StaleAccepted))
		} else {
			parts = append(parts, fmt.Sprintf("**UNSAFE**: overlapping writes: %d", st.StaleAccepted))
		}
	}
	if slices.Contains(failed, "P3") {
		parts = append(parts, fmt.Sprintf("two holders believed at once (overlap %v)", st.MaxOverlap.Round(time.Millisecond)))
	}
	if slices.Contains(failed, "P4") {
		parts = append(parts, fmt.Sprintf("loss noticed after another acquired (margin %v)", st.DetectionMargin.Min.Round(time.Millisecond)))
	}
	if slices.Contains(failed, "P2") {
		parts = append(parts, "tokens repeated or went back")
	}
	var live []string
	for _, id := range failed {
		if id == "P5" || id == "P6" || id == "P8" {
			live = append(live, id)
		}
	}
	if len(live) > 0 {
		parts = append(parts, "slow to recover ("+strings.Join(live, ", ")+")")
	}
	if len(parts) > 0 {
		return strings.Join(parts, "; ")
	}
	switch {
	case st.StaleAttempted == 0:
		return "safe"
	case lib.Tokens:
		return fmt.Sprintf("safe-with-fencing (stale writes refused: %d)", st.StaleAttempted-st.StaleAccepted-st.StaleAcceptedEarly)
	default:
		return fmt.Sprintf("safe (late writes: %d, none after the next holder's)", st.StaleAttempted)
	}
}

// WriteFiles writes the markdown and the JSON report.
func (r Report) WriteFiles(mdPath, jsonPath string) error {
	md, err := os.Create(mdPath)
	if err != nil {
		return err
	}
	if err := r.Markdown(md); err != nil {
		md.Close()
		return err
	}
	if err := md.Close(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(jsonPath, append(b, '\n'), 0o644)
}

// Markdown writes the report as markdown.
func (r Report) Markdown(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# Peer lock libraries under the safety suite's faults\n\n")
	p("<!-- Generated by safety/peers (TestPeers); do not edit. Regenerate: %s -->\n\n", r.Command)
	p("Other Go lock libraries, run by the [safety suite](safety-suite.md) through the same cells as fencelock's rows of\n")
	p("[safety.md](safety.md): three contender processes on two keys, each writing to the fenced resource every 5 ms\n")
	p("while it believes it holds its lock, the same faults, the same checker. Each contender takes its locks with the\n")
	p("library's own API and defaults (below). A library with a fencing token writes with it, and the resource refuses a\n")
	p("stale one; without a token the resource accepts every write, and the checker counts the **overlapping writes**:\n")
	p("writes of an older holder accepted after a newer holder of the key had written (P1). \"Two holders believed at\n")
	p("once\" is P3: a holder checked its lock (as the library lets it) and believed it held it after another holder\n")
	p("had acquired the key, by more than the slack. The fencelock column is fencelock's own cell of that store and\n")
	p("fault, from %s.", r.FencelockSource)
	if len(r.Failovers) > 0 {
		var on []string
		for _, fo := range r.Failovers {
			on = append(on, fmt.Sprintf("%s on %s (%s)", fo.Store, fo.Cluster, fo.Fault))
		}
		p("\n\nThe **failover** column is the fault of fencelock's cluster rows, with each library's client given the whole\n")
		p("topology: while a holder holds, the leader or primary is killed (kill -9) and another member takes over; it\n")
		p("measures whether locks held and waited on across the takeover stay exclusive, and their tokens fenced, by the\n")
		p("same checker (%s).", strings.Join(on, "; "))
	}
	p("\n\n")
	p("Profile **%s**, seed %d, %v.\n\n", r.Profile, r.Seed, r.Duration)
	p("| library | store | token |")
	for _, f := range r.Faults {
		p(" %s |", f)
	}
	p("\n|---|---|---|%s\n", strings.Repeat("---|", len(r.Faults)))
	stores := []string{}
	for _, lib := range r.Libs {
		p("| %s | %s | %s |", lib.Name, lib.Store, map[bool]string{true: "yes", false: "no"}[lib.Tokens])
		for _, f := range r.Faults {
			if c, ok := r.column(r.Cells, lib.Name, lib.Store, f, false); ok {
				p(" %s |", Outcome(c, lib))
			} else {
				p(" not run |")
			}
		}
		p("\n")
		if !slices.Contains(stores, lib.Store) {
			stores = append(stores, lib.Store)
		}
	}
	for _, s := range stores {
		p("| *fencelock* | %s | yes |", s)
		for _, f := range r.Faults {
			if c, ok := r.column(r.Fencelock, s, s, f, true); ok {
				p(" %s |", c.Verdict)
			} else {
				p(" not measured |")
			}
		}
		p("\n")
	}
	p("\n## How each library was used\n\n")
	p("| library | module | lock, check, unlock | fencing token |\n|---|---|---|---|\n")
	for _, lib := range r.Libs {
		p("| %s | `%s` | %s | %s |\n", lib.Name, lib.Module, lib.Use, lib.Token)
	}
	p("\n## Cells\n\n")
	p("Stale: writes sent after another holder of the key had acquired it (attempted / accepted after the newer\n")
	p("holder had written). Overlap: the largest overlap of two holders' beliefs. Margin: the smallest time from the end\n")
	p("of a lost lock's belief to the next acquisition (negative: the loss was noticed late).\n\n")
	p("| library | fault | setup | rounds | acquisitions | writes | stale | overlap | margin | failed |\n")
	p("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.Cells {
		st := c.Result.Stats
		failed := strings.Join(c.Result.Failed(), ", ")
		if failed == "" {
			failed = "none"
		}
		margin := "–"
		if st.DetectionMargin.N > 0 {
			margin = st.DetectionMargin.Min.Round(time.Millisecond).String()
		}
		p("| %s | %s | %s | %d | %d | %d | %d / %d | %v | %s | %s |\n", c.Backend, c.Fault, c.Setup, c.Rounds,
			st.Acquisitions, st.Writes, st.StaleAttempted, st.StaleAccepted, st.MaxOverlap.Round(time.Millisecond), margin, failed)
	}
	if len(r.NotRun) > 0 {
		p("\n## Not run\n\n| library | fault | why |\n|---|---|---|\n")
		for _, n := range r.NotRun {
			p("| %s | %s | %s |\n", n.Backend, n.Fault, n.Why)
		}
	}
	p("\n## Machine\n\n")
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		p("- %s: %s\n", k, r.Env[k])
	}
	_, err := io.WriteString(w, b.String())
	return err
}
