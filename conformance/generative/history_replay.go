package generative

import (
	"errors"
	"fmt"

	"github.com/fencelock/fencelock"
)

// A Replay is a lock history written down outside a run, in the terms of
// the generative mode's checker, so that the same history can be fed to
// that checker and to another checker of the same invariants (the safety
// suite's, safety/check) and their verdicts compared. Instants are
// positions in one total order: any increasing int64s (the safety suite
// uses its monotonic clock's nanoseconds), never 0 and below 1<<62.
//
// A Replay holds leases and fenced writes only: no faults, forced
// releases, closes or per-call options, whose properties the safety
// suite does not check.
type Replay struct {
	Leases []ReplayLease
	Writes []ReplayWrite
}

// ReplayLease is one lease as its holder saw it: it believed it held Key
// from Got until End.
type ReplayLease struct {
	// Client names the client that held it; Owner is its owner string,
	// unique in the history.
	Client int
	Key    string
	Owner  string
	// Inv is when its Acquire was called, Got when it returned the
	// lease, End when the holder stopped believing it held the key (it
	// began to release, learnt of a loss, or its validity ran out); 0 if
	// it still believed when the history ended.
	Inv, Got, End int64
	// Cause is why the lease ended if it was lost (an error of the
	// fencelock package, e.g. ErrNotHeld), nil if it was released or
	// still held.
	Cause error
	// Tokens are the tokens the lease held, its grant's first, each
	// with the instant its holder saw it. At least one.
	Tokens []ReplayToken
}

// ReplayToken is a token a lease held, seen by its holder At.
type ReplayToken struct {
	Token fencelock.Token
	At    int64
}

// ReplayWrite is one write to the fenced resource: lease Lease (an index
// into Replay.Leases) wrote with Token; the resource was called at
// Invoked and answered at Returned, accepting the write or not. Late
// marks a write sent after the lease ended, as a paused holder's would be.
type ReplayWrite struct {
	Lease             int
	Token             fencelock.Token
	Invoked, Returned int64
	Accepted, Late    bool
}

// Violation is a broken invariant that Replay.Check found: Property names
// it as the generative mode reports it (e.g. "NoTwoHolders",
// "TokensIncreaseAcrossHolders", "NoStaleWriteAccepted"), Detail says
// which leases and instants show it.
type Violation struct {
	Property string
	Detail   string
}

// String returns "Property: Detail".
func (v Violation) String() string { return v.Property + ": " + v.Detail }

// ErrMalformedReplay is returned by Replay.Check for a Replay it cannot
// check: a lease without a token, a write naming no lease. Fix the Replay.
var ErrMalformedReplay = errors.New("generative: malformed replay")

// Check runs the generative mode's history checker (the one a Run uses
// after each program) on rp and returns every violation it finds, sorted
// and without duplicates; none if the history keeps every invariant.
func (rp Replay) Check() ([]Violation, error) {
	r := newRecorder()
	for i, l := range rp.Leases {
		if len(l.Tokens) == 0 {
			return nil, fmt.Errorf("%w: lease %d (%q) has no token; give it its grant's", ErrMalformedReplay, i, l.Owner)
		}
		if _, dup := r.byOwner[l.Owner]; dup || l.Owner == "" {
			return nil, fmt.Errorf("%w: lease %d's owner %q is empty or not unique; name each lease's owner once", ErrMalformedReplay, i, l.Owner)
		}
		rec := &leaseRec{id: i + 1, client: l.Client, key: l.Key, owner: l.Owner, inv: l.Inv, got: l.Got, end: l.End, cause: l.Cause, via: "replay"}
		for _, t := range l.Tokens {
			rec.tokens = append(rec.tokens, tokObs{t.Token, t.At})
		}
		r.leases = append(r.leases, rec)
		r.byOwner[l.Owner] = rec
	}
	for i, w := range rp.Writes {
		if w.Lease < 0 || w.Lease >= len(rp.Leases) {
			return nil, fmt.Errorf("%w: write %d names lease %d of %d; name an index into Leases", ErrMalformedReplay, i, w.Lease, len(rp.Leases))
		}
		r.writes = append(r.writes, writeRec{lease: w.Lease + 1, key: rp.Leases[w.Lease].Key, token: w.Token, invoked: w.Invoked, returned: w.Returned, accepted: w.Accepted, late: w.Late})
	}
	vs := r.check()
	out := make([]Violation, len(vs))
	for i, v := range vs {
		out[i] = Violation{v.property, v.detail}
	}
	return out, nil
}
