// Package check verifies the safety properties P1..P8 of fencelock on the
// recorded history of one fault-injection run (the merged events of the
// contender processes, the harness and the fenced resource).
//
// Each property is a named rule with an explanation; Check evaluates all of
// them and returns, per property, whether it held and the violations it
// found (each with the events involved), plus the numbers the safety
// report needs (Stats).
//
// # Definitions
//
// Leases are identified by history.Event.Lease, keys by Key, processes by
// Proc. Times are history.Event.T (CLOCK_MONOTONIC ns). Harness events
// (Crash, Pause, Resume) name the target process in Proc.
//
//   - Belief interval of lease L: from its Acquired event to the earliest
//     of its Lost, its ReleaseStart, the first Crash of its process after
//     it was acquired, and the largest Until it reported (Acquired.Until or
//     a later Belief.Until). A contender reports Until only with Acquired
//     and Belief (before each write), so a holder must write at least
//     every TTL/2 or its belief is underestimated (which can hide a P3 or
//     P4 violation but never invent one).
//   - Holding of lease L (used to decide who held a key at some instant,
//     for P5 and P8): like the belief interval, but ignoring Until, since a
//     lease that does not write may be renewed without reporting it.
//   - A write attempt by lease L for key K, received by the fence at t, is
//     stale if some other lease of K was acquired after L (by Acquired T)
//     and before t. A write by a lease that was never acquired is stale
//     as soon as any lease of K was acquired.
//   - Acquisitions of a key are ordered by Acquired T. Where that order
//     cannot be trusted (the later-reported lease's process was paused
//     between its AcquireStart and its Acquired report), P2 checks only
//     uniqueness.
//   - A contender is waiting for K at t if an Acquire of K (AcquireStart to
//     its Acquired or AcquireFailed, or to the Crash of its process) was in
//     progress at t. An Acquire of a semaphore names the semaphore's key
//     and is waiting for each of its slot keys (below).
//   - Read-write locks: a key that contains the read-write lock separator (recipe.Keys) is the
//     gate (suffix "gate": a writer's grant, named by its gate lease) or
//     a reader slot (a reader's grant) of the lock whose key precedes it.
//     A writer's Acquire names the gate, a reader's the lock's key. Each
//     is a key of its own for P1..P8 (so P3 on the gate is "no two
//     writers"); accesses to the lock's resource (history.Event.Access)
//     are W3's, not P1's.
//   - Semaphores: a key that contains the semaphore separator (recipe.Keys) is a
//     permit slot of the semaphore whose key precedes it; each slot is a
//     key of its own for P1..P8 (a permit is a lease on its slot key,
//     fenced by it). With Config.Permits set, S1 and S2 judge each
//     semaphore as a whole.
//
// The properties (see the Rule of each Property for the exact statement):
//
//	P1 no stale write accepted after a newer lease has used the resource,
//	   nor a pre-rotation token after its lease's rotated one
//	P2 tokens unique and strictly increasing per key (incl. rotation)
//	P3 belief intervals of different leases of one key overlap by ≤ Slack
//	P4 a lease that ended without release or crash ended (in its holder's
//	   belief) before the next lease of its key was acquired; margin
//	   reported
//	P5 after the crash of a key's holder (or its release), a waiting
//	   contender acquires the key within TTL + Poll + Slack
//	P6 after every FaultEnd, some lease is acquired and some write
//	   accepted within Progress
//	P7 a stale release or renew (StaleOp) neither ends the current holder's
//	   lease early nor lets a third lease acquire while the holder believes
//	P8 after an ambiguous acquire or release, the key is acquired again
//	   within TTL + Poll + Slack once its holder (if any) is gone (orphan
//	   time reported)
//	S1 (Config.Permits > 0) never more than Permits slots of one
//	   semaphore believed held at once (two believers of one slot: P3)
//	S2 (Config.Permits > 0) the permit of a holder killed or paused past
//	   its TTL is taken by a waiting contender within TTL + Poll + Slack
//	W1 (Config.RW) a writer's belief overlaps no other grant's of its
//	   read-write lock (reader or writer) by more than Slack
//	W2 (Config.RW) a writer's token is above every earlier grant's, a
//	   reader's at least every earlier writer's
//	W3 (Config.RW) the resource refuses a read once a writer that came
//	   after the reader has written, and a write once any grant that came
//	   after the writer has read or written
//	U1 (Config.RW and Config.Upgrade) an upgrade of an upgradeable read
//	   ends within the progress bound (P6's) of its start
//	M1 (Config.Multi) a multi-key call hands out every key it asked for
//	   or none, and by its end has given back every record it took but
//	   did not hand out
//
// P1 differs from "no stale write accepted" in one case: a stale write
// that reaches the fence before any write of the newer lease is accepted
// by a correct fence (it has not seen the newer token yet) and is
// harmless for a resource that only takes blind writes, since the
// resource still sees the writes in lease order. Such writes are counted
// in Stats.StaleAcceptedEarly, not flagged.
package check

import (
	"time"

	"github.com/fencelock/fencelock/safety/history"
)

// Config holds the bounds the properties are checked against.
type Config struct {
	// TTL is the bound on how long a key stays held without its holder:
	// the lease TTL the contenders requested, or the session timeout for
	// session-based stores (ZooKeeper), whichever frees a crashed holder's
	// key. Required.
	TTL time.Duration
	// Slack is the measurement slack added to every bound: scheduling and
	// event-delivery delay, the engine's wait/poll interval. Zero means
	// 250ms.
	Slack time.Duration
	// Poll is the longest a waiting contender may take to notice that a
	// key became free when no notification wakes it (an expired record is
	// found by polling): the engine's MaxBackoff plus its jitter. It is
	// added to the bounds of P5 and P8, not to P3's. Zero means 1s (the
	// engine's default MaxBackoff).
	Poll time.Duration
	// Progress bounds P6: after a fault ends, the time until some lease is
	// acquired and some write accepted. Zero means 3×TTL + Poll + Slack.
	Progress time.Duration
	// MaxViolations caps the violations kept per property (Property.Count
	// still counts them all). Zero means 20.
	MaxViolations int
	// Permits, if positive, is the number of permits of the semaphores
	// in the history (their slot keys contain the semaphore separator (recipe.Keys)):
	// Check then adds S1 and S2 (see the package doc). Zero: no
	// semaphore properties.
	Permits int `json:"Permits,omitempty"`
	// RW adds W1..W3 (see the package doc) for the read-write locks in
	// the history: keys that contain the read-write lock separator (recipe.Keys) are their
	// gate (a writer's grant) and reader slots, grouped by the lock's key.
	RW bool `json:"RW,omitempty"`
	// Upgrade, with RW, adds U1 (see the package doc) for the upgrades
	// in the history (contender.Config.Upgrade: an upgrade's lease id is
	// its read grant's with "u" appended).
	Upgrade bool `json:"Upgrade,omitempty"`
	// Multi adds M1 (see the package doc) for the multi-key grants in the
	// history (contender.Config.Multi: lease ids of a call's keys are its
	// id, a dot and a number; StoreAcquired and StoreReleased events).
	Multi bool `json:"Multi,omitempty"`
}

// Property is the outcome of one property.
type Property struct {
	// ID is "P1" … "P8", "S1", "S2" for semaphores, "W1" … "W3" for
	// read-write locks, "U1" for upgrades, "M1" for multi-key grants.
	ID string `json:"id"`
	// Name is the property's short name, e.g. "no stale write accepted".
	Name string `json:"name"`
	// Rule explains what is checked and why it matters.
	Rule string `json:"rule"`
	// OK is true iff no violation was found.
	OK bool `json:"ok"`
	// Checked is how many cases the property examined (writes, token
	// pairs, lease pairs, crashes, faults, stale ops, ambiguous ops). A
	// property with Checked == 0 held vacuously.
	Checked int `json:"checked"`
	// Count is the number of violations found; Violations holds the
	// first Config.MaxViolations of them.
	Count      int         `json:"count"`
	Violations []Violation `json:"violations,omitempty"`
}

// Violation is one breach of a property.
type Violation struct {
	// Msg says what went wrong, in words, with the times involved.
	Msg string `json:"msg"`
	// Events are the events that show it.
	Events []history.Event `json:"events,omitempty"`
}

// Dist summarises a set of durations: N samples, their minimum, median,
// 99th percentile (nearest rank) and maximum. All zero when N is 0.
type Dist struct {
	N   int           `json:"n"`
	Min time.Duration `json:"min"`
	P50 time.Duration `json:"p50"`
	P99 time.Duration `json:"p99"`
	Max time.Duration `json:"max"`
}

// Stats are the run's numbers for the report.
type Stats struct {
	// Span is the time from the first to the last event.
	Span time.Duration `json:"span"`
	// Keys is the number of distinct keys acquired or written.
	Keys int `json:"keys"`
	// Acquisitions counts Acquired events; AcquireFailures AcquireFailed
	// ones; Ambiguous the acquires and releases marked ambiguous.
	Acquisitions    int `json:"acquisitions"`
	AcquireFailures int `json:"acquire_failures"`
	Ambiguous       int `json:"ambiguous"`
	// Releases counts ReleaseStart events; Losses Lost events.
	Releases int `json:"releases"`
	Losses   int `json:"losses"`
	// Faults counts FaultStart events; Crashes and Pauses the harness's
	// Crash and Pause events; StaleOps the StaleOp events.
	Faults   int `json:"faults"`
	Crashes  int `json:"crashes"`
	Pauses   int `json:"pauses"`
	StaleOps int `json:"stale_ops"`
	// Writes counts the fence's Write events, WritesAccepted the accepted
	// ones; FencingOffWrites those received with fencing off.
	Writes           int `json:"writes"`
	WritesAccepted   int `json:"writes_accepted"`
	FencingOffWrites int `json:"fencing_off_writes"`
	// StaleAttempted counts stale write attempts (see the package doc),
	// StaleAccepted those the fence accepted after a newer lease had
	// written (the P1 violations).
	StaleAttempted int `json:"stale_attempted"`
	StaleAccepted  int `json:"stale_accepted"`
	// StaleAcceptedEarly counts stale writes the fence accepted before
	// any newer lease had written: allowed (see P1), since the resource
	// still sees the writes in lease order.
	StaleAcceptedEarly int `json:"stale_accepted_early"`
	// Rotations counts the token rotations the holders reported (a
	// Belief with a higher token than the lease had). RotatedAccepted
	// counts writes the fence accepted with a lease's rotated token (a
	// token above one it had already accepted from that lease);
	// OldTokenWrites counts writes with a token below one the fence had
	// already accepted from the same lease (a pre-rotation token), and
	// OldTokenAccepted those it accepted (P1 violations).
	Rotations        int `json:"rotations,omitempty"`
	RotatedAccepted  int `json:"rotated_accepted,omitempty"`
	OldTokenWrites   int `json:"old_token_writes,omitempty"`
	OldTokenAccepted int `json:"old_token_accepted,omitempty"`
	// BatchRenewals counts the engine's renewals of two or more leases
	// in one call (history.BatchRenew), MaxBatch the largest; Waits the
	// waits through the backend (history.Wait: a driver.Waiter call or
	// a driver.Watcher subscription).
	BatchRenewals int `json:"batch_renewals,omitempty"`
	MaxBatch      int `json:"max_batch,omitempty"`
	Waits         int `json:"waits,omitempty"`
	// BatchAcquires and BatchReleases count the engine's coalesced
	// acquire attempts and releases: calls of one client sent to the
	// store together, two or more in one driver.BatchAcquirer or
	// driver.BatchReleaser call (history.BatchAcquire, BatchRelease).
	// MaxAcquireBatch and MaxReleaseBatch are the largest of each.
	BatchAcquires   int `json:"batch_acquires,omitempty"`
	MaxAcquireBatch int `json:"max_acquire_batch,omitempty"`
	BatchReleases   int `json:"batch_releases,omitempty"`
	MaxReleaseBatch int `json:"max_release_batch,omitempty"`
	// Tokens is the number of distinct (key, token) pairs acquired;
	// MaxToken the highest token seen.
	Tokens   int    `json:"tokens"`
	MaxToken uint64 `json:"max_token"`
	// MaxOverlap is the largest overlap of two belief intervals of one key
	// (P3), zero if none.
	MaxOverlap time.Duration `json:"max_overlap"`
	// DetectionMargin: for each lease that ended without release and was
	// followed by another lease of its key, the next Acquired T minus the
	// end of its belief (P4). Negative values are violations.
	DetectionMargin Dist `json:"detection_margin"`
	// OrphanTime: for each crash of a holder (P5) and each ambiguous
	// acquire or release (P8), the time until the key was acquired again.
	OrphanTime Dist `json:"orphan_time"`
	// Recovery: for each FaultEnd, the time until the next Acquired (P6).
	Recovery Dist `json:"recovery"`
	// MaxHolders is the largest number of slots of one semaphore
	// believed held at once (S1; only with Config.Permits), or of
	// readers of one read-write lock believing at once (W1; Config.RW).
	MaxHolders int `json:"max_holders,omitempty"`
}

// Result is the outcome of Check.
type Result struct {
	// Properties holds P1..P8, in order, then S1 and S2 if
	// Config.Permits is set, then W1..W3 if Config.RW is (and U1 with
	// Config.Upgrade), then M1 if Config.Multi is.
	Properties []Property `json:"properties"`
	Stats      Stats      `json:"stats"`
}

// OK reports whether every property held.
func (r Result) OK() bool { return len(r.Failed()) == 0 }

// Property returns the property with the given ID ("P1" … "P8") and
// whether there is one.
func (r Result) Property(id string) (Property, bool) {
	for _, p := range r.Properties {
		if p.ID == id {
			return p, true
		}
	}
	return Property{}, false
}

// Failed returns the IDs of the properties that did not hold, in order.
func (r Result) Failed() []string {
	var ids []string
	for _, p := range r.Properties {
		if !p.OK {
			ids = append(ids, p.ID)
		}
	}
	return ids
}
