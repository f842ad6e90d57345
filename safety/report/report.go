// Package report turns the checked runs of the safety suite into the
// backend × fault matrix published as docs/safety.md (and JSON): one cell
// per backend and fault, with a verdict, the measured numbers, the
// backend's own claims (driver.Description) beside them, and for cells
// that are unsafe by design the explanation and the configuration that
// fixes it.
//
// # Verdicts
//
//   - safe: every property held and no stale write was even attempted.
//   - safe-with-fencing: every property held, but stale writes were
//     attempted (a holder acted on a lease it had lost, as under a process
//     pause) and the fenced resource rejected every one. Overlap of belief
//     intervals (P3) may be tolerated for such faults (Expectation.Tolerate).
//   - unsafe-expected: some property failed, and the expectation table
//     says this backend is unsafe under this fault for exactly those
//     properties (e.g. Redis without appendfsync always can reissue a
//     token after a crash), or the cell is a negative control that failed
//     as it must.
//   - UNSAFE-UNEXPECTED: some property failed that no expectation
//     explains. This fails CI.
//
// A negative control (fencing off, a mutant backend) is a cell whose
// Expectation has Control set: it must flag its properties, and if it does
// not, the checker or the harness is broken and the report fails too.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/safety/check"
)

// Verdict is the classification of one cell.
type Verdict string

// The verdicts, from best to worst.
const (
	Safe             Verdict = "safe"
	SafeWithFencing  Verdict = "safe-with-fencing"
	UnsafeExpected   Verdict = "unsafe-expected"
	UnsafeUnexpected Verdict = "UNSAFE-UNEXPECTED"
)

// Expectation is what is known in advance about one backend under one
// fault.
type Expectation struct {
	// Unsafe says the backend is known to break Properties under this
	// fault (by design or by configuration); if they fail, the verdict is
	// unsafe-expected rather than UNSAFE-UNEXPECTED.
	Unsafe bool `json:"unsafe,omitempty"`
	// Control marks a negative control: Properties must fail, and the
	// report fails if any of them holds. Other properties may fail too.
	Control bool `json:"control,omitempty"`
	// Properties are the IDs ("P1" …) that may fail (Unsafe) or must
	// fail (Control). Empty with Unsafe means any property may fail.
	Properties []string `json:"properties,omitempty"`
	// Tolerate are property IDs whose failure is ignored for this fault,
	// e.g. "P3" under a holder pause: a paused holder's belief outlives
	// its lease, which is exactly what fencing is for.
	Tolerate []string `json:"tolerate,omitempty"`
	// Why explains the expected behaviour.
	Why string `json:"why,omitempty"`
	// Fix is the configuration that makes the cell safe, if any.
	Fix string `json:"fix,omitempty"`
}

// Rule is one row of an expectation table. Backend or Fault may be "*"
// to match any.
type Rule struct {
	Backend     string      `json:"backend"`
	Fault       string      `json:"fault"`
	Expectation Expectation `json:"expectation"`
}

// Table is an expectation table: the runner's knowledge of which cells
// are unsafe by design. The first matching rule wins.
type Table []Rule

// Lookup returns the expectation of the first rule matching backend and
// fault, or the zero Expectation (safe is expected) if none matches.
func (t Table) Lookup(backend, fault string) Expectation {
	for _, r := range t {
		if (r.Backend == "*" || r.Backend == backend) && (r.Fault == "*" || r.Fault == fault) {
			return r.Expectation
		}
	}
	return Expectation{}
}

// Classify returns the verdict for a checked run under an expectation
// (see the package doc).
func Classify(r check.Result, e Expectation) Verdict {
	var failed, tolerated []string
	for _, id := range r.Failed() {
		if slices.Contains(e.Tolerate, id) {
			tolerated = append(tolerated, id)
		} else {
			failed = append(failed, id)
		}
	}
	switch {
	case len(failed) == 0 && (len(tolerated) > 0 || r.Stats.StaleAttempted > 0):
		return SafeWithFencing
	case len(failed) == 0:
		return Safe
	case e.Control:
		return UnsafeExpected
	case e.Unsafe && (len(e.Properties) == 0 || subset(failed, e.Properties)):
		return UnsafeExpected
	}
	return UnsafeUnexpected
}

func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// Cell is one backend under one fault.
type Cell struct {
	// Backend is the backend's short name ("postgres", "redis", …) and
	// Fault the fault class's name ("holder-pause", "server-kill", …).
	Backend string `json:"backend"`
	Fault   string `json:"fault"`
	// Setup says how the store was configured, where it matters
	// (e.g. "appendfsync everysec", "3-member cluster").
	Setup string `json:"setup,omitempty"`
	// Seed reproduces the run; Duration is how long it took; Rounds how
	// many fault rounds it ran.
	Seed     int64         `json:"seed"`
	Duration time.Duration `json:"duration"`
	Rounds   int           `json:"rounds"`
	// Config is the checker's configuration (TTL, Slack, …).
	Config check.Config `json:"config"`
	// Claim is the backend's own description (driver.Describer), nil if it
	// does not describe itself.
	Claim *driver.Description `json:"claim,omitempty"`
	// Expect is the expectation the cell was judged against.
	Expect Expectation `json:"expect"`
	// Result is the checker's result; Verdict the classification.
	Result  check.Result `json:"result"`
	Verdict Verdict      `json:"verdict"`
	// Calls are the calls measured by a call-bound cell (fault
	// "call-bounds"): one per store fault and call. Other cells have none.
	Calls []CallBound `json:"calls,omitempty"`
}

// CallBound is one call measured under one store fault: how long it took
// against its bound, and whether its error named the store's cause.
type CallBound struct {
	// Fault is the store fault ("paused", "refused", "vanished"); Call
	// the call ("TryAcquire, 2s deadline", "Release", …).
	Fault string `json:"fault"`
	Call  string `json:"call"`
	// Elapsed is how long the call took; Bound how long it may take by
	// the call-bound contract, Slack the measurement slack past it.
	Elapsed time.Duration `json:"elapsed"`
	Bound   time.Duration `json:"bound"`
	Slack   time.Duration `json:"slack"`
	// Err is the call's error (redacted), "" if it returned none; Cause
	// says whether it named the store's cause.
	Err   string `json:"err,omitempty"`
	Cause bool   `json:"cause,omitempty"`
}

// Overrun is how long the call ran past its bound (negative: it ended
// that much before it).
func (c CallBound) Overrun() time.Duration { return c.Elapsed - c.Bound }

// Violation reports whether the call ended later than its bound plus
// slack.
func (c CallBound) Violation() bool { return c.Overrun() > c.Slack }

// NewCell returns a cell for a checked run, with Verdict set by Classify.
// The caller fills in Setup, Seed, Duration, Rounds, Config and Claim.
func NewCell(backend, fault string, r check.Result, e Expectation) Cell {
	return Cell{Backend: backend, Fault: fault, Expect: e, Result: r, Verdict: Classify(r, e)}
}

// Problem says why the cell fails the report ("" if it does not): an
// UNSAFE-UNEXPECTED verdict, or a negative control that did not flag its
// properties.
func (c Cell) Problem() string {
	if c.Expect.Control {
		failed := c.Result.Failed()
		if len(c.Expect.Properties) == 0 && len(failed) == 0 {
			return "negative control did not fail: every property held"
		}
		var missed []string
		for _, id := range c.Expect.Properties {
			if !slices.Contains(failed, id) {
				missed = append(missed, id)
			}
		}
		if len(missed) > 0 {
			return fmt.Sprintf("negative control did not fail: %s held (must fail)", strings.Join(missed, ", "))
		}
		return ""
	}
	if c.Verdict != UnsafeUnexpected {
		return ""
	}
	var parts []string
	for _, p := range c.Result.Properties {
		if p.OK || slices.Contains(c.Expect.Tolerate, p.ID) {
			continue
		}
		s := fmt.Sprintf("%s %s (%d violations)", p.ID, p.Name, p.Count)
		if len(p.Violations) > 0 {
			s += ": " + p.Violations[0].Msg
		}
		parts = append(parts, s)
	}
	return string(UnsafeUnexpected) + ": " + strings.Join(parts, "; ")
}

// Report is one run of the suite.
type Report struct {
	// Profile is "quick" or "soak".
	Profile string `json:"profile"`
	// Seed is the run's seed (each cell has its own derived seed too).
	Seed int64 `json:"seed"`
	// Started is when the run began; Duration how long it took.
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration"`
	// Repro is the command that reruns one cell, with the placeholders
	// {backend}, {fault} and {seed}, e.g.
	// "cd safety && go test -run 'TestSafety/{backend}/{fault}' -args -safety.seed={seed}".
	Repro string `json:"repro,omitempty"`
	// ReproHint is the sentence before the Reproduce commands; empty
	// means the servers of scripts/testenv.
	ReproHint string `json:"repro_hint,omitempty"`
	// Env describes the machine and server versions, free-form.
	Env   map[string]string `json:"env,omitempty"`
	Cells []Cell            `json:"cells"`
	// NotRun are the requested cells that did not run, with the reason
	// (a fault that needs control of the server, a proxy, time, or a
	// cell that could not run to the end: its harness gave up).
	NotRun []NotRun `json:"not_run,omitempty"`
}

// NotRun is a cell that was requested but not run. Fault "*" stands for
// every fault of the backend.
type NotRun struct {
	Backend string `json:"backend"`
	Fault   string `json:"fault"`
	Why     string `json:"why"`
}

// Failed reports whether the run must fail CI: any UNSAFE-UNEXPECTED
// cell, or any negative control that did not fail.
func (r Report) Failed() bool { return len(r.Problems()) > 0 }

// Problems lists every cell's Problem, prefixed with backend and fault.
func (r Report) Problems() []string {
	var ps []string
	for _, c := range r.Cells {
		if p := c.Problem(); p != "" {
			ps = append(ps, c.Backend+"/"+c.Fault+": "+p)
		}
	}
	return ps
}

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(rd io.Reader) (Report, error) {
	var r Report
	if err := json.NewDecoder(rd).Decode(&r); err != nil {
		return Report{}, fmt.Errorf("report: %w", err)
	}
	return r, nil
}
