package generative

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
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
//
// Read-write locks and semaphores are written in their records' keys
// (recipe.Keys). A lease whose Key is a read-write lock's gate is a write
// grant of that lock, one on a reader slot a read grant; their writes
// are accesses to the lock's fenced resource (a read, for a read
// grant's), judged by the read-write checks (NoTwoWriters,
// NoReaderBesideWriter, GrantTokensIncrease, NoStaleAccessAccepted, with
// the grant's first token as its token) instead of the lock's write
// checks; the leases themselves are judged as any lease of their key. A
// semaphore's permit is a lease on one of its slot keys, judged as any
// lease: the generative mode checks permits per slot and has no check
// of their number.
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
// A read-write lock grant's write is an access to the lock's resource
// (see Replay).
type ReplayWrite struct {
	Lease             int
	Token             fencelock.Token
	Invoked, Returned int64
	Accepted, Late    bool
}

// Violation is a broken invariant that Replay.Check found: Property names
// it as the generative mode reports it (e.g. "NoTwoHolders",
// "TokensIncreaseAcrossHolders", "NoStaleWriteAccepted", "NoTwoWriters"),
// Detail says which leases (grants, numbered as leases) and instants
// show it.
type Violation struct {
	Property string
	Detail   string
}

// String returns "Property: Detail".
func (v Violation) String() string { return v.Property + ": " + v.Detail }

// ErrMalformedReplay is returned by Replay.Check for a Replay it cannot
// check: a lease without a token, a write naming no lease. Fix the Replay.
var ErrMalformedReplay = errors.New("generative: malformed replay")

// Check runs the generative mode's history checkers (the ones a Run uses
// after each program: the lock checker, and the read-write checker for
// each read-write lock's grants) on rp and returns every violation they
// find, sorted and without duplicates; none if the history keeps every
// invariant.
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
	grants := map[int]*rwGrantRec{} // lease index → its grant, for leases of read-write locks
	runs := map[string]*rwRun{}     // lock → its grants and accesses
	var locks []string
	for i, l := range rp.Leases {
		lock, write, ok := rwRecord(l.Key)
		if !ok {
			continue
		}
		run := runs[lock]
		if run == nil {
			run = &rwRun{rec: newRecorder(), lost: map[string]int64{}}
			runs[lock] = run
			locks = append(locks, lock)
		}
		g := &rwGrantRec{id: i + 1, client: l.Client, write: write, owner: l.Owner, owners: []string{l.Owner}, token: l.Tokens[0].Token, inv: l.Inv, got: l.Got}
		g.end.Store(l.End)
		run.grants = append(run.grants, g)
		grants[i] = g
	}
	for i, w := range rp.Writes {
		if w.Lease < 0 || w.Lease >= len(rp.Leases) {
			return nil, fmt.Errorf("%w: write %d names lease %d of %d; name an index into Leases", ErrMalformedReplay, i, w.Lease, len(rp.Leases))
		}
		if g := grants[w.Lease]; g != nil {
			l := rp.Leases[w.Lease]
			lock, _, _ := rwRecord(l.Key)
			a := rwAccess{grant: g, write: g.write, late: w.Late, token: w.Token, inv: w.Invoked, ret: w.Returned, accepted: w.Accepted}
			a.heldAfter = !w.Late && (l.End == 0 || w.Returned < l.End)
			if !w.Accepted {
				a.refusedReason = errRefusedInReplay
			}
			runs[lock].access = append(runs[lock].access, a)
			continue
		}
		r.writes = append(r.writes, writeRec{lease: w.Lease + 1, key: rp.Leases[w.Lease].Key, token: w.Token, invoked: w.Invoked, returned: w.Returned, accepted: w.Accepted, late: w.Late})
	}
	vs := r.check()
	for _, lock := range locks {
		vs = append(vs, runs[lock].check()...)
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].String() < vs[j].String() })
	vs = slices.Compact(vs)
	out := make([]Violation, len(vs))
	for i, v := range vs {
		out[i] = Violation{v.property, v.detail}
	}
	return out, nil
}

// errRefusedInReplay is the reason given for a refused access of a
// Replay, which records no reason.
var errRefusedInReplay = errors.New("the resource refused it")

// rwRecord reports whether key is a read-write lock's gate (write true)
// or one of its reader slots (write false), and which lock's, by the
// layout of recipe.Keys. A writer's intent record is neither: a lease on
// it is no grant.
func rwRecord(key string) (lock string, write, ok bool) {
	sep, _ := recipe.Keys("", 0)
	i := strings.LastIndex(key, sep)
	if i < 0 {
		return "", false, false
	}
	lock = key[:i]
	_, records := recipe.Keys(lock, 0)
	switch rest := key[i+len(sep):]; {
	case key == records[0]:
		return lock, true, true
	case strings.HasPrefix(rest, "r/") && isDecimal(rest[len("r/"):]):
		return lock, false, true
	}
	return "", false, false
}

// isDecimal reports whether s is a reader slot's number: decimal digits,
// without a leading zero unless it is "0".
func isDecimal(s string) bool {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
