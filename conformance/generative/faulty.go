package generative

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"pgregory.net/rapid"
)

// Faults is what the wrapping driver does to one client's calls. Each call
// draws its fate independently: its reply is delayed, lost after the call
// took effect (an ambiguous operation), the call fails before it reaches
// the store (a transient error), or the request itself is late: it
// reaches the store after a delay, and if its caller gives up first, the
// store still applies it when it arrives (as servers do with a request
// their client stopped waiting for).
type faults struct {
	// Per mille of calls for each fault.
	Delay, Lose, Fail, Late int
	// MaxDelay bounds a delayed reply.
	MaxDelay time.Duration
	// LateMax bounds a late request's delay: below the engine's
	// ReleaseTimeout, for which an attempt in flight is answered after its
	// caller's context ends, so that a late request leaves nothing the
	// engine does not see.
	LateMax time.Duration
	// RTT is the time every request of the client spends on its way to
	// the store, as on a network (not a fault: nothing is lost, and a
	// request whose caller gives up on the way never arrives). It keeps
	// requests in flight in a testing/synctest bubble, where the memory
	// backend answers at once, so that the engine coalesces the calls
	// of a client's workers into batches as it does on a real store.
	RTT time.Duration
	// Seed seeds the client's fault draws.
	Seed uint64
	// Pauses are the calls whose reply finds the client's process
	// paused (see jumpClock).
	Pauses []pause

	maxDelayTenths int // MaxDelay in tenths of the TTL, as generated
	rttHundredths  int // RTT in hundredths of the TTL, as generated
}

// pause is a client's process pausing while the answer to its Call-th
// renewal (counted from 1, a batch as one, in the order the driver sees
// them) is on its way: its clock jumps forward by Jump hundredths of the
// TTL, its timers run late, and the answer reaches the engine Hold
// hundredths of the TTL later (as a delayed reply), in whatever order
// the resumed process gets to it: the holder may look at its lease
// first, the lease's timer may run first. A renewal is where the engine
// measures the clock against a validity it already handed to a holder;
// the scheduler sends renewals at instants the fake clock of a
// testing/synctest bubble fixes, so a program replays its pauses.
type pause struct {
	Call, Jump, Hold int
}

// drawFaults draws one client's faults: none, light, heavy, or late
// requests alone (which excuse no record left behind: the engine waits
// for an attempt's answer), with reply delays of up to one of maxDelays
// tenths of the TTL.
func drawFaults(t *rapid.T, maxDelays []int) faults {
	var f faults
	switch rapid.IntRange(0, 3).Draw(t, "faultLevel") {
	case 1:
		f = faults{Delay: 100, Lose: 30, Fail: 30, Late: 50}
	case 2:
		f = faults{Delay: 300, Lose: 100, Fail: 100, Late: 100}
	case 3:
		f = faults{Late: 200}
	}
	f.maxDelayTenths = rapid.SampledFrom(maxDelays).Draw(t, "maxDelay")
	f.Seed = rapid.Uint64().Draw(t, "faultSeed")
	return f
}

// drawPauses draws a client's pauses (faults.Pauses): none three times
// in four, else one to three, at its 1st to 8th renewal, by up to two TTLs
// (more than a lease's remaining validity, or less than a renewal's),
// the reply held for up to half a TTL.
func drawPauses(t *rapid.T) []pause {
	if rapid.IntRange(0, 3).Draw(t, "pauses") != 0 {
		return nil
	}
	ps := make([]pause, rapid.IntRange(1, 3).Draw(t, "pauseCount"))
	for i := range ps {
		ps[i] = pause{
			Call: rapid.IntRange(1, 8).Draw(t, "pauseCall"),
			Jump: rapid.IntRange(0, 200).Draw(t, "pauseJump"),
			Hold: rapid.SampledFrom([]int{0, 2, 5, 10, 30, 50}).Draw(t, "pauseHold"),
		}
	}
	return ps
}

// drawRTT draws a client's RTT, in hundredths of the TTL: none, or with
// SyncTest (where the memory backend answers at once and time is fake)
// one or three hundredths three times in four.
func drawRTT(t *rapid.T, o *Options) int {
	if !o.SyncTest {
		return 0
	}
	return rapid.SampledFrom([]int{0, 1, 1, 3}).Draw(t, "rtt")
}

func (f faults) any() bool { return f.Delay+f.Lose+f.Fail+f.Late > 0 || len(f.Pauses) > 0 }

// newFaulty wraps inner for client i of a program with faults f: delays
// drawn in tenths of the TTL (tenth), late requests bounded by half the
// engine's releaseTimeout.
func newFaulty(inner driver.Backend, f faults, tenth, releaseTimeout time.Duration, rec *recorder, i int) *faulty {
	f.MaxDelay = time.Duration(f.maxDelayTenths) * tenth
	// Below half the engine's ReleaseTimeout (see LateMax), and below the
	// shortest request bound a step can have: a request is bounded by its
	// call's TTL, and the shortest per-call TTL drawn is five tenths. A
	// late request that outlived its bound would land after the engine's
	// one look for it, a record nobody could know of but the store.
	f.LateMax = min(f.MaxDelay, releaseTimeout/2, 4*tenth)
	if _, ok := inner.(driver.BatchAcquirer); ok {
		// Its purpose: see faults.RTT.
		f.RTT = time.Duration(f.rttHundredths) * tenth / 10
	}
	w := &faulty{b: inner, f: f, rec: rec, client: i, rnd: rand.New(rand.NewPCG(f.Seed, uint64(i))), clock: &jumpClock{}, hundredth: tenth / 10}
	w.lateDone = sync.NewCond(&w.lateMu)
	w.fake = fakebackend.New(inner, shown(inner))
	if caps := fakebackend.CapsOf(inner); caps&fakebackend.BatchAcquirer != 0 {
		w.acqLane = &laneWatch{slow: tenth}
	}
	if caps := fakebackend.CapsOf(inner); caps&fakebackend.BatchReleaser != 0 {
		w.relLane = &laneWatch{slow: tenth}
	}
	w.install()
	return w
}

// errInjected is the transient error the wrapping driver injects.
var errInjected = errors.New("generative: injected fault")

// errCrashed is what a crashed client's calls fail with: its process is
// gone, so nothing it sends reaches the store.
var errCrashed = errors.New("generative: client crashed")

type fate int

const (
	pass fate = iota
	delayReply
	loseReply
	failBefore
	lateRequest
	pausedReply // the clock jumps, then the reply is delayed (faults.Pauses)
)

// faulty injects faults into one client's calls, as hooks of a
// fakebackend.Fake over the backend (which shows exactly the optional
// capabilities the engine uses that the backend has; see shown). The
// fates, late requests, crashes and outages are the generative mode's.
type faulty struct {
	b      driver.Backend
	fake   *fakebackend.Fake
	f      faults
	rec    *recorder
	client int
	dead   atomic.Bool
	// clock is the client's Options.Clock: it jumps with faults.Pauses.
	clock     *jumpClock
	hundredth time.Duration // of the TTL: the unit of a pause

	mu       sync.Mutex
	rnd      *rand.Rand
	renewals int // renewals sent, counted for faults.Pauses

	// late counts the late requests whose caller gave up, until applied.
	// Not a WaitGroup: die waits for them while the engine's calls go on,
	// and one may start (0 → 1) during that wait.
	lateMu   sync.Mutex
	late     int
	lateDone *sync.Cond // broadcast when late drops to 0

	// lanes watch the client's acquire and release requests as the
	// engine's coalescing lanes send them (see queuedBehind); nil where
	// the backend cannot batch that kind of request.
	acqLane, relLane *laneWatch

	// out is the store's outage as this client sees it (outage.go): none,
	// stalled, refusing, or gone. Set by setOutage, read by every call.
	outMu    sync.Mutex
	out      outageKind
	healed   chan struct{} // closed when a stall ends
	capped   <-chan struct{}
	capTimer *time.Timer
	// pauseTail is the turn of the last request that reached the store
	// during a pause (see pauseTurn).
	pauseTail chan struct{}
}

// draw draws the fate of a call, and how long it delays the call; for a
// pausedReply (a renewal that faults.Pauses names), jump is how far the
// client's clock jumps.
func (w *faulty) draw(op string) (f fate, d, jump time.Duration) {
	if !w.f.any() {
		return pass, 0, 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.rnd.IntN(1000)
	if op == "renew" || op == "renew-batch" {
		w.renewals++
	}
	for _, p := range w.f.Pauses {
		if (op == "renew" || op == "renew-batch") && p.Call == w.renewals {
			return pausedReply, time.Duration(p.Hold) * w.hundredth, time.Duration(p.Jump) * w.hundredth
		}
	}
	switch {
	case n < w.f.Fail:
		return failBefore, 0, 0
	case n < w.f.Fail+w.f.Lose:
		return loseReply, 0, 0
	case n < w.f.Fail+w.f.Lose+w.f.Delay:
		return delayReply, time.Duration(w.rnd.Int64N(int64(w.f.MaxDelay) + 1)), 0
	case n < w.f.Fail+w.f.Lose+w.f.Delay+w.f.Late:
		return lateRequest, time.Duration(w.rnd.Int64N(int64(w.f.LateMax) + 1)), 0
	}
	return pass, 0, 0
}

// laneWatch follows one of the engine's coalescing lanes of a client
// (coalesce.go) from the driver's side. The engine sends at most one
// request of a lane at a time, and the calls that queued while it was in
// flight as soon as it returns: a request held up (a delayed reply, a
// late request, a pause) holds up every call queued behind it, though
// no fault touched their own requests. A release held up that way may
// reach the store after its record expired, and the lease is told "not
// held" with nobody else the cause — as for a release of its own that
// was late. The watch records such requests as faults of kind "queued"
// (treated as "late"): a request that arrives at once (within
// queueGap) after a held-up request of its lane returned, or after
// another such queued request returned.
type laneWatch struct {
	slow time.Duration // a request in the driver this long holds up its lane

	mu     sync.Mutex
	heldAt time.Time // when the last held-up request of the lane returned
}

// queueGap is how soon after a request of a lane returns the engine's
// next request of that lane reaches the driver, if it was queued: at the
// same instant in a testing/synctest bubble, within the scheduler's
// delay on a real store.
const queueGap = 50 * time.Millisecond

// onLane runs a request of lane l (nil: none) for owners, recording it
// as queued (kind "queued" of op name) if it may have waited behind a
// held-up request of the lane.
func onLane[T any](w *faulty, l *laneWatch, name string, owners []string, req func() (T, error)) (T, error) {
	if l == nil {
		return req()
	}
	start := time.Now()
	l.mu.Lock()
	queued := !l.heldAt.IsZero() && start.Sub(l.heldAt) <= queueGap
	l.mu.Unlock()
	if queued {
		w.rec.fault(w.client, name, "queued", owners, false)
	}
	v, err := req()
	if end := time.Now(); queued || end.Sub(start) >= l.slow {
		l.mu.Lock()
		if end.After(l.heldAt) {
			l.heldAt = end
		}
		l.mu.Unlock()
	}
	return v, err
}

// drawMembers draws the fates of the n members of a batch that the
// batch's own fate let through: one member may fail before it reaches
// the store (nothing stored for it), or lose its reply (stored, its
// answer ambiguous), while the others are answered.
func (w *faulty) drawMembers(n int) []fate {
	fates := make([]fate, n)
	if !w.f.any() {
		return fates
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range fates {
		switch m := w.rnd.IntN(1000); {
		case m < w.f.Fail:
			fates[i] = failBefore
		case m < w.f.Fail+w.f.Lose:
			fates[i] = loseReply
		}
	}
	return fates
}

// settle waits until every late request whose caller gave up has been
// applied.
func (w *faulty) settle() {
	w.lateMu.Lock()
	for w.late > 0 {
		w.lateDone.Wait()
	}
	w.lateMu.Unlock()
}

// lateBegins and lateEnds count a late request running in the background.
func (w *faulty) lateBegins() {
	w.lateMu.Lock()
	w.late++
	w.lateMu.Unlock()
}

func (w *faulty) lateEnds() {
	w.lateMu.Lock()
	if w.late--; w.late == 0 {
		w.lateDone.Broadcast()
	}
	w.lateMu.Unlock()
}

// call runs op under the fate drawn for it. owners names the leases the
// call concerns (for the history); rotate marks a rotating renewal. A
// late request whose caller gave up runs op on in the background, with
// a context of its own, and its result is dropped.
func call[T any](w *faulty, ctx context.Context, name string, rotate bool, owners []string, op func(context.Context) (T, error)) (T, error) {
	var zero T
	if w.dead.Load() {
		return zero, errCrashed
	}
	healed, turn, err := w.outage(ctx)
	if err != nil {
		if healed != nil && name != "acquire-wait" {
			// A store that paused and answers again applies what
			// reached it, in its turn: the request runs once the
			// pause ends and the requests before it were applied. (A
			// wait in the queue has no late form, as above.)
			w.rec.fault(w.client, name, "late-cut", owners, rotate)
			w.lateBegins()
			go func() {
				defer w.lateEnds()
				defer turn.done()
				<-healed
				_ = turn.wait(context.Background())
				_, _ = op(context.WithoutCancel(ctx))
			}()
		} else {
			turn.done()
		}
		return zero, err
	}
	// The request was applied (op returned) or never reached the store:
	// the next one in the paused store's queue goes.
	defer turn.done()
	if name == "acquire-wait" {
		// It waits in the store's queue for as long as it waits: its
		// turn is over once it was sent.
		turn.done()
	}
	fate, d, jump := w.draw(name)
	if fate == lateRequest && name == "acquire-wait" {
		// A wait in the queue has no late form: applied after its
		// caller gave up, it would wait with nobody to end it.
		fate = pass
	}
	switch fate {
	case failBefore:
		w.rec.fault(w.client, name, "fail", owners, false)
		return zero, errInjected
	case lateRequest:
		if d > 0 {
			w.rec.fault(w.client, name, "late", owners, rotate)
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				// The request is on its way; its caller gave up.
				w.rec.fault(w.client, name, "late-cut", owners, rotate)
				w.lateBegins()
				go func() {
					defer w.lateEnds()
					<-t.C
					_, _ = op(context.WithoutCancel(ctx))
				}()
				return zero, ctx.Err()
			}
		}
	}
	if w.f.RTT > 0 {
		t := time.NewTimer(w.f.RTT)
		select {
		case <-t.C:
		case <-ctx.Done():
			// Its caller gave up before it arrived: nothing applied.
			t.Stop()
			return zero, ctx.Err()
		}
	}
	v, err := op(ctx)
	turn.done()
	if err != nil && ctx.Err() == nil && !answered(err) {
		w.rec.storeFailed(owners)
	}
	switch fate {
	case loseReply:
		w.rec.fault(w.client, name, "lose", owners, rotate)
		return zero, errInjected
	case pausedReply:
		// The process paused while the reply was on its way: its clock
		// jumped, and the reply waits (as delayReply) for the resumed
		// process to get to it, which may be after the holder has looked
		// at its lease, or after its timers ran.
		w.rec.jumped(w.client, name, owners, rotate, jump)
		w.clock.jump(jump)
		fallthrough
	case delayReply:
		if d > 0 {
			w.rec.fault(w.client, name, "delay", owners, rotate)
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				// The call took effect; its caller gave up waiting.
				w.rec.fault(w.client, name, "delay-cut", owners, rotate)
				return zero, ctx.Err()
			}
		}
	}
	if w.dead.Load() {
		return zero, errCrashed
	}
	return v, err
}

// answered reports whether err is an answer from the store that says
// what the call did (nothing): a refusal, a bad request, an unsupported
// one, or a closed client.
func answered(err error) bool {
	for _, e := range []error{driver.ErrNotAcquired, driver.ErrNotHeld, driver.ErrInvalidKey, driver.ErrInvalidOption, driver.ErrUnsupported, driver.ErrClosed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// debug, from FENCELOCK_GEN_DEBUG, adds every engine event and every
// acquire, renewal and release the store answered to a failing program's history.
var debug = os.Getenv("FENCELOCK_GEN_DEBUG") != ""

// shown is what the wrapper shows the engine of inner's capabilities: the
// six the engine uses, exactly as inner has them (so the engine takes
// the same paths as without the wrapper), and a description.
func shown(inner driver.Backend) fakebackend.Caps {
	caps := fakebackend.CapsOf(inner) & (fakebackend.Waiter | fakebackend.BatchRenewer | fakebackend.LossNotifier | fakebackend.BatchAcquirer | fakebackend.BatchReleaser)
	if _, ok := driver.Watches(inner); ok {
		caps |= fakebackend.Watcher
	}
	return caps | fakebackend.Describer
}

// install puts the client's faults on its fake backend: every request
// that changes the store runs under call's fate; reads and watches fail
// only while the client is dead or the store out; Close waits for the
// late requests still on their way.
func (w *faulty) install() {
	f := w.fake
	f.OnAcquire(func(ctx context.Context, req driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
		return onLane(w, w.acqLane, "acquire", []string{req.Owner}, func() (driver.Grant, error) {
			return call(w, ctx, "acquire", false, []string{req.Owner}, func(ctx context.Context) (driver.Grant, error) {
				w.rec.attempt(req.Owner)
				g, err := next(ctx, req)
				if debug {
					w.rec.note("acquire %s -> %v %v", req.Owner, g, err)
				}
				return g, err
			})
		})
	})
	// The store's own wait (the engine sees a Waiter only if the store is
	// one), not the fake's emulation on its Acquire.
	f.OnAcquireWait(func(ctx context.Context, req driver.AcquireRequest, _ fakebackend.AcquireFunc) (driver.Grant, error) {
		return call(w, ctx, "acquire-wait", false, []string{req.Owner}, func(ctx context.Context) (driver.Grant, error) {
			w.rec.attempt(req.Owner)
			return w.b.(driver.Waiter).AcquireWait(ctx, req)
		})
	})
	f.OnRenew(func(ctx context.Context, g driver.Grant, req driver.RenewRequest, next fakebackend.RenewFunc) (driver.Grant, error) {
		// A metadata update may issue a new token as a rotation does
		// (etcd and ZooKeeper re-put the record, whose version is the
		// token): a fault that hides its outcome is treated like one
		// hiding a rotation's.
		return call(w, ctx, "renew", req.Rotate || req.SetMetadata, []string{g.Owner}, func(ctx context.Context) (driver.Grant, error) {
			ng, err := next(ctx, g, req)
			if debug {
				w.rec.note("renew rotate %v %v -> %v %v", req.Rotate, g, ng, err)
			}
			if err == nil && ng.Token != g.Token {
				w.rec.rotated(g.Owner, ng.Token)
			}
			return ng, err
		})
	})
	f.OnRenewBatch(func(ctx context.Context, grants []driver.Grant, req driver.RenewRequest, next fakebackend.RenewBatchFunc) ([]driver.RenewResult, error) {
		owners := make([]string, len(grants))
		for i, g := range grants {
			owners[i] = g.Owner
		}
		return call(w, ctx, "renew-batch", req.Rotate, owners, func(ctx context.Context) ([]driver.RenewResult, error) {
			res, err := next(ctx, grants, req)
			for i, r := range res {
				if r.Err == nil && i < len(grants) && r.Grant.Token != grants[i].Token {
					w.rec.rotated(grants[i].Owner, r.Grant.Token)
				}
			}
			if debug {
				w.rec.note("renew-batch rotate %v grants %v -> %v %v", req.Rotate, grants, res, err)
			}
			return res, err
		})
	})
	f.OnRelease(func(ctx context.Context, g driver.Grant, next fakebackend.ReleaseFunc) error {
		_, err := onLane(w, w.relLane, "release", []string{g.Owner}, func() (struct{}, error) {
			return call(w, ctx, "release", false, []string{g.Owner}, func(ctx context.Context) (struct{}, error) {
				err := next(ctx, g)
				if debug {
					w.rec.note("release %v -> %v", g, err)
				}
				return struct{}{}, err
			})
		})
		return err
	})
	f.OnAcquireBatch(func(ctx context.Context, reqs []driver.AcquireRequest, next fakebackend.AcquireBatchFunc) ([]driver.AcquireResult, error) {
		owners := make([]string, len(reqs))
		for i, r := range reqs {
			owners[i] = r.Owner
		}
		w.rec.batch("acquire", w.client, owners)
		return onLane(w, w.acqLane, "acquire", owners, func() ([]driver.AcquireResult, error) {
			return w.acquireBatch(ctx, reqs, owners, next)
		})
	})
	f.OnReleaseBatch(func(ctx context.Context, grants []driver.Grant, next fakebackend.ReleaseBatchFunc) ([]error, error) {
		owners := make([]string, len(grants))
		for i, g := range grants {
			owners[i] = g.Owner
		}
		w.rec.batch("release", w.client, owners)
		return onLane(w, w.relLane, "release", owners, func() ([]error, error) {
			return w.releaseBatch(ctx, grants, owners, next)
		})
	})
	reach := func(ctx context.Context) error {
		if w.dead.Load() {
			return errCrashed
		}
		_, turn, err := w.outage(ctx)
		turn.done() // a read changes nothing: it holds up no later request
		return err
	}
	f.Set(fakebackend.Inspect, reach)
	f.Set(fakebackend.List, reach)
	f.Set(fakebackend.Watch, reach)
	// A server applies what its connection delivered: close once every
	// late request in flight has reached the store.
	f.OnClose(func(next func() error) error {
		w.settle()
		return next()
	})
}

// acquireBatch sends a batch of acquire attempts under the batch's fate
// (call), each member under a fate of its own (drawMembers).
func (w *faulty) acquireBatch(ctx context.Context, reqs []driver.AcquireRequest, owners []string, next fakebackend.AcquireBatchFunc) ([]driver.AcquireResult, error) {
	return call(w, ctx, "acquire", false, owners, func(ctx context.Context) ([]driver.AcquireResult, error) {
		fates := w.drawMembers(len(reqs))
		var sent []driver.AcquireRequest
		for i, r := range reqs {
			if fates[i] == failBefore {
				w.rec.fault(w.client, "acquire", "fail", []string{r.Owner}, false)
				continue
			}
			w.rec.attempt(r.Owner)
			sent = append(sent, r)
		}
		var res []driver.AcquireResult
		if len(sent) > 0 {
			var err error
			if res, err = next(ctx, sent); err != nil || len(res) != len(sent) {
				// A failed batch, or one whose answer has the wrong
				// length: the engine's to see as it is.
				return res, err
			}
		}
		out := make([]driver.AcquireResult, len(reqs))
		for i, r := range reqs {
			if fates[i] == failBefore {
				out[i].Err = errInjected
				continue
			}
			out[i], res = res[0], res[1:]
			if out[i].Err != nil && ctx.Err() == nil && !answered(out[i].Err) {
				w.rec.storeFailed([]string{r.Owner})
			}
			if fates[i] == loseReply {
				// Its reply is lost; the others' arrive.
				w.rec.fault(w.client, "acquire", "lose", []string{r.Owner}, false)
				out[i] = driver.AcquireResult{Err: errInjected}
			}
		}
		if debug {
			w.rec.note("acquire-batch %v -> %v", reqs, out)
		}
		return out, nil
	})
}

// releaseBatch sends a batch of releases as acquireBatch sends attempts.
func (w *faulty) releaseBatch(ctx context.Context, grants []driver.Grant, owners []string, next fakebackend.ReleaseBatchFunc) ([]error, error) {
	return call(w, ctx, "release", false, owners, func(ctx context.Context) ([]error, error) {
		fates := w.drawMembers(len(grants))
		var sent []driver.Grant
		for i, g := range grants {
			if fates[i] == failBefore {
				w.rec.fault(w.client, "release", "fail", []string{g.Owner}, false)
				continue
			}
			sent = append(sent, g)
		}
		var res []error
		if len(sent) > 0 {
			var err error
			if res, err = next(ctx, sent); err != nil || len(res) != len(sent) {
				return res, err
			}
		}
		out := make([]error, len(grants))
		for i, g := range grants {
			if fates[i] == failBefore {
				out[i] = errInjected
				continue
			}
			out[i], res = res[0], res[1:]
			if out[i] != nil && ctx.Err() == nil && !answered(out[i]) {
				w.rec.storeFailed([]string{g.Owner})
			}
			if fates[i] == loseReply {
				w.rec.fault(w.client, "release", "lose", []string{g.Owner}, false)
				out[i] = errInjected
			}
		}
		if debug {
			w.rec.note("release-batch %v -> %v", grants, out)
		}
		return out, nil
	})
}

// backend returns the wrapper as the engine's backend.
func (w *faulty) backend() driver.Backend { return w.fake.Backend() }

// crash makes the client behave like a dead process: its calls fail
// before reaching the store.
func (w *faulty) crash() { w.dead.Store(true) }

// die is a crash of the whole process: its calls fail from now on, the
// requests already on their way (late requests whose callers gave up)
// still land, and then hard (the Harness.Crash hook, if any) stops the
// backend itself, as the store sees a dead process: its connection gone,
// nothing more kept alive. Without the wait, a hook that cuts the
// connection would drop those requests, and no program would ever see
// a late request land after its client died.
func (w *faulty) die(hard func(driver.Backend)) {
	w.crash()
	w.settle()
	if hard != nil {
		hard(w.b)
	}
}

// releaseTimeout is the engine's Options.ReleaseTimeout in every program
// of a harness whose TTL is ttl.
func releaseTimeout(ttl time.Duration) time.Duration { return max(ttl, 2*time.Second) }
