// Package history is the record of a fault-injection run: what every
// contender process did and believed, what the fenced resource accepted,
// and which faults the harness injected, each stamped with the system-wide
// monotonic clock so that events from different processes can be ordered.
//
// The system under test never reads that clock: only the harness, the
// contenders' instrumentation and the fenced resource do.
package history

import (
	"bufio"
	"encoding/json"
	"io"
	"sort"
	"sync"

	"github.com/fencelock/fencelock/safety/mono"
)

// Kind names what an Event records.
type Kind string

// Event kinds. Contender kinds are written by the contender process about
// itself; Fault kinds by the harness; Write by the fenced resource.
const (
	// AcquireStart: the contender calls Acquire for Key.
	AcquireStart Kind = "acquire_start"
	// Acquired: Acquire returned a lease: Token, Lease, and Until, the
	// monotonic time up to which the holder believes it holds the lock if
	// no renewal succeeds (now + Lease.Remaining()).
	Acquired Kind = "acquired"
	// AcquireFailed: Acquire returned an error (Err). Ambiguous marks an
	// attempt whose reply the harness dropped on purpose.
	AcquireFailed Kind = "acquire_failed"
	// Belief: the holder checked its lease before a write and still
	// believes it holds it, until Until. Token is the lease's current
	// token (it changes only on rotation).
	Belief Kind = "belief"
	// Lost: the holder noticed that its lease ended without Release (its
	// Done channel closed with a loss).
	Lost Kind = "lost"
	// ReleaseStart: the holder calls Release; from this instant it no
	// longer believes it holds the lock.
	ReleaseStart Kind = "release_start"
	// Released: Release returned (Err is its error, if any).
	Released Kind = "released"
	// StaleOp: after a fault, the contender sent a Release or Renew
	// (Note says which) for an old grant straight to the backend, bypassing
	// the engine, to check that it does not disturb a newer holder.
	StaleOp Kind = "stale_op"
	// BatchRenew: the engine renewed N (two or more) of the contender's
	// leases in one driver.BatchRenewer call (Err if the whole batch
	// failed).
	BatchRenew Kind = "batch_renew"
	// BatchAcquire and BatchRelease: the engine sent N (two or more) of
	// the contender's acquire attempts, or releases, in one
	// driver.BatchAcquirer or driver.BatchReleaser call (Err if the whole
	// batch failed).
	BatchAcquire Kind = "batch_acquire"
	BatchRelease Kind = "batch_release"
	// Wait: the engine waited for Key through the backend: a blocking
	// driver.Waiter call (Note "acquire_wait") or a driver.Watcher
	// subscription (Note "watch").
	Wait Kind = "wait"
	// StoreAcquired and StoreReleased: the contender's backend was
	// granted a record of Key by the store (a reply to an acquire), or
	// was asked to release it, for the lease owner Note. Emitted only
	// by contenders of multi-key grants (the checker's M1 follows every
	// record a grant's call took: handed out in a whole group, or given
	// back).
	StoreAcquired Kind = "store_acquired"
	StoreReleased Kind = "store_released"
	// Write: the fenced resource received a write attempt (see the Write*
	// fields).
	Write Kind = "write"
	// FaultStart and FaultEnd bracket a fault the harness injected (Note
	// names it; Proc is the target contender, if any). Crash is a SIGKILL
	// of contender Proc; Pause/Resume a SIGSTOP/SIGCONT.
	FaultStart Kind = "fault_start"
	FaultEnd   Kind = "fault_end"
	Crash      Kind = "crash"
	Pause      Kind = "pause"
	Resume     Kind = "resume"
)

// Event is one line of a history. Fields that do not apply are zero.
type Event struct {
	// T is the system-wide monotonic clock (CLOCK_MONOTONIC) in
	// nanoseconds when the event happened.
	T int64 `json:"t"`
	// Proc names the contender process ("c1", …), or "harness"/"fence".
	Proc string `json:"proc"`
	Kind Kind   `json:"kind"`
	Key  string `json:"key,omitempty"`
	// Lease identifies one lease: unique per run (proc + sequence number).
	Lease string `json:"lease,omitempty"`
	// Token is the fencing token involved.
	Token uint64 `json:"token,omitempty"`
	// Until is a monotonic deadline in nanoseconds (see Acquired, Belief).
	Until int64 `json:"until,omitempty"`
	// Accepted and Reason describe the fenced resource's decision on a
	// Write; Fencing is false when the resource ran with fencing off.
	Accepted bool   `json:"accepted,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Fencing  bool   `json:"fencing,omitempty"`
	// Access is set on a Write to a read-write lock's resource: "read"
	// or "write" (safety/fence, Client.Access).
	Access string `json:"access,omitempty"`
	// Ambiguous marks an acquire or release whose reply was dropped.
	Ambiguous bool `json:"ambiguous,omitempty"`
	// N is a count (BatchRenew: the grants in the batch).
	N    int    `json:"n,omitempty"`
	Err  string `json:"err,omitempty"`
	Note string `json:"note,omitempty"`
}

// History is a run's events, in any order; Sort orders them by T.
type History []Event

// Sort orders the events by time, keeping the recorded order of equal
// times.
func (h History) Sort() { sort.SliceStable(h, func(i, j int) bool { return h[i].T < h[j].T }) }

// Encoder writes events as JSON lines.
type Encoder struct{ enc *json.Encoder }

// NewEncoder returns an Encoder writing to w. It is not safe for
// concurrent use.
func NewEncoder(w io.Writer) *Encoder { return &Encoder{enc: json.NewEncoder(w)} }

// Encode writes one event as one line.
func (e *Encoder) Encode(ev Event) error { return e.enc.Encode(ev) }

// Emitter is how a contender process reports its events: as JSON lines,
// one write per event, stamped and signed with the process's name. It is
// safe for concurrent use; after a write fails it writes nothing more,
// and Err reports the failure.
type Emitter struct {
	proc string
	mu   sync.Mutex
	w    *bufio.Writer
	enc  *Encoder
	err  error
}

// NewEmitter returns an Emitter of the process proc writing to w.
func NewEmitter(proc string, w io.Writer) *Emitter {
	bw := bufio.NewWriter(w)
	return &Emitter{proc: proc, w: bw, enc: NewEncoder(bw)}
}

// Emit stamps ev with mono.Now (if its T is zero) and the process's name,
// and writes it at once.
func (e *Emitter) Emit(ev Event) {
	if ev.T == 0 {
		ev.T = mono.Now()
	}
	ev.Proc = e.proc
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return
	}
	if err := e.enc.Encode(ev); err != nil {
		e.err = err
		return
	}
	e.err = e.w.Flush()
}

// Err returns the first write error, if any.
func (e *Emitter) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// Read reads JSON-line events until EOF.
func Read(r io.Reader) (History, error) {
	dec := json.NewDecoder(r)
	var h History
	for {
		var ev Event
		if err := dec.Decode(&ev); err == io.EOF {
			return h, nil
		} else if err != nil {
			return h, err
		}
		h = append(h, ev)
	}
}
