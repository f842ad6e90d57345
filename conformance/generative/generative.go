// Package generative is the generative mode of fencelock's conformance
// suite: random programs over several clients and keys, with faults
// injected at the Backend boundary, each recorded as a history and checked
// against the invariants with a fenced resource in the loop.
//
// The fixed cases of package conformance prove what they were written to
// prove; interleaving bugs hide between them. Run generates programs with
// pgregory.net/rapid: two or three clients (each with one or two workers,
// so a client holds several leases and renews them in batches; in one
// lock program in three, a crowd of four to eight workers on every key
// the program may have, whose acquire attempts and releases the engine coalesces into
// batches where the backend can batch them), one to three keys, and
// per worker a sequence of steps — blocking and try acquires, Do with a
// callback that returns, fails or panics, waits cut short by their
// context, holds long enough to be renewed (with token rotation on some
// clients), writes to a fenced resource during the hold and, as a paused
// holder would, after it ended, stale Release and Renew calls with an
// ended grant. Clients end by Close, by Close in the middle of their
// work, or by crashing (nothing released, nothing renewed). An
// administrator force-releases keys where the backend can. A wrapping
// driver delays replies, loses replies after the call took effect
// (ambiguous operations), fails calls before they reach the store, and
// delays requests on their way to it — a coalesced batch as one request,
// and each of its members may still fail before the store or lose its
// own reply, as one member of a statement or pipeline does. A late
// request whose caller gave up is still applied when it arrives, as a
// server applies what its connection delivered (some clients have late
// requests alone). A client's process may pause while one of its
// renewals is answered: its clock (Options.Clock) jumps forward, its
// timers run late, and the answer arrives after its holder may have
// looked at the lease (clock.go).
// Where the backend is a driver.TokenFloorer, some programs start with
// floors just below 2^53, where a token kept in a float loses precision,
// and some raise a key's floor while the program runs, as a migration's
// dual backend does, between holders, waiters and rotations.
//
// Every program's history is checked for:
//
//   - NoTwoHolders: no two leases of a key believed they held it at the
//     same instant (a forced release ends the window of the lease it
//     removed);
//   - TokensIncreaseAcrossHolders, TokensNeverRegress: tokens strictly
//     increase per key in grant order, rotations included, and never
//     repeat; no renewal returns a lower token;
//   - TokenAboveFloor: an acquire called after a RaiseFloor returned gets
//     a token above that floor;
//   - NoStaleWriteAccepted: once a later holder's write was accepted by
//     the fence, no earlier holder's write is;
//   - LiveHolderWritesAccepted: a holder's write while it holds the key
//     gets through;
//   - NoLossWithoutCause: a lease is told "not held" only when its key was
//     forced, a fault hid the outcome of its rotation, or one of its
//     renewals or releases reached the store late — a stale call or a
//     race never disturbs a live holder;
//   - StaleCallsRefused: Release and Renew with an ended grant are refused;
//   - ValidityNeverComesBack: once a holder saw its lease's Remaining() at
//     0 (or Done closed), it never sees Remaining() > 0 again, and Done
//     closes within twice the lease's TTL plus slack (a holder looks
//     before each write, and every twentieth of a TTL while it holds;
//     validity.go);
//   - NothingLeftBehind: after every client ended, nothing is stored
//     (at once when no client crashed and no fault but late requests was
//     injected, else within TTL plus slack).
//
// One program in five is a read-write program instead (rwlock.go):
// clients taking read and write grants of one recipe.RWLock through
// the same faults and crashes, with a recipe.RWFence in the loop;
// checked for NoReaderBesideWriter, NoTwoWriters, GrantTokensIncrease,
// LiveAccessAccepted, NoStaleAccessAccepted and NothingLeftBehind.
//
// One program in five is an election instead (election.go): campaigners
// running recipe.Elect through the same faults, resigning, proclaiming
// and crashing, watched with recipe.Observe; checked for NoTwoHolders
// (no callback starts while another's context is live), ObserveInOrder,
// ObservedValuePublished and ResignFreesKey.
//
// One program in seven is an outage instead (outage.go): the store stops
// answering, refuses connections or vanishes after Open, and every call
// is checked for ending within its bound (CallEndsWithinBound) with the
// store's cause in its error (StoreCauseInError).
//
// Steps draw per-call options (WithTTL, WithMinHold, WithMetadata,
// WithWait, a label of their own) on locks, semaphores (one lock program
// in four takes permits), read-write locks and election terms; clients of
// one program differ in TTL, Margin, RotateEvery, default MinHold and
// the way they open their Backend (Options.Variants); some programs
// stall the whole store (Options.Stall, or every client's driver paused).
// NothingHeldButTheGrant, RefusedCallLeavesNothingHeld and
// TryRLockBesideReaders check that a refused call keeps no key.
//
// A failure prints rapid's seed and a shrunk program, and the history of
// the failing run, one line per recorded instant. With real servers a
// rerun may interleave differently; the seed reproduces the program.
//
// # Running it
//
// A backend's test calls Run with the conformance.Harness it already has:
//
//	func TestGenerative(t *testing.T) {
//		generative.Run(t, harness, nil)
//	}
//
// Run stops starting programs after Options.Budget (default 60s, or the
// environment variable FENCELOCK_GEN_BUDGET, e.g. "30m" for a soak), and
// at rapid's -rapid.checks (default 100; RAPID_CHECKS). -rapid.seed
// replays a program.
package generative

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/recipe"
	"pgregory.net/rapid"
)

// Options tunes the generative mode. A nil *Options means defaults.
type Options struct {
	// Budget is how long Run keeps starting new programs (a program under
	// way finishes). Default: FENCELOCK_GEN_BUDGET, else 60s.
	Budget time.Duration

	// SyncTest runs each program inside a testing/synctest bubble, where
	// time is fake: for in-process backends (memory), whose every
	// goroutine and timer can live in the bubble. Harness.Open is then
	// called inside the bubble.
	SyncTest bool

	// Fresh, if set, is called at the start of every program, before any
	// Harness.Open (inside the bubble with SyncTest): e.g. to create a new
	// in-process store.
	Fresh func()

	// Clients is the largest number of clients in a program (at least 2).
	// Default 3.
	Clients int

	// Keys is the largest number of keys in a program. Default 3.
	Keys int

	// NoFaults turns off the fault-injecting driver.
	NoFaults bool
	// Pauses turns on process pauses (clock.go): a client's clock jumps
	// forward while one of its renewals is answered, as a process
	// stopped (GC, SIGSTOP, a VM migration) with the reply on its way
	// does (see docs/generative.md). Off by default; the runs of the
	// memory backend and of migrate.Dual over memory stores turn them
	// on. Against real servers, the safety suite stops real processes.
	Pauses bool

	// Known names properties that this store is known to violate, with
	// the documented reason (for example FerretDB, whose updates are a
	// read then an unconditional write, so two takeovers of one expired
	// key can both win). Their violations are counted and logged, not
	// failed; every other property still fails the test. Empty for a
	// store that claims every property.
	Known map[string]string

	// Variants, if set, are other ways to open a Backend on the
	// harness's store, each with a configuration of its own (for
	// MongoDB, another GarbageAfter or ClockResync): each client of a
	// program opens its Backend with Harness.Open or one of these, drawn
	// at random, so that differently configured clients share one store.
	// Each must reach the same store and key space as Harness.Open.
	Variants []func(ctx context.Context) (driver.Backend, error)

	// Stall, if set, makes the store stop answering for d, every
	// connection of every client at once, and returns at once (a
	// process paused with SIGSTOP, a proxy that holds every byte): what
	// reached the store is applied when it answers again. Some lock
	// programs stall the store for one to three TTLs at a drawn instant;
	// for a backend that estimates the server's clock (MongoDB's
	// hello-based estimate) that stall lands in the middle of
	// estimating. Without it, those programs pause every client's
	// wrapping driver instead (requests wait until the pause ends or
	// their context does, and then land).
	//
	// A Stall set here reaches the clients of every stream (Parallel),
	// and a lock program's timing checks discount only the stalls its
	// own program drew: with more than one stream, set it per stream
	// with PerStream instead.
	Stall func(ctx context.Context, d time.Duration)

	// PerStream, if set, is called once for each stream of programs
	// (Parallel), with the stream's index from 0, before the stream
	// starts: the Stream it returns replaces Harness.Open, Variants and
	// Stall for that stream's programs. A backend's test gives each
	// stream clients that dial through a Staller of their own, so that
	// a stall stalls the clients of the program that drew it alone,
	// as it would the store of a program run by itself: the programs
	// of the other streams (on keys of their own) are not slowed by a
	// fault that their checks cannot see.
	PerStream func(stream int) Stream

	// Parallel is how many programs run at once, each in its own
	// subtest with its own seeds. Default 4, or 1 with SyncTest (whose
	// programs use the CPU, not the clock).
	Parallel int

	// stalls records every Stall of the stream (set by resolve, and
	// per stream by forStream): a stall reaches every connection of
	// the Stall's clients, so every program that runs while it lasts,
	// not only the one that drew it.
	stalls *stallLog

	// lockDelay asks the store once whether it keeps lock delays (set by
	// resolve, shared by the streams).
	lockDelay *lockDelayProbe

	// programs, if set, ends the run after that many programs, within
	// the budget (the package's own tests).
	programs int64
}

// Stream is how one stream of programs opens its clients and stalls
// them (Options.PerStream).
type Stream struct {
	// Open opens a Backend on the harness's store, as Harness.Open does
	// (required).
	Open func(ctx context.Context) (driver.Backend, error)

	// Variants are the stream's Options.Variants.
	Variants []func(ctx context.Context) (driver.Backend, error)

	// Stall is the stream's Options.Stall: it stalls every client this
	// Stream's Open and Variants opened, and no other.
	Stall func(ctx context.Context, d time.Duration)
}

// stallLog records when the store's stalls (Options.Stall) end, for the
// checks that bound how soon the store answers: while it is stalled it
// answers nobody, whichever program stalled it.
type stallLog struct {
	mu    sync.Mutex
	until time.Time // the latest end of a stall so far
}

// add records a stall of d from now.
func (l *stallLog) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if u := time.Now().Add(d); u.After(l.until) {
		l.until = u
	}
}

// answersFrom returns the later of t and the end of the latest stall
// (one under way at t, or begun since): the instant from which a bound on
// how soon the store answers counts. A nil log (no Options.Stall)
// returns t.
func (l *stallLog) answersFrom(t time.Time) time.Time {
	if l == nil {
		return t
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.until.After(t) {
		return l.until
	}
	return t
}

func (o *Options) resolve() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Budget == 0 {
		r.Budget = 60 * time.Second
		if v := os.Getenv("FENCELOCK_GEN_BUDGET"); v != "" {
			if d, err := time.ParseDuration(v); err == nil && d > 0 {
				r.Budget = d
			}
		}
	}
	r.Clients = max(r.Clients, 2)
	if o == nil || o.Clients == 0 {
		r.Clients = 3
	}
	if r.Keys <= 0 {
		r.Keys = 3
	}
	if r.Parallel <= 0 {
		r.Parallel = 4
		if r.SyncTest {
			r.Parallel = 1
		}
	}
	r.logStalls()
	r.lockDelay = &lockDelayProbe{}
	return r
}

// logStalls wraps o.Stall to record its stalls in a new o.stalls.
func (o *Options) logStalls() {
	if stall := o.Stall; stall != nil {
		log := &stallLog{}
		o.stalls = log
		o.Stall = func(ctx context.Context, d time.Duration) {
			log.add(d)
			stall(ctx, d)
		}
	}
}

// forStream returns the harness and options of stream i: h and o, or
// with PerStream, the stream's own Open, Variants and Stall (and a log of
// that Stall's stalls alone).
func (o *Options) forStream(i int, h conformance.Harness) (conformance.Harness, *Options, error) {
	so := *o
	if o.PerStream == nil {
		return h, &so, nil
	}
	s := o.PerStream(i)
	if s.Open == nil {
		return h, nil, fmt.Errorf("generative: Options.PerStream(%d) returned a Stream without Open", i)
	}
	h.Open, so.Variants, so.Stall, so.stalls = s.Open, s.Variants, s.Stall, nil
	so.logStalls()
	return h, &so, nil
}

// flagSet reports whether the named flag was given a non-default value.
func flagSet(name string) bool {
	f := flag.Lookup(name)
	return f != nil && f.Value.String() != f.DefValue
}

// Stats counts what a Run did.
type Stats struct {
	Programs, Leases, Writes, Faults, Forced int64
	// Multi counts the multi-key grants handed out (stepMulti).
	Multi int64
	// Known counts violations of Options.Known properties.
	Known int64
	// AcquireBatches and ReleaseBatches count the batches of two or more
	// acquire attempts and of two or more releases that the engine
	// coalesced (the backend's driver.BatchAcquirer and
	// driver.BatchReleaser), over every kind of program.
	AcquireBatches, ReleaseBatches int64
}

// countBatches adds rec's batches to s.
func (s *Stats) countBatches(rec *recorder) {
	a, r := rec.batches()
	atomic.AddInt64(&s.AcquireBatches, int64(a))
	atomic.AddInt64(&s.ReleaseBatches, int64(r))
}

// Run runs generated programs against h's store until the budget or
// rapid's number of checks is used up, and fails t with the first
// violated invariant.
func Run(t *testing.T, h conformance.Harness, opts *Options) Stats {
	t.Helper()
	o := opts.resolve()
	if h.Open == nil && o.PerStream == nil {
		t.Fatal("generative: Harness.Open is required (or Options.PerStream)")
	}
	if h.TTL == 0 {
		h.TTL = time.Second
	}
	if h.Slack == 0 {
		h.Slack = h.TTL/2 + 250*time.Millisecond
	}
	var (
		stats Stats
		first failures // the first failing stream's violations
		begin = time.Now()
		bs    boundStats // outage programs' overruns (outage.go)
	)
	t.Cleanup(func() {
		// Last, even after rapid.Check's Fatal, so that it is in the
		// tail a CI log keeps of a long failure (the program, its
		// history and rapid's replay instructions are above).
		if vs := first.list(); len(vs) > 0 {
			t.Logf("generative: the first failing program violated:\n  %s", strings.Join(vs, "\n  "))
		}
	})
	spent := func(o *Options) bool {
		return time.Since(begin) > o.Budget || o.programs > 0 && atomic.LoadInt64(&stats.Programs) >= o.programs
	}
	prop := func(rt *rapid.T, h conformance.Harness, o *Options, failed *failures) {
		// The budget, or another stream's failure, stops new programs;
		// rapid's shrinking reruns this stream's failing program
		// whatever the time.
		if !failed.any() && (first.any() || spent(o)) {
			return
		}
		kind := rapid.IntRange(0, 6).Draw(rt, "election")
		if k, ok := onlyKinds[only]; ok {
			kind = k
		}
		switch kind {
		case 0:
			electionCheck(rt, h, o, &stats, failed) // election.go
			return
		case 1:
			rwCheck(rt, h, o, &stats, failed) // rwlock.go
			return
		case 2:
			if !o.NoFaults {
				outageCheck(rt, h, o, &stats, &bs, failed) // outage.go
				return
			}
		}
		p := genProgram(rt, o)
		body := func(rt *rapid.T) {
			if o.Fresh != nil {
				o.Fresh()
			}
			rec, err := runProgram(rt.Context(), h, o, p)
			if err != nil {
				rt.Fatalf("generative: %v", err)
			}
			var vs []violation
			for _, v := range rec.check() {
				if why, ok := o.Known[v.property]; ok {
					atomic.AddInt64(&stats.Known, 1)
					rt.Logf("known violation (%s): %s", why, v)
					continue
				}
				vs = append(vs, v)
			}
			atomic.AddInt64(&stats.Programs, 1)
			rec.mu.Lock()
			atomic.AddInt64(&stats.Leases, int64(len(rec.leases)))
			atomic.AddInt64(&stats.Writes, int64(len(rec.writes)))
			atomic.AddInt64(&stats.Faults, int64(len(rec.faults)))
			atomic.AddInt64(&stats.Forced, int64(len(rec.forces)))
			atomic.AddInt64(&stats.Multi, int64(rec.multis))
			rec.mu.Unlock()
			stats.countBatches(rec)
			if len(vs) > 0 {
				msg := make([]string, len(vs))
				for i, v := range vs {
					msg[i] = v.String()
				}
				failed.add(msg)
				rt.Fatalf("invariants violated:\n  %s\nprogram:\n%s\nhistory:\n%s", strings.Join(msg, "\n  "), p, rec.trace())
			}
		}
		if o.SyncTest {
			rapid.SyncTest(rt, body)
		} else {
			body(rt)
		}
	}
	// One rapid.Check is at most -rapid.checks programs; with budget left
	// (an in-process backend runs thousands), run more, each with a
	// fresh seed — unless a seed or fail file was given to replay one.
	replay := flagSet("rapid.seed") || flagSet("rapid.failfile")
	stream := func(i int) func(t *testing.T) {
		return func(t *testing.T) {
			h, o, err := o.forStream(i, h)
			if err != nil {
				t.Fatal(err)
			}
			failed := &failures{first: &first}
			for round := 0; round == 0 || !replay && !first.any() && !spent(o); round++ {
				rapid.Check(t, func(rt *rapid.T) { prop(rt, h, o, failed) })
			}
		}
	}
	if replay || o.Parallel == 1 {
		stream(0)(t)
	} else {
		// Streams of programs side by side: a program against a real
		// server spends most of its time waiting on TTLs, and each
		// stream has its own seeds and keys. Each is a subtest, so a
		// failure names its stream and rapid's replay instructions.
		var wg sync.WaitGroup
		for i := range o.Parallel {
			wg.Go(func() { t.Run(fmt.Sprintf("stream%d", i), stream(i)) })
		}
		wg.Wait()
	}
	t.Logf("generative: %d programs, %d leases (%d multi-key grants), %d fenced writes, %d injected faults, %d forced releases, %d coalesced acquire and %d release batches in %v",
		stats.Programs, stats.Leases, stats.Multi, stats.Writes, stats.Faults, stats.Forced, stats.AcquireBatches, stats.ReleaseBatches, time.Since(begin).Round(time.Millisecond))
	if bs.calls > 0 {
		t.Logf("generative: %v", &bs)
	}
	if stats.Known > 0 {
		t.Logf("generative: %d violations of known-violated properties (Options.Known)", stats.Known)
	}
	if stats.Programs == 0 {
		t.Errorf("generative: no program ran within the budget %v", o.Budget)
	}
	return stats
}

// only, from FENCELOCK_GEN_ONLY, runs programs of one kind alone:
// "election", "rw", "outage" or "lock" (for finding or replaying a
// failure of one kind; CI runs every kind).
var only = os.Getenv("FENCELOCK_GEN_ONLY")

var onlyKinds = map[string]int{"election": 0, "rw": 1, "outage": 2, "lock": 3}

// failures records the violations of a stream's first failing program,
// and passes the first stream's to first (nil in first itself): a
// failure stops the other streams starting programs while rapid shrinks
// the failing one.
type failures struct {
	mu    sync.Mutex
	vs    []string
	first *failures
}

func (f *failures) add(vs []string) {
	f.mu.Lock()
	if f.vs == nil {
		f.vs = vs
	}
	f.mu.Unlock()
	if f.first != nil {
		f.first.add(vs)
	}
}

func (f *failures) any() bool { return len(f.list()) > 0 }

func (f *failures) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.vs
}

type stepKind int

const (
	stepAcquire stepKind = iota
	stepTry
	stepWaitCancelled
	stepDo
	stepDoError
	stepDoPanic
	stepMulti // recipe.AcquireAll (TryAcquireAll with step.late) of step.key and step.also (multi.go)
)

var stepNames = [...]string{"acquire", "try", "wait-cancelled", "do", "do-error", "do-panic", "multi"}

func (k stepKind) String() string { return stepNames[k] }

type staleKind int

const (
	staleNone staleKind = iota
	staleRelease
	staleRenew
)

type step struct {
	kind    stepKind
	key     int
	hold    int // tenths of TTL
	late    bool
	stale   staleKind
	ttl     int   // the lease's TTL (WithTTL) in tenths of the harness's TTL; 0: the Client's
	minHold int   // WithMinHold in tenths of TTL; 0: none
	meta    bool  // WithMetadata and WithLabel, a SetMetadata during the hold, then Inspect
	wait    int   // WithWait in tenths of TTL (waiting kinds); 0: none
	also    []int // stepMulti: the other keys of the set, in the order drawn
}

type endKind int

const (
	endClose endKind = iota
	endCloseEarly
	endCrash
)

type clientProg struct {
	rotate  bool
	faults  faults
	cfg     clientCfg
	permits int // a semaphore program's permits, as this client uses them
	workers [][]step
	end     endKind
	endAt   int // tenths of TTL after the start, for early ends
}

// forceOp is an administrator's operation on a key at a time: a forced
// release (program.forces) or a floor raise (program.raises).
type forceOp struct {
	at  int // tenths of TTL
	key int
}

type program struct {
	keys      int
	permits   int // 0: locks on the keys; n: permits of Semaphore(key, n)
	stallAt   int // tenths of TTL: the store stalls then…
	stallFor  int // …for this long (0: never)
	highFloor bool
	delays    []int // per key: every call's WithLockDelay in tenths of TTL (lock programs); 0: none
	clients   []clientProg
	forces    []forceOp
	raises    []forceOp // RaiseFloor while the program runs (TokenFloorer backends)
}

func (p program) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  keys %d, permits %d, floors near 2^53 %v, stall at %d/10 TTL for %d/10, lock delays %v/10 TTL\n", p.keys, p.permits, p.highFloor, p.stallAt, p.stallFor, p.delays)
	for i, c := range p.clients {
		fmt.Fprintf(&b, "  client %d: rotate %v, %v, permits %d, faults %+v, end %d at %d/10 TTL\n", i, c.rotate, c.cfg, c.permits, c.faults, c.end, c.endAt)
		for j, w := range c.workers {
			fmt.Fprintf(&b, "    worker %d:", j)
			for _, s := range w {
				fmt.Fprintf(&b, " %s(k%d also %v hold %d/10 late %v stale %d ttl %d/10 minhold %d/10 meta %v wait %d/10)", s.kind, s.key, s.also, s.hold, s.late, s.stale, s.ttl, s.minHold, s.meta, s.wait)
			}
			b.WriteByte('\n')
		}
	}
	for _, f := range p.forces {
		fmt.Fprintf(&b, "  force-release k%d at %d/10 TTL\n", f.key, f.at)
	}
	for _, f := range p.raises {
		fmt.Fprintf(&b, "  raise-floor k%d at %d/10 TTL\n", f.key, f.at)
	}
	return b.String()
}

func genProgram(t *rapid.T, o *Options) program {
	// One key two times in three: contention is where interleavings hide.
	keys := 1
	if o.Keys > 1 && rapid.IntRange(0, 2).Draw(t, "moreKeys") == 0 {
		keys = rapid.IntRange(2, o.Keys).Draw(t, "keys")
	}
	p := program{
		keys:      keys,
		highFloor: rapid.IntRange(0, 3).Draw(t, "highFloor") == 0,
	}
	// One program in four takes permits of semaphores; one in eight
	// stalls the store for one to three TTLs, one in three where the
	// backend's test stalls the store itself (Options.Stall: what the
	// driver boundary cannot reach, such as a clock estimate's round
	// trips, is then stalled too).
	if rapid.IntRange(0, 3).Draw(t, "semaphore") == 0 {
		p.permits = rapid.IntRange(1, 2).Draw(t, "permits")
	}
	// A lock program gives each key a lock delay half the time, the same
	// for every call on the key (WithLockDelay asks every client of a key
	// to use one delay). A delay of a TTL or more outlasts the part of a
	// crashed holder's TTL its last renewal left, so a store that ignored
	// it would grant inside the gap LockDelayRespected checks.
	// A lock program of several keys takes them together half the time:
	// half its steps are then multi-key grants (multi.go), and its keys
	// share one lock delay.
	multiProgram := p.permits == 0 && p.keys > 1 && rapid.Bool().Draw(t, "multiProgram")
	if p.permits == 0 {
		for k := range p.keys {
			d := rapid.SampledFrom([]int{0, 0, 10, 15}).Draw(t, "lockDelay")
			if multiProgram && k > 0 {
				d = p.delays[0]
			}
			p.delays = append(p.delays, d)
		}
	}
	stallOdds := 7
	if o.Stall != nil {
		stallOdds = 2
	}
	if !o.NoFaults && rapid.IntRange(0, stallOdds).Draw(t, "stall") == 0 {
		p.stallAt = rapid.IntRange(0, 15).Draw(t, "stallAt")
		p.stallFor = rapid.SampledFrom([]int{10, 20, 30}).Draw(t, "stallFor")
	}
	// One lock program in three is a crowd: each client has four to
	// eight workers, on every key the program may have, so that a
	// client's workers acquire and release side by side and the engine
	// coalesces their calls into batches (the backend's
	// driver.BatchAcquirer and driver.BatchReleaser). A batch forms once
	// more calls than a lane keeps in flight (two) meet: releases of
	// three keys or more.
	crowd := rapid.IntRange(0, 2).Draw(t, "crowd") == 0
	if crowd && p.keys == 1 && o.Keys > 1 && p.permits == 0 {
		p.keys = o.Keys
		for range p.keys - 1 {
			p.delays = append(p.delays, p.delays[0])
		}
	}
	n := rapid.IntRange(2, o.Clients).Draw(t, "clients")
	for range n {
		c := clientProg{
			rotate: rapid.Bool().Draw(t, "rotate"),
			end:    endKind(rapid.IntRange(0, 4).Draw(t, "end") % 3),
			endAt:  rapid.IntRange(0, 30).Draw(t, "endAt"),
			cfg:    drawClientCfg(t, o),
		}
		if c.permits = p.permits; p.permits > 0 && rapid.IntRange(0, 3).Draw(t, "permitsMismatch") == 0 {
			c.permits++ // refused with ErrPermitsMismatch while the others hold
		}
		if c.end == endCrash && rapid.Bool().Draw(t, "crashLate") {
			c.end = endClose // crashes are rarer than clean ends
		}
		if !o.NoFaults {
			c.faults = drawFaults(t, []int{1, 5, 12})
		}
		c.faults.rttHundredths = drawRTT(t, o)
		if !o.NoFaults && o.Pauses {
			c.faults.Pauses = drawPauses(t)
		}
		workers := rapid.IntRange(1, 2).Draw(t, "workers")
		if crowd {
			workers = rapid.IntRange(4, 8).Draw(t, "crowdWorkers")
		}
		for range workers {
			steps := rapid.IntRange(1, 4).Draw(t, "steps")
			var w []step
			for range steps {
				w = append(w, step{
					kind:    stepKind(rapid.IntRange(0, len(stepNames)-1).Draw(t, "kind")),
					key:     rapid.IntRange(0, p.keys-1).Draw(t, "key"),
					hold:    rapid.SampledFrom([]int{0, 1, 5, 15}).Draw(t, "hold"),
					late:    rapid.Bool().Draw(t, "late"),
					stale:   staleKind(rapid.IntRange(0, 2).Draw(t, "stale")),
					ttl:     rapid.SampledFrom([]int{0, 0, 5, 20}).Draw(t, "ttl"),
					minHold: rapid.SampledFrom([]int{0, 0, 0, 3, 12}).Draw(t, "minHold"),
					meta:    rapid.Bool().Draw(t, "meta"),
					wait:    rapid.SampledFrom([]int{0, 0, 2}).Draw(t, "wait"),
				})
				if multiProgram && rapid.Bool().Draw(t, "multi") {
					w[len(w)-1].kind = stepMulti
				}
				if s := &w[len(w)-1]; s.kind == stepMulti && p.keys > 1 {
					s.also = drawAlso(t, p.keys, s.key)
				}
			}
			c.workers = append(c.workers, w)
		}
		p.clients = append(p.clients, c)
	}
	for range rapid.IntRange(0, 2).Draw(t, "forces") {
		p.forces = append(p.forces, forceOp{
			at:  rapid.IntRange(0, 30).Draw(t, "forceAt"),
			key: rapid.IntRange(0, p.keys-1).Draw(t, "forceKey"),
		})
	}
	for range rapid.IntRange(0, 3).Draw(t, "raises") % 3 {
		p.raises = append(p.raises, forceOp{
			at:  rapid.IntRange(0, 30).Draw(t, "raiseAt"),
			key: rapid.IntRange(0, p.keys-1).Draw(t, "raiseKey"),
		})
	}
	return p
}

// runner holds one program's run.
type runner struct {
	h      conformance.Harness
	sems   [][]*recipe.Semaphore // per client and key (semaphore programs)
	faults []bool                // per client: its driver injects faults
	rtts   []time.Duration       // per client: its driver's RTT
	closed []atomic.Bool         // per client: it began to close or crashed
	stall  atomic.Bool           // the store stalled
	rec    *recorder
	fence  fencelock.Fence
	raw    driver.Backend
	keys   []string
	delays []time.Duration // per key: the lock delay of every call on it
	prefix string
	tenth  time.Duration
	start  time.Time

	multiMu sync.Mutex
	waiting map[string]multiCall // multi-key calls in progress, by label (multi.go)
}

// raiseMidway raises key's floor a little above the highest token issued
// so far, as a migration's dual backend does while locks are in use, and
// records the raise for TokenAboveFloor.
func raiseMidway(ctx context.Context, rec *recorder, f driver.TokenFloorer, key string) {
	hw, err := f.HighWater(ctx, key)
	if err != nil {
		rec.note("HighWater(%q): %v", key, err)
		return
	}
	floor := max(hw.Keys[key], hw.Global) + 1000
	before := rec.tick()
	err = f.RaiseFloor(ctx, key, floor)
	after := rec.tick()
	if err != nil {
		rec.note("RaiseFloor(%q, %d): %v", key, floor, err)
		return
	}
	rec.raised(key, floor, before, after)
}

func (r *runner) at(tenths int) time.Duration {
	return time.Duration(tenths)*r.tenth - time.Since(r.start)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func runProgram(ctx context.Context, h conformance.Harness, o *Options, p program) (*recorder, error) {
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	r := &runner{h: h, rec: newRecorder(), prefix: "generative-" + hex.EncodeToString(rnd[:]) + "/", tenth: h.TTL / 10}
	for i := range p.keys {
		r.keys = append(r.keys, fmt.Sprintf("%sk%d", r.prefix, i))
	}
	raw, err := h.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("Harness.Open: %w", err)
	}
	r.raw = raw
	defer raw.Close()
	for _, d := range p.delays {
		r.delays = append(r.delays, time.Duration(d)*r.tenth)
	}
	if slices.ContainsFunc(r.delays, func(d time.Duration) bool { return d > 0 }) && !o.lockDelay.supported(ctx, raw, r.prefix+"lock-delay-probe", h.TTL) {
		r.rec.note("the backend refuses lock delays (ErrUnsupported): none asked")
		r.delays = nil
	}
	if p.highFloor {
		if f, ok := raw.(driver.TokenFloorer); ok {
			for _, k := range r.keys {
				if err := f.RaiseFloor(ctx, k, 1<<53-3); err != nil {
					r.rec.note("RaiseFloor(%q, 2^53-3): %v", k, err)
				}
			}
		}
	}

	type client struct {
		c     *fencelock.Client
		w     *faulty
		inner driver.Backend
		once  sync.Once
	}
	clients := make([]*client, len(p.clients))
	r.sems = make([][]*recipe.Semaphore, len(p.clients))
	r.faults = make([]bool, len(p.clients))
	r.rtts = make([]time.Duration, len(p.clients))
	r.closed = make([]atomic.Bool, len(p.clients))
	for i, cp := range p.clients {
		inner, err := cp.cfg.open(ctx, h, o)
		if err != nil {
			return nil, err
		}
		co := cp.cfg.options(h, cp.rotate, fmt.Sprintf("generative-client-%d", i), r.rec.observer())
		w := newFaulty(inner, cp.faults, r.tenth, co.ReleaseTimeout, r.rec, i)
		co.Clock = w.clock
		c, err := fencelock.New(w.backend(), co)
		if err != nil {
			inner.Close()
			return nil, fmt.Errorf("fencelock.New: %w", err)
		}
		clients[i] = &client{c: c, w: w, inner: inner}
		r.faults[i] = cp.faults.any()
		r.rtts[i] = w.f.RTT
		if cp.permits > 0 {
			for _, k := range r.keys {
				sem, err := recipe.NewSemaphore(c, k, cp.permits)
				if err != nil {
					return nil, fmt.Errorf("Semaphore: %w", err)
				}
				r.sems[i] = append(r.sems[i], sem)
			}
		}
	}
	// A semaphore program's administrator forces and raises its keys'
	// first slots.
	adminKey := func(k int) string {
		if p.permits > 0 {
			_, slots := recipe.Keys(r.keys[k], 1)
			return slots[0]
		}
		return r.keys[k]
	}
	end := func(i int) {
		cl := clients[i]
		cl.once.Do(func() {
			r.closed[i].Store(true)
			if p.clients[i].end == endCrash {
				r.rec.crashing(i)
				r.rec.closing(i, "client %d crashes", i)
				cl.w.die(h.Crash)
			} else {
				r.rec.closing(i, "client %d closes", i)
			}
			_ = cl.c.Close() // a crashed client's releases fail, as they would
		})
	}

	r.start = time.Now()
	var wg sync.WaitGroup
	for i, cp := range p.clients {
		for j, steps := range cp.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k, s := range steps {
					r.step(ctx, i, j, k, clients[i].c, s)
				}
			}()
		}
		if cp.end != endClose {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sleepCtx(ctx, r.at(cp.endAt))
				end(i)
			}()
		}
	}
	if fr, ok := raw.(driver.ForceReleaser); ok {
		for _, f := range p.forces {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sleepCtx(ctx, r.at(f.at))
				beforeAt := time.Now()
				before := r.rec.tick()
				info, err := fr.ForceRelease(ctx, adminKey(f.key))
				after := r.rec.tick()
				if err == nil {
					r.rec.force(adminKey(f.key), before, after, beforeAt, info.Owner, info.Token)
				} else {
					r.rec.note("force-release %q: %v", adminKey(f.key), err)
				}
			}()
		}
	}
	if f, ok := raw.(driver.TokenFloorer); ok {
		for _, op := range p.raises {
			wg.Go(func() {
				sleepCtx(ctx, r.at(op.at))
				raiseMidway(ctx, r.rec, f, adminKey(op.key))
			})
		}
	}
	if p.stallFor > 0 {
		wg.Go(func() {
			sleepCtx(ctx, r.at(p.stallAt))
			d := time.Duration(p.stallFor) * r.tenth
			r.stall.Store(true)
			r.rec.fault(-1, "store", "stall", nil, false)
			r.rec.note("the store stalls for %v", d)
			if o.Stall != nil {
				o.Stall(ctx, d)
				sleepCtx(ctx, d)
				return
			}
			for _, cl := range clients {
				cl.w.setOutage(outagePause, 0)
			}
			sleepCtx(ctx, d)
			for _, cl := range clients {
				cl.w.setOutage(outageNone, 0)
			}
		})
	}
	wg.Wait()
	// NoRecordOutlivesItsLease: every worker is done, so every lease has
	// ended; while the clients still live (and renew whatever else they
	// keep alive), every record must go within TTL plus slack — released,
	// or expired if its release failed or its client crashed — with the
	// longest per-call TTL of the program (slack scaled with it), and no
	// later than the end of a minimum hold plus slack.
	var (
		cfgs []clientCfg
		ttls []int
	)
	for _, cp := range p.clients {
		cfgs = append(cfgs, cp.cfg)
		for _, w := range cp.workers {
			for _, s := range w {
				ttls = append(ttls, s.ttl)
			}
		}
	}
	maxTTL, slack := longestTTL(h, cfgs, ttls)
	bound := func(from time.Time) time.Time {
		d := from.Add(maxTTL + slack)
		if end := r.rec.holdsEnd().Add(h.Slack); end.After(d) {
			d = end
		}
		return d
	}
	if err := r.drain(ctx, bound(time.Now()), "NoRecordOutlivesItsLease", "while the clients lived, after every lease had ended"); err != nil {
		return nil, err
	}
	crashed := false
	for i, cp := range p.clients {
		end(i)
		crashed = crashed || cp.end == endCrash
	}
	for _, cl := range clients {
		cl.w.settle()
	}
	faulted := r.rec.faultedBeyondLate() || r.rec.lateWhileClosing()

	// NothingLeftBehind: at once, or after TTL plus slack when a crash or
	// a fault may have left a record for the store to expire; a record
	// store keeps a record inside its minimum hold until the hold ends.
	// A late request sent before its client began to close (answered
	// within the engine's ReleaseTimeout, which an attempt cut short by
	// its caller waits for) is no excuse; one sent while it closed may
	// outlast Close's budget (see lateWhileClosing).
	deadline := time.Now()
	if crashed || faulted {
		deadline = bound(deadline)
	} else if end := r.rec.holdsEnd().Add(h.Slack); end.After(deadline) {
		deadline = end
	}
	if err := r.drain(ctx, deadline, "NothingLeftBehind", "after every client ended"); err != nil {
		return nil, err
	}
	return r.rec, nil
}

// drain waits until the store holds nothing under the program's prefix,
// until deadline, and records what is left then as a violation of
// property.
func (r *runner) drain(ctx context.Context, deadline time.Time, property, when string) error {
	for {
		infos, err := r.raw.List(ctx, r.prefix)
		if err != nil {
			return fmt.Errorf("List: %w", err)
		}
		if len(infos) == 0 {
			return nil
		}
		if !time.Now().Before(deadline) {
			r.rec.leftBehind(property, when, infos)
			return nil
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

// step runs step k of worker j of client i.
func (r *runner) step(ctx context.Context, i, j, k int, c *fencelock.Client, s step) {
	key := r.keys[s.key]
	var sem *recipe.Semaphore
	if r.sems[i] != nil {
		sem = r.sems[i][s.key]
		if s.kind == stepDo || s.kind == stepDoError || s.kind == stepDoPanic {
			s.kind = stepAcquire // a semaphore has no Do
		}
	}
	if s.kind == stepMulti {
		if keys := r.multiKeys(s); sem == nil && len(keys) > 1 {
			r.multi(ctx, i, j, k, c, s, keys) // multi.go
			return
		}
		s.kind = stepAcquire // one key, or a semaphore's
	}
	hold := time.Duration(s.hold) * r.tenth
	var (
		rec *leaseRec
		l   *fencelock.Lease
		err error
	)
	var (
		opts  []fencelock.AcquireOption
		label string
		meta0 string
	)
	if s.ttl > 0 {
		opts = append(opts, fencelock.WithTTL(time.Duration(s.ttl)*r.tenth))
	}
	if s.minHold > 0 {
		opts = append(opts, fencelock.WithMinHold(time.Duration(s.minHold)*r.tenth))
	}
	// Every call has a label of its own, so that what it left in the
	// store is known by it.
	label = fmt.Sprintf("gen c%d w%d s%d", i, j, k)
	opts = append(opts, fencelock.WithLabel(label))
	if s.meta {
		meta0 = fmt.Sprintf("m%d", r.rec.tick())
		opts = append(opts, fencelock.WithMetadata([]byte(meta0)))
	}
	if s.wait > 0 && s.kind != stepTry {
		opts = append(opts, fencelock.WithWait(time.Duration(s.wait)*r.tenth))
	}
	var delay time.Duration
	if sem == nil && s.key < len(r.delays) {
		if delay = r.delays[s.key]; delay > 0 {
			opts = append(opts, fencelock.WithLockDelay(delay))
		}
	}
	invAt := time.Now()
	inv := r.rec.tick()
	register := func(l *fencelock.Lease, via string) *leaseRec {
		rec := r.rec.lease(i, l, via, inv)
		m := meta0
		if sem != nil && s.meta {
			m = string(l.Metadata()) // the semaphore's header, then ours
		}
		r.rec.options(rec, invAt, l.MinHold(), label, m, inv)
		r.rec.delayed(rec, delay)
		return rec
	}
	switch s.kind {
	case stepTry:
		if sem != nil {
			l, err = sem.TryAcquire(ctx, opts...)
		} else {
			l, err = c.TryAcquire(ctx, key, opts...)
		}
	case stepAcquire, stepWaitCancelled:
		wait := 3 * r.h.TTL
		if s.kind == stepWaitCancelled {
			wait = r.h.TTL / 4
		}
		actx, cancel := context.WithTimeout(ctx, wait)
		if sem != nil {
			l, err = sem.Acquire(actx, opts...)
		} else {
			l, err = c.Acquire(actx, key, opts...)
		}
		cancel()
	default:
		dctx, cancel := context.WithTimeout(ctx, 3*r.h.TTL)
		err = func() (err error) {
			defer func() {
				if v := recover(); v != nil && v != errPanic {
					panic(v)
				}
			}()
			return c.Do(dctx, key, func(fctx context.Context, dl *fencelock.Lease) error {
				l = dl
				rec = register(dl, s.kind.String())
				r.hold(fctx, c, dl, rec, hold, s.meta)
				r.rec.ended(rec, nil)
				switch s.kind {
				case stepDoError:
					return errCallback
				case stepDoPanic:
					panic(errPanic)
				}
				return nil
			}, opts...)
		}()
		doneAt := time.Now()
		cancel()
		if l != nil && !isDone(l) {
			r.rec.violate("DoEndsItsLease", "Do on %q returned (%v) with its lease still held", key, err)
		}
		if rec != nil {
			var lost *fencelock.LostError
			switch {
			case errors.As(err, &lost):
				if l.Err() == nil { // the store said so at release
					r.rec.lostAtRelease(rec, lost)
					r.rec.released(rec, !r.rec.refusedHoldMayLeaveRecord(rec, l))
				}
			case s.kind != stepDoPanic && (err == nil || onlyCallback(err)):
				// Released into its minimum hold, the record stays.
				r.rec.releasedOK(rec, l, doneAt)
				r.rec.released(rec, !r.rec.heldForMinimum(rec, l))
			}
			r.after(ctx, l, rec, s)
		} else if err != nil {
			r.rec.note("client %d worker %d %s %q: %v", i, j, s.kind, key, err)
		}
		return
	}
	r.onlyGrantHeld(ctx, i, s.kind, label, l, err)
	if err != nil {
		r.rec.note("client %d worker %d %s %q: %v", i, j, s.kind, key, err)
		return
	}
	rec = register(l, s.kind.String())
	r.hold(ctx, c, l, rec, hold, s.meta)
	r.rec.ended(rec, nil)
	select {
	case <-l.Done():
		if l.Err() == nil {
			// Released by Close: our Release can only say so.
			r.after(ctx, l, rec, s)
			return
		}
	default:
	}
	rerr := l.Release(ctx)
	if rerr == nil {
		r.rec.releasedOK(rec, l, time.Now())
	}
	if rerr != nil && !errors.Is(rerr, fencelock.ErrNotHeld) {
		rerr = l.Release(ctx) // a retry after an ambiguous failure
	}
	if errors.Is(rerr, fencelock.ErrNotHeld) && l.Err() == nil {
		r.rec.lostAtRelease(rec, rerr)
	}
	// Gone for sure only if the store said so: a lost lease's Release
	// does not ask the store, whose record may outlive the holder's belief;
	// a lease released into its minimum hold leaves its record.
	held := rerr == nil && r.rec.heldForMinimum(rec, l)
	r.rec.released(rec, !held && (rerr == nil || errors.Is(rerr, fencelock.ErrNotHeld) && l.Err() == nil && !r.rec.refusedHoldMayLeaveRecord(rec, l)))
	r.after(ctx, l, rec, s)
}

// onlyGrantHeld checks NothingHeldButTheGrant: once an acquire call of
// client i returned, the store holds nothing with its label but the
// lease it handed out (l, nil if it returned err). A refused TryAcquire,
// a wait that timed out, a semaphore's permit given back (a losing wait,
// a permits mismatch) leave nothing: the minimum hold belongs to a grant
// handed to the caller alone. Checked where nothing else can explain a
// record: the client's driver injects no faults, it has not begun to
// close, and the store has not stalled; and a record whose owner had a
// call fail in the store (the store itself slow or down, which the
// clean-up then met too: recorder.storeFailed) is excused.
func (r *runner) onlyGrantHeld(ctx context.Context, i int, kind stepKind, label string, l *fencelock.Lease, err error) {
	var ls []*fencelock.Lease
	if l != nil {
		ls = append(ls, l)
	}
	r.onlyGrantsHeld(ctx, i, kind, label, ls, err)
}

// onlyGrantsHeld is onlyGrantHeld for a call that hands out the leases ls
// (a multi-key grant's; none if it returned err).
func (r *runner) onlyGrantsHeld(ctx context.Context, i int, kind stepKind, label string, ls []*fencelock.Lease, err error) {
	if r.closed[i].Load() || r.stall.Load() {
		return
	}
	if !r.faults[i] {
		r.grantsHeld(ctx, i, kind, label, ls, err, "")
	}
	// A call that returned no lease may still have a request in flight:
	// an attempt that the engine left in a coalesced batch (its bound
	// ended), whose grant the engine releases when the batch returns.
	// Once it has had time to land and be cleaned up (a few round trips,
	// queued in the client's lanes), nothing may be left either. With
	// fake time (an RTT: SyncTest) alone: the wait delays the worker's
	// next step.
	if wait := 10 * r.rtts[i]; wait > 0 && !r.faults[i] && len(ls) == 0 {
		sleepCtx(ctx, wait)
		if !r.closed[i].Load() && !r.stall.Load() {
			r.grantsHeld(ctx, i, kind, label, ls, err, fmt.Sprintf(" %v later", wait))
		}
	}
}

// grantsHeld is onlyGrantsHeld's look at the store, when after the
// call's return.
func (r *runner) grantsHeld(ctx context.Context, i int, kind stepKind, label string, ls []*fencelock.Lease, err error, when string) {
	infos, lerr := r.raw.List(ctx, r.prefix)
	if lerr != nil || r.closed[i].Load() || r.stall.Load() {
		return
	}
	for _, info := range infos {
		if info.Label() != label || slices.ContainsFunc(ls, func(l *fencelock.Lease) bool { return info.Key == l.Key() && info.Owner == l.Owner() }) {
			continue
		}
		if r.rec.failedInStore(info.Owner) {
			r.rec.note("client %d's %s left %q (owner %s) after the store failed a call for it", i, kind, info.Key, info.Owner)
			continue
		}
		if r.rec.cutShort(info.Owner) {
			continue // a late request that landed after every sender gave up: its TTL ends it
		}
		outcome := "returned " + strconvQuote(err)
		if len(ls) == 1 {
			outcome = fmt.Sprintf("returned a lease of %q", ls[0].Key())
		} else if len(ls) > 1 {
			keys := make([]string, len(ls))
			for n, l := range ls {
				keys[n] = l.Key()
			}
			outcome = fmt.Sprintf("returned leases of %q", keys)
		}
		r.rec.violate("NothingHeldButTheGrant", "client %d's %s (label %q) %s, yet%s the store holds %q for it (owner %s, token %d)", i, kind, label, outcome, when, info.Key, info.Owner, info.Token)
	}
}

func strconvQuote(err error) string {
	if err == nil {
		return "nil"
	}
	return fmt.Sprintf("%q", err.Error())
}

// onlyCallback reports whether err is the callback's own error and
// nothing else (Do joins a failed release to it).
func onlyCallback(err error) bool {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return err == errCallback
	}
	for _, e := range j.Unwrap() {
		if e != nil && e != errCallback {
			return false
		}
	}
	return true
}

var (
	errCallback = errors.New("generative: callback failed")
	errPanic    = errors.New("generative: callback panicked")
)

// hold writes to the fenced resource, replaces the lease's metadata and
// looks it up (with meta), holds the lease for d (or until it ends, or
// until its Remaining() is 0), and writes again.
func (r *runner) hold(ctx context.Context, c *fencelock.Client, l *fencelock.Lease, rec *leaseRec, d time.Duration, meta bool) {
	r.writeWith(l, rec, false)
	if meta && !isDone(l) {
		v := fmt.Sprintf("m%d", r.rec.tick())
		mctx, cancel := context.WithTimeout(ctx, r.h.TTL)
		inv := r.rec.tick()
		err := l.SetMetadata(mctx, []byte(v))
		r.rec.setMeta(rec, v, inv, err)
		cancel()
		look := r.rec.tick()
		if info, err := c.Inspect(ctx, l.Key()); err == nil {
			r.rec.inspected(rec, look, info)
		}
	}
	if d > 0 {
		r.holdFor(ctx, l, rec, d) // validity.go
	}
	r.writeWith(l, rec, isDone(l))
}

func isDone(l *fencelock.Lease) bool {
	select {
	case <-l.Done():
		return true
	default:
		return false
	}
}

// writeWith writes to the fenced resource with l's token, after a look
// at l's Remaining() (ValidityNeverComesBack), as a holder does before it
// writes.
func (r *runner) writeWith(l *fencelock.Lease, rec *leaseRec, late bool) {
	r.look(l, rec)
	tok := l.Token()
	_ = r.rec.write(rec, tok, late, func() error { return r.fence.Check(l.Key(), tok, l.Owner()) })
}

// after plays a paused holder after its lease ended: a late write with its
// old token, and a stale Release or Renew straight to the store.
func (r *runner) after(ctx context.Context, l *fencelock.Lease, rec *leaseRec, s step) {
	if s.late {
		sleepCtx(ctx, r.tenth)
		r.writeWith(l, rec, true)
	}
	if s.stale == staleNone {
		return
	}
	if r.rec.inHold(rec) {
		// Its record stays for the minimum hold, with this very grant:
		// a stale call is the holder's own, and would be accepted.
		return
	}
	g := driver.Grant{Key: l.Key(), Owner: l.Owner(), Token: l.Token()}
	var err error
	if s.stale == staleRelease {
		err = r.raw.Release(ctx, g)
	} else {
		_, err = r.raw.Renew(ctx, g, driver.RenewRequest{TTL: r.h.TTL})
	}
	r.rec.stale(rec, s.stale, err)
}
