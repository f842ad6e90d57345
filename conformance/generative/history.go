package generative

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// A history records, in one total order (seq: an atomic counter taken
// at each recorded instant), what every client and the fenced resource saw.
// Its checks are the invariants; each is conservative: an instant is
// recorded so that a window of holding is never wider than the holder's
// belief, so a reported violation is a real one.

type leaseRec struct {
	id     int
	client int
	key    string
	owner  string
	inv    int64 // seq before Acquire (or Do) was called
	got    int64 // seq after Acquire returned
	end    int64 // seq when the holder stopped believing; 0 while held
	cause  error // why it ended, if lost
	tokens []tokObs
	forced int64 // seq when a forced release that removed it began
	via    string
	gone   bool  // its own release confirmed its record gone
	relEnd int64 // seq when its own release returned "not held", if it did
	stale  []string

	// Per-call options (WithLabel, WithMetadata, WithMinHold).
	label   string
	metas   []metaSet     // the metadata it asked for, in order: at acquire, then each SetMetadata
	minHold time.Duration // 0: none
	invAt   time.Time     // wall clock before Acquire (or Do) was called
	gotAt   time.Time     // wall clock after it returned
	heldMin bool          // released before its minimum hold could end: the record must stay until invAt + minHold at least
	inHold  bool          // the engine says it went into its minimum hold

	lockDelay time.Duration // WithLockDelay of its call; 0: none
	staleSent bool          // a stale Release or Renew was sent with its grant (it may have freed the key)
	group     int           // the multi-key grant it is a member of (multi.go); 0: none

	zeroAt   int64 // seq after its holder first saw Remaining() at 0 (validity.go); 0: not yet
	cameBack bool  // a ValidityNeverComesBack violation was recorded for it
}

// metaSet is one metadata value a lease asked the store to keep.
type metaSet struct {
	value    string
	inv, ret int64 // seqs around the call
	ok       bool  // the store confirmed it
}

// metaObs is what Client.Inspect showed the worker of lease by: the look
// was called at inv and returned at seq.
type metaObs struct {
	by    int
	inv   int64
	seq   int64
	owner string
	label string
	meta  string
}

type tokObs struct {
	token fencelock.Token
	seq   int64
}

type writeRec struct {
	lease    int
	key      string
	token    fencelock.Token
	invoked  int64
	returned int64
	accepted bool
	late     bool // written after the lease ended, as a paused holder would
}

type faultRec struct {
	seq    int64
	client int
	op     string
	kind   string
	owners []string
	rotate bool
}

type forceRec struct {
	key           string
	before, after int64
	beforeAt      time.Time       // wall clock before the call
	owner         string          // the holder it removed, if known
	token         fencelock.Token // and its token
}

// raiseRec is a RaiseFloor that returned success.
type raiseRec struct {
	key           string
	floor         fencelock.Token
	before, after int64
}

type recorder struct {
	seq atomic.Int64

	mu      sync.Mutex
	multis  int // multi-key grants handed out
	groups  int // the last multi-key grant's group number (leaseRec.group)
	leases  []*leaseRec
	byOwner map[string]*leaseRec
	writes  []writeRec
	faults  []faultRec
	forces  []forceRec
	raises  []raiseRec
	obs     []metaObs
	closeAt map[int]time.Time // wall clock when each client began to close or crashed
	notes   []string
	direct  []violation                  // seen while the program ran (records left behind, …)
	closed  map[int]int64                // seq when each client began to close or crashed
	crashed map[int]bool                 // the clients that crashed (rather than closed)
	issued  map[string][]fencelock.Token // tokens the store issued by rotation, per owner
	sent    map[string]int64             // seq when the last acquire attempt was sent, per owner
	// ahead is how far each client's clock has jumped (validity.go).
	ahead map[int]time.Duration
	// unanswered are the owners a store call failed for without an
	// answer (see storeFailed).
	unanswered map[string]bool
	// acqBatches and relBatches count the batches of two or more
	// coalesced acquire attempts and releases the clients sent.
	acqBatches, relBatches int
}

func newRecorder() *recorder {
	return &recorder{byOwner: make(map[string]*leaseRec), closed: make(map[int]int64), crashed: make(map[int]bool), closeAt: make(map[int]time.Time), issued: make(map[string][]fencelock.Token), sent: make(map[string]int64)}
}

func (r *recorder) tick() int64 { return r.seq.Add(1) }

func (r *recorder) note(format string, args ...any) {
	s := r.tick()
	r.mu.Lock()
	r.notes = append(r.notes, fmt.Sprintf("%5d ", s)+fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// lease registers a lease that a worker now holds.
func (r *recorder) lease(client int, l *fencelock.Lease, via string, inv int64) *leaseRec {
	got := r.tick()
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.byOwner[l.Owner()]
	if rec == nil {
		rec = &leaseRec{owner: l.Owner(), key: l.Key()}
		r.byOwner[l.Owner()] = rec
	}
	rec.id, rec.client, rec.got, rec.via, rec.inv = len(r.leases)+1, client, got, via, inv
	// A rotation recorded before the worker registered the lease
	// already carries its current token.
	if !slices.ContainsFunc(rec.tokens, func(t tokObs) bool { return t.token == l.Token() }) {
		rec.tokens = append(rec.tokens, tokObs{l.Token(), got})
	}
	r.leases = append(r.leases, rec)
	// A loss before the worker registered the lease was recorded on
	// the owner already; it stays.
	return rec
}

// ended records that a holder stopped believing it holds (before it calls
// Release, or when it learns of a loss).
func (r *recorder) ended(rec *leaseRec, cause error) {
	s := r.tick()
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec.end == 0 {
		rec.end, rec.cause = s, cause
	}
}

// observer returns the engine Observer for one client: it records losses
// and rotations as they happen.
func (r *recorder) observer() fencelock.Observer {
	return fencelock.ObserverFunc(func(e fencelock.Event) {
		switch e.Kind {
		case fencelock.EventLost, fencelock.EventRotated:
		default:
			if debug {
				r.note("event %v %s token %d err %v", e.Kind, e.Owner, e.Token, e.Err)
			}
			return
		}
		s := r.tick()
		r.mu.Lock()
		defer r.mu.Unlock()
		rec := r.byOwner[e.Owner]
		if rec == nil { // not yet registered by its worker
			rec = &leaseRec{owner: e.Owner, key: e.Key}
			r.byOwner[e.Owner] = rec
		}
		switch e.Kind {
		case fencelock.EventLost:
			if rec.end == 0 {
				rec.end, rec.cause = s, e.Err
			}
		case fencelock.EventRotated:
			// The worker may have read the rotated token first.
			if !slices.ContainsFunc(rec.tokens, func(t tokObs) bool { return t.token == e.Token }) {
				rec.tokens = append(rec.tokens, tokObs{e.Token, s})
			}
		}
	})
}

func (r *recorder) write(rec *leaseRec, token fencelock.Token, late bool, check func() error) error {
	inv := r.tick()
	err := check()
	ret := r.tick()
	r.mu.Lock()
	r.writes = append(r.writes, writeRec{lease: rec.id, key: rec.key, token: token, invoked: inv, returned: ret, accepted: err == nil, late: late})
	r.mu.Unlock()
	return err
}

// closing records that client begins to close (or crashes): its leases
// end at the latest there, as far as the store is concerned. Taken
// before Close is called, so a window never reaches past it.
func (r *recorder) closing(client int, format string, args ...any) {
	s := r.tick()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.closed[client]; !ok {
		r.closed[client] = s
		r.closeAt[client] = time.Now()
	}
	r.notes = append(r.notes, fmt.Sprintf("%5d ", s)+fmt.Sprintf(format, args...))
}

// rotated records a token the store issued to owner by a rotation, seen
// by the engine or not.
func (r *recorder) rotated(owner string, t fencelock.Token) {
	r.mu.Lock()
	r.issued[owner] = append(r.issued[owner], t)
	r.mu.Unlock()
}

// lostAtRelease records that the store no longer had the lease's record
// when its holder released it (the loss was found at release).
func (r *recorder) lostAtRelease(rec *leaseRec, err error) {
	s := r.tick()
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec.cause == nil {
		rec.cause = err
	}
	rec.relEnd = s
}

// released records the outcome of the lease's own release.
func (r *recorder) released(rec *leaseRec, gone bool) {
	r.mu.Lock()
	rec.gone = gone
	r.mu.Unlock()
}

// stale records the outcome of a Release or Renew sent with the lease's
// grant after the lease ended.
func (r *recorder) stale(rec *leaseRec, kind staleKind, err error) {
	s := r.tick()
	r.mu.Lock()
	defer r.mu.Unlock()
	name := "release"
	if kind == staleRenew {
		name = "renew"
	}
	rec.staleSent = true
	r.notes = append(r.notes, fmt.Sprintf("%5d stale %s by lease %d: %v", s, name, rec.id, err))
	if err == nil && rec.gone {
		rec.stale = append(rec.stale, name)
	}
}

// leftBehind records what the store still held when it should have held
// nothing.
func (r *recorder) leftBehind(property, when string, infos []driver.Info) {
	s := r.tick()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, fmt.Sprintf("%5d %s: left behind %+v", s, property, infos))
	for _, i := range infos {
		r.direct = append(r.direct, violation{property, fmt.Sprintf("%s, the store still has %q held by %s (token %d)", when, i.Key, i.Owner, i.Token)})
	}
}

// violate records a violation seen directly while the program ran.
func (r *recorder) violate(property, format string, args ...any) {
	s := r.tick()
	v := violation{property, fmt.Sprintf(format, args...)}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, fmt.Sprintf("%5d violation: %s", s, v))
	r.direct = append(r.direct, v)
}

// isLate reports whether a fault's kind is a request that reached the
// store late: a late request ("late", "late-cut"), or one that waited in
// its client's coalescing lane behind a held-up request ("queued", see
// laneWatch).
func isLate(kind string) bool { return kind == "late" || kind == "late-cut" || kind == "queued" }

// faultedBeyondLate reports whether a fault other than a late request
// (isLate) touched the program.
func (r *recorder) faultedBeyondLate() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.faults {
		if !isLate(f.kind) {
			return true
		}
	}
	return false
}

// lateWhileClosing reports whether a late request (kinds "late" and
// "late-cut") of a client was sent, or cut short, after that client began
// to close. Such a request may outlast Close, and what it was to do is
// then left to the store's TTL. Close has one budget of ReleaseTimeout
// (RT): the attempt in flight has three quarters of it, the clean-up
// after it the rest, and every request is cut off when it ends; a late
// request takes up to RT/2, and a clean-up may need two in turn (a
// release that met a rotation in flight, then the rotated record's). Once
// the budget ends, Close closes the backend, and the faulty driver's late
// request, applied then, meets a closed backend that refuses it. A late
// request sent before the client began to close is answered within the
// engine's wait for it, and leaves nothing.
func (r *recorder) lateWhileClosing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.faults {
		if !isLate(f.kind) {
			continue
		}
		if c, ok := r.closed[f.client]; ok && f.seq > c {
			return true
		}
	}
	return false
}

func (r *recorder) fault(client int, op, kind string, owners []string, rotate bool) {
	s := r.tick()
	r.mu.Lock()
	r.faults = append(r.faults, faultRec{seq: s, client: client, op: op, kind: kind, owners: owners, rotate: rotate})
	r.mu.Unlock()
}

// storeFailed records that a call for owners failed in the store or on
// the way to it, with no answer that says what it did (not a refusal, not
// an injected fault, not its caller giving up): the store was slow or
// down, which no program asked for. A record of those owners may be left
// behind by it, until its TTL: the engine's clean-up failed the same way.
func (r *recorder) storeFailed(owners []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unanswered == nil {
		r.unanswered = make(map[string]bool)
	}
	for _, o := range owners {
		r.unanswered[o] = true
	}
}

// failedInStore reports whether a call for owner failed as storeFailed
// records.
func (r *recorder) failedInStore(owner string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unanswered[owner]
}

// batch records that client's engine sent a batch of coalesced requests
// (op "acquire" or "release") for owners, in one call to its driver.
func (r *recorder) batch(op string, client int, owners []string) {
	s := r.tick()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(owners) >= 2 {
		if op == "acquire" {
			r.acqBatches++
		} else {
			r.relBatches++
		}
	}
	r.notes = append(r.notes, fmt.Sprintf("%5d client %d sends a batch of %d %ss: %v", s, client, len(owners), op, owners))
}

// batches returns how many batches of two or more acquire attempts and
// releases the clients sent.
func (r *recorder) batches() (acquire, release int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acqBatches, r.relBatches
}

// cutShort reports whether a request for owner was a late request cut
// short (kind "late-cut"): it lands after its senders gave up.
func (r *recorder) cutShort(owner string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.faults {
		if f.kind == "late-cut" && slices.Contains(f.owners, owner) {
			return true
		}
	}
	return false
}

// attempt records that an acquire attempt for owner is being sent to the
// store.
func (r *recorder) attempt(owner string) {
	s := r.tick()
	r.mu.Lock()
	r.sent[owner] = s
	r.mu.Unlock()
}

func (r *recorder) raised(key string, floor fencelock.Token, before, after int64) {
	r.mu.Lock()
	r.raises = append(r.raises, raiseRec{key, floor, before, after})
	r.mu.Unlock()
}

func (r *recorder) force(key string, before, after int64, beforeAt time.Time, owner string, token fencelock.Token) {
	r.mu.Lock()
	r.forces = append(r.forces, forceRec{key, before, after, beforeAt, owner, token})
	r.mu.Unlock()
}

// options records a new lease's per-call options: when its Acquire was
// called (invAt, seq inv), its minimum hold, label and first metadata.
func (r *recorder) options(rec *leaseRec, invAt time.Time, minHold time.Duration, label, meta string, inv int64) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.invAt, rec.gotAt, rec.minHold, rec.label = invAt, now, minHold, label
	if meta != "" {
		rec.metas = append(rec.metas, metaSet{value: meta, inv: inv, ret: rec.got, ok: true})
	}
}

// setMeta records a SetMetadata and its outcome.
func (r *recorder) setMeta(rec *leaseRec, v string, inv int64, err error) {
	s := r.tick()
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.metas = append(rec.metas, metaSet{value: v, inv: inv, ret: s, ok: err == nil})
	if err != nil {
		r.notes = append(r.notes, fmt.Sprintf("%5d lease %d SetMetadata(%s): %v", s, rec.id, v, err))
	}
}

// inspected records what Client.Inspect, called at inv, showed lease
// rec's worker.
func (r *recorder) inspected(rec *leaseRec, inv int64, info driver.Info) {
	s := r.tick()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.obs = append(r.obs, metaObs{by: rec.id, inv: inv, seq: s, owner: info.Owner, label: info.Label(), meta: string(info.Metadata)})
	r.notes = append(r.notes, fmt.Sprintf("%5d lease %d inspects %q (called at %d): owner %s, label %q, metadata %q", s, rec.id, info.Key, inv, info.Owner, info.Label(), info.Metadata))
}

// heldForMinimum reports whether the engine says l, released, went into
// its minimum hold (its context's cause): its record stays until the hold
// ends, so stale calls with its grant are its own.
func (r *recorder) heldForMinimum(rec *leaseRec, l *fencelock.Lease) bool {
	held := l.Err() == nil && errors.Is(context.Cause(l.Context()), fencelock.ErrHeldForMinimum)
	r.mu.Lock()
	rec.inHold = held
	r.mu.Unlock()
	return held
}

// releasedOK records that lease rec's own release (Release, or Do's)
// returned success at retAt. If that was before its minimum hold could
// have ended (its Acquire was called at invAt, and the engine counts
// from the grant, later), the lease was released into its hold, whatever
// the engine says: MinHoldRespected checks the key stayed held, and
// MinHoldReported that the lease's context said so. The engine counts
// the hold by its client's clock, which may have jumped ahead (jumpClock)
// and ended the hold that much earlier: retAt is judged that much later.
func (r *recorder) releasedOK(rec *leaseRec, l *fencelock.Lease, retAt time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec.minHold > 0 && l.Err() == nil && retAt.Add(r.aheadOf(rec.client)).Before(rec.invAt.Add(rec.minHold)) {
		rec.heldMin = true
		if cause := context.Cause(l.Context()); !errors.Is(cause, fencelock.ErrHeldForMinimum) || !errors.Is(cause, fencelock.ErrReleased) {
			r.direct = append(r.direct, violation{"MinHoldReported", fmt.Sprintf("lease %d (%q) was released inside its minimum hold, yet its context's cause is %v", rec.id, rec.key, cause)})
		}
	}
}

// inHold reports whether the engine said rec went into its minimum hold.
func (r *recorder) inHold(rec *leaseRec) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return rec.inHold
}

// holdsEnd returns the latest instant at which a lease's minimum hold
// may end (counted from when its Acquire returned); zero if none.
func (r *recorder) holdsEnd() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var end time.Time
	for _, l := range r.leases {
		if l.minHold > 0 && l.gotAt.Add(l.minHold).After(end) {
			end = l.gotAt.Add(l.minHold)
		}
	}
	return end
}

// violation is one broken invariant, with the rule it breaks.
type violation struct {
	property string
	detail   string
}

func (v violation) String() string { return v.property + ": " + v.detail }

// check checks the recorded history and returns every violation found.
func (r *recorder) check() []violation {
	r.mu.Lock()
	defer r.mu.Unlock()
	var vs []violation
	add := func(p, f string, args ...any) { vs = append(vs, violation{p, fmt.Sprintf(f, args...)}) }
	// A multi-key grant ends when one of its members is lost, before
	// the engine tells observers of the loss (recipe.MultiGrant: the
	// grant's Done closes as the member ends), and releases the others:
	// the member's loss, recorded as the engine reported it, cuts the
	// windows of all. Without it, a sibling's record released by the
	// grant could be taken by another client before the worker, which
	// checks the grant only between its steps, recorded the sibling's
	// end.
	groupLost := make(map[int]int64)
	for _, l := range r.leases {
		var lost *fencelock.LostError
		if l.group == 0 || l.end == 0 || !errors.As(l.cause, &lost) {
			continue
		}
		if c, ok := groupLost[l.group]; !ok || l.end < c {
			groupLost[l.group] = l.end
		}
	}
	end := func(l *leaseRec) int64 {
		e := l.end
		if e == 0 {
			e = 1 << 62 // still held when the history closed
		}
		if l.forced != 0 && l.forced < e {
			e = l.forced
		}
		if c, ok := groupLost[l.group]; ok && l.group != 0 && c < e {
			e = c
		}
		if c, ok := r.closed[l.client]; ok && c < e {
			e = c
		}
		return e
	}
	// A forced release of a key cuts the window of the lease it removed.
	for _, f := range r.forces {
		for _, l := range r.leases {
			// The lease it removed, by owner, even if the lease's worker
			// had not yet recorded it. One Acquire call (one owner) may
			// retry into a new grant before it hands out a lease: a
			// force that removed an earlier grant has a lower token
			// than the lease's first (a rotation it removed, seen or
			// not, has a higher one).
			hit := f.owner == l.owner && f.token >= l.tokens[0].token
			// Any lease of the key whose record's life the force
			// overlapped, whoever the force reported: from the moment
			// its last acquire attempt was sent until its holder stopped
			// believing, or until its own release returned "not held".
			// That covers forces that reported no holder, and composite
			// backends (migrate.Dual) whose report names one side's
			// holder and token: a lease half acquired or half released,
			// or mid-handover between two holders.
			last := l.end
			if l.relEnd > last {
				last = l.relEnd
			}
			if s, ok := r.sent[l.owner]; ok && l.key == f.key && s < f.after && (last == 0 || last > f.before) {
				hit = true
			}
			if hit {
				if l.forced == 0 || f.before < l.forced {
					l.forced = f.before
				}
			}
		}
	}
	// A multi-key grant ends when one of its members is forced, and
	// releases the others (recipe.MultiGrant): a force of one member
	// cuts the windows of all, as a correct holder stops writing at the
	// grant's end. Without it, a sibling's record released by the grant
	// could be taken by another client before the worker recorded the
	// sibling's end.
	groupCut := make(map[int]int64)
	for _, l := range r.leases {
		if l.group != 0 && l.forced != 0 {
			if c, ok := groupCut[l.group]; !ok || l.forced < c {
				groupCut[l.group] = l.forced
			}
		}
	}
	for _, l := range r.leases {
		if c, ok := groupCut[l.group]; ok && l.group != 0 && (l.forced == 0 || c < l.forced) {
			l.forced = c
		}
	}
	// Owners whose rotation's outcome a fault hid from the engine (its
	// reply was lost or cut short), or whose renewal or release reached
	// the store late; or whose rotation was only delayed, but the
	// holder's release was itself delayed or failed, so that the record
	// the rotation left may have expired before the engine found it.
	unsure := make(map[string]bool)
	delayedRotation := make(map[string]bool)
	faultedRelease := make(map[string]bool)
	for _, f := range r.faults {
		for _, o := range f.owners {
			switch {
			case f.rotate && (f.kind == "lose" || f.kind == "delay-cut" || f.kind == "late-cut"):
				unsure[o] = true
			case isLate(f.kind) && f.op != "acquire":
				// A renewal or release that reached the store late may
				// have come after the record expired (a release into
				// the minimum hold is a renewal too).
				unsure[o] = true
			case f.rotate && (f.kind == "delay" || f.kind == "late"):
				delayedRotation[o] = true
			case f.op == "release":
				faultedRelease[o] = true
			case f.op == "renew" && r.byOwner[o] != nil && r.byOwner[o].minHold > 0 && r.byOwner[o].end != 0 && f.seq > r.byOwner[o].end:
				// A release inside the minimum hold is a renewal
				// (the record stays until the hold ends).
				faultedRelease[o] = true
			}
		}
	}
	// A rotation the lease never saw (its answer came after the lease
	// was released) leaves the record under a token the release does
	// not carry; the engine then finds the record by owner, unless a
	// delayed or failed release let it expire first.
	for o, toks := range r.issued {
		l := r.byOwner[o]
		for _, t := range toks {
			if l != nil && !slices.ContainsFunc(l.tokens, func(x tokObs) bool { return x.token == t }) {
				delayedRotation[o] = true
			}
		}
	}
	for o := range delayedRotation {
		if faultedRelease[o] {
			unsure[o] = true
		}
	}
	// A stalled store answered every request in flight late, renewals
	// and releases included.
	if r.stalled() {
		for o := range r.byOwner {
			unsure[o] = true
		}
	}
	vs = append(vs, r.direct...)
	// A lease's window is [got, end(l)]; it is empty when the lease had
	// ended (forced, or released by Close) before its worker recorded the
	// grant.
	nonEmpty := func(l *leaseRec) bool { return l.got < end(l) }
	last := func(l *leaseRec) int64 { return l.tokens[len(l.tokens)-1].seq }
	// before reports whether a's grant (and every token it saw) certainly
	// preceded b's grant: a's window ended before b's began (both
	// windows real: holders of a key never overlap, checked below), or a
	// saw its last token before b's Acquire was even called.
	before := func(a, b *leaseRec) bool {
		return nonEmpty(a) && nonEmpty(b) && end(a) <= b.got || last(a) < b.inv
	}
	byKey := make(map[string][]*leaseRec)
	for _, l := range r.leases {
		byKey[l.key] = append(byKey[l.key], l)
		for _, name := range l.stale {
			add("StaleCallsRefused", "a stale %s with lease %d's ended grant (%q, token %d) was accepted", name, l.id, l.key, l.tokens[len(l.tokens)-1].token)
		}
		// A lease's own tokens increase (the engine ends a lease whose
		// store returns a lower one: TokensNeverRegress below); the
		// order in which the worker and the observer saw them is not
		// the order they were issued in, so only their values count.
		if l.tokens[0].token == 0 {
			add("TokensNonZero", "lease %d (%s) got token 0", l.id, l.key)
		}
		switch {
		case errors.Is(l.cause, fencelock.ErrTokenRegressed):
			add("TokensNeverRegress", "lease %d (%s) was lost because the store returned a lower token", l.id, l.key)
		case errors.Is(l.cause, fencelock.ErrNotHeld) && l.forced == 0 && !unsure[l.owner]:
			add("NoLossWithoutCause", "lease %d (%s, token %d) was told 'not held' though no one forced its key and no rotation of it was hidden by a fault: a stale call or a race disturbed a live holder", l.id, l.key, l.tokens[len(l.tokens)-1].token)
		}
	}
	// A floor raised before an acquire was called is below its token.
	for _, f := range r.raises {
		for _, l := range byKey[f.key] {
			if l.inv > f.after && l.tokens[0].token <= f.floor {
				add("TokenAboveFloor", "lease %d of %q was granted token %d; its acquire began after RaiseFloor(%d) returned", l.id, f.key, l.tokens[0].token, f.floor)
			}
		}
	}
	for key, ls := range byKey {
		for i, a := range ls {
			for _, b := range ls[i+1:] {
				// Never two holders whose windows overlap.
				if nonEmpty(a) && nonEmpty(b) && a.got < end(b) && b.got < end(a) {
					add("NoTwoHolders", "leases %d and %d of %q both believed they held it (windows %d–%d and %d–%d)", a.id, b.id, key, a.got, end(a), b.got, end(b))
					continue
				}
				first, second := a, b
				switch {
				case before(a, b):
				case before(b, a):
					first, second = b, a
				default:
					continue // their order is not known
				}
				// Tokens strictly increase in grant order, and never repeat.
				hi := slices.MaxFunc(first.tokens, func(x, y tokObs) int { return cmpTok(x.token, y.token) }).token
				lo := slices.MinFunc(second.tokens, func(x, y tokObs) int { return cmpTok(x.token, y.token) }).token
				if hi >= lo {
					add("TokensIncreaseAcrossHolders", "lease %d of %q held token %d before lease %d was granted token %d", first.id, key, hi, second.id, lo)
				}
			}
		}
	}
	// No stale write accepted: once a later holder's write has reached
	// the resource, accepted or not, an earlier holder's write must be
	// refused (the safety suite's P1). A refused write of a later holder
	// carried a token no higher than the resource had seen, so with
	// tokens in grant order the earlier holder's is refused too.
	leaseByID := make(map[int]*leaseRec, len(r.leases))
	for _, l := range r.leases {
		leaseByID[l.id] = l
	}
	for _, wa := range r.writes {
		if !wa.accepted {
			a := leaseByID[wa.lease]
			// A live holder writing with its current token must get
			// through, unless its key was forced or someone was
			// granted the key after it (reported above).
			if !wa.late && wa.returned < end(a) && !r.grantedBetween(a.key, a.got, wa.returned) {
				add("LiveHolderWritesAccepted", "lease %d (%q, token %d) was refused while it held the key", a.id, a.key, wa.token)
			}
			continue
		}
		a := leaseByID[wa.lease]
		for _, wb := range r.writes {
			if wb.key != wa.key || wb.lease == wa.lease || wb.returned >= wa.invoked {
				continue
			}
			b := leaseByID[wb.lease]
			if before(a, b) {
				add("NoStaleWriteAccepted", "lease %d's write (token %d) to %q was accepted after lease %d, granted later, had written with token %d", a.id, wa.token, wa.key, b.id, wb.token)
			}
		}
	}
	vs = append(vs, r.checkOptions(byKey)...)
	vs = append(vs, r.checkLockDelay(byKey)...)
	sort.Slice(vs, func(i, j int) bool { return vs[i].String() < vs[j].String() })
	return slices.Compact(vs)
}

// checkOptions checks the per-call options' properties. Called with r.mu
// held, after forces were applied to the leases.
func (r *recorder) checkOptions(byKey map[string][]*leaseRec) []violation {
	var vs []violation
	add := func(p, f string, args ...any) { vs = append(vs, violation{p, fmt.Sprintf(f, args...)}) }
	// LabelReadBack, MetadataIsHoldersLast: what Inspect shows for a
	// holder is the label it gave and the last metadata it set — the last
	// value the store confirmed before the look was called, or one asked
	// for since, before the look returned (an update whose outcome was
	// unknown, or one that ran concurrently with the look: a look called
	// before the update returned may be served before it took effect).
	lateFor := map[string][]faultRec{}
	for _, f := range r.faults {
		if (f.kind == "late" || f.kind == "late-cut" || f.kind == "delay-cut") && (strings.HasPrefix(f.op, "acquire") || f.op == "renew" || f.op == "renew-batch") {
			for _, o := range f.owners {
				lateFor[o] = append(lateFor[o], f)
			}
		}
	}
	for _, o := range r.obs {
		l := r.byOwner[o.owner]
		if l == nil || o.owner == "" {
			continue
		}
		if l.label != "" && o.label != l.label {
			add("LabelReadBack", "Inspect showed lease %d (%s) with label %q; it was acquired with %q", l.id, o.owner, o.label, l.label)
		}
		if len(l.metas) == 0 {
			continue
		}
		possible := map[string]bool{}
		for _, m := range l.metas {
			switch {
			case m.ok && m.ret < o.inv:
				possible = map[string]bool{m.value: true}
			case m.inv < o.seq:
				possible[m.value] = true
			}
		}
		// A request the faulty driver let through after the engine gave
		// up on it (late, late-cut, delay-cut) lands whenever it lands: an
		// Acquire by the same owner is a retry and replaces the record
		// with the metadata it carries (the driver contract), and so does
		// a renewal that carried metadata. The values set before such a
		// request stay possible after it.
		for _, f := range lateFor[o.owner] {
			if f.seq < o.seq {
				for _, m := range l.metas {
					if m.inv < f.seq {
						possible[m.value] = true
					}
				}
			}
		}
		if !possible[o.meta] {
			vals := make([]string, 0, len(possible))
			for v := range possible {
				vals = append(vals, v)
			}
			sort.Strings(vals)
			add("MetadataIsHoldersLast", "Inspect (by lease %d, called at %d, returned at %d) showed holder lease %d's metadata as %q; it had last set one of %q", o.by, o.inv, o.seq, l.id, o.meta, vals)
		}
	}
	// MinHoldRespected: a lease released into its minimum hold keeps its
	// key from every other holder until the hold ends (counted from
	// before its Acquire was called, which is no later than the engine's
	// count), unless a fault touched its calls (a failed keep-alive may
	// let the record expire), its key was forced, or its client closed
	// or crashed (a session store ends its records then).
	//
	// A lease follows x if the store granted it after x's release, which
	// the return of its Acquire does not date: a call may return late,
	// after Close (or a force) already ended its lease. The tokens do:
	// they increase in the store's grant order, per key, so a lease whose
	// every token is below x's first was granted, and rotated, before x
	// was, and its record was gone before x's grant (one holder at a
	// time). It did not follow x, however late its call returned. Had it
	// believed it held after x's release with a record that old, its
	// window would follow x's with a lower token: TokensIncreaseAcrossHolders.
	faulted := make(map[string]bool)
	for _, f := range r.faults {
		for _, o := range f.owners {
			faulted[o] = true
		}
	}
	stalled := r.stalled()
	for _, x := range r.leases {
		if !x.heldMin || faulted[x.owner] || stalled {
			continue
		}
		// The engine counts the hold by its client's clock: each jump
		// of that clock (jumpClock) ended it that much earlier.
		end := x.invAt.Add(x.minHold - r.aheadOf(x.client))
		if c, ok := r.closeAt[x.client]; ok && c.Before(end) {
			end = c
		}
		for _, f := range r.forces {
			if f.key == x.key && f.beforeAt.Before(end) {
				end = f.beforeAt
			}
		}
		for _, y := range byKey[x.key] {
			if y == x || maxTok(y) < minTok(x) {
				continue // granted before x on the store
			}
			if x.end != 0 && y.got > x.end && y.gotAt.Before(end) {
				add("MinHoldRespected", "lease %d of %q (minimum hold %v, released into it at %d) was followed by lease %d, granted %v after lease %d's Acquire was called", x.id, x.key, x.minHold, x.end, y.id, y.gotAt.Sub(x.invAt), x.id)
			}
		}
	}
	return vs
}

// stalled reports whether the store stalled during the program. Called
// with r.mu held.
func (r *recorder) stalled() bool {
	for _, f := range r.faults {
		if f.kind == "stall" {
			return true
		}
	}
	return false
}

// grantedBetween reports whether some lease of key was granted in (from, to).
func (r *recorder) grantedBetween(key string, from, to int64) bool {
	for _, l := range r.leases {
		if l.key == key && l.got > from && l.got < to {
			return true
		}
	}
	return false
}

// maxTok returns the highest token l saw.
func maxTok(l *leaseRec) fencelock.Token {
	return slices.MaxFunc(l.tokens, func(x, y tokObs) int { return cmpTok(x.token, y.token) }).token
}

// minTok returns the lowest token l saw (its grant's: its own tokens
// increase, in whatever order they were seen).
func minTok(l *leaseRec) fencelock.Token {
	return slices.MinFunc(l.tokens, func(x, y tokObs) int { return cmpTok(x.token, y.token) }).token
}

func cmpTok(a, b fencelock.Token) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// trace renders the history for a failure report.
func (r *recorder) trace() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	type line struct {
		seq  int64
		text string
	}
	var ls []line
	for _, l := range r.leases {
		toks := make([]string, len(l.tokens))
		for i, t := range l.tokens {
			toks[i] = fmt.Sprint(t.token)
		}
		ls = append(ls, line{l.got, fmt.Sprintf("client %d lease %d (%s) %s %q tokens %s", l.client, l.id, l.owner, l.via, l.key, strings.Join(toks, "→"))})
		if l.end != 0 {
			cause := "released"
			if l.cause != nil {
				cause = l.cause.Error()
			}
			ls = append(ls, line{l.end, fmt.Sprintf("client %d lease %d ended: %s", l.client, l.id, cause)})
		}
	}
	for _, w := range r.writes {
		verdict := "accepted"
		if !w.accepted {
			verdict = "refused"
		}
		late := ""
		if w.late {
			late = " (late)"
		}
		ls = append(ls, line{w.invoked, fmt.Sprintf("lease %d writes %q token %d%s: %s at %d", w.lease, w.key, w.token, late, verdict, w.returned)})
	}
	for _, f := range r.faults {
		ls = append(ls, line{f.seq, fmt.Sprintf("client %d fault %s on %s (rotate %v) %v", f.client, f.kind, f.op, f.rotate, f.owners)})
	}
	for _, f := range r.forces {
		ls = append(ls, line{f.before, fmt.Sprintf("force-release %q (holder %s) until %d", f.key, f.owner, f.after)})
	}
	for _, f := range r.raises {
		ls = append(ls, line{f.before, fmt.Sprintf("raise-floor %q to %d until %d", f.key, f.floor, f.after)})
	}
	for _, n := range r.notes {
		var s int64
		fmt.Sscan(n, &s)
		ls = append(ls, line{s, strings.TrimSpace(n[5:])})
	}
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].seq < ls[j].seq })
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "%5d %s\n", l.seq, l.text)
	}
	return b.String()
}
