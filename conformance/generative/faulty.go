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
	// Seed seeds the client's fault draws.
	Seed uint64

	maxDelayTenths int // MaxDelay in tenths of the TTL, as generated
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

func (f faults) any() bool { return f.Delay+f.Lose+f.Fail+f.Late > 0 }

// newFaulty wraps inner for client i of a program with faults f: delays
// drawn in tenths of the TTL (tenth), late requests bounded by half the
// engine's releaseTimeout.
func newFaulty(inner driver.Backend, f faults, tenth, releaseTimeout time.Duration, rec *recorder, i int) *faulty {
	f.MaxDelay = time.Duration(f.maxDelayTenths) * tenth
	f.LateMax = min(f.MaxDelay, releaseTimeout/2)
	w := &faulty{b: inner, f: f, rec: rec, client: i, rnd: rand.New(rand.NewPCG(f.Seed, uint64(i)))}
	w.lateDone = sync.NewCond(&w.lateMu)
	w.fake = fakebackend.New(inner, shown(inner))
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

	mu  sync.Mutex
	rnd *rand.Rand

	// late counts the late requests whose caller gave up, until applied.
	// Not a WaitGroup: die waits for them while the engine's calls go on,
	// and one may start (0 → 1) during that wait.
	lateMu   sync.Mutex
	late     int
	lateDone *sync.Cond // broadcast when late drops to 0

	// out is the store's outage as this client sees it (outage.go): none,
	// stalled, refusing, or gone. Set by setOutage, read by every call.
	outMu    sync.Mutex
	out      outageKind
	healed   chan struct{} // closed when a stall ends
	capped   <-chan struct{}
	capTimer *time.Timer
}

func (w *faulty) draw(op string) (fate, time.Duration) {
	if !w.f.any() {
		return pass, 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.rnd.IntN(1000)
	switch {
	case n < w.f.Fail:
		return failBefore, 0
	case n < w.f.Fail+w.f.Lose:
		return loseReply, 0
	case n < w.f.Fail+w.f.Lose+w.f.Delay:
		return delayReply, time.Duration(w.rnd.Int64N(int64(w.f.MaxDelay) + 1))
	case n < w.f.Fail+w.f.Lose+w.f.Delay+w.f.Late:
		return lateRequest, time.Duration(w.rnd.Int64N(int64(w.f.LateMax) + 1))
	}
	return pass, 0
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
	if healed, err := w.outage(ctx); err != nil {
		if healed != nil && name != "acquire-wait" {
			// A store that paused and answers again applies what
			// reached it: the request runs once the pause ends. (A
			// wait in the queue has no late form, as above.)
			w.rec.fault(w.client, name, "late-cut", owners, rotate)
			w.lateBegins()
			go func() {
				defer w.lateEnds()
				<-healed
				_, _ = op(context.WithoutCancel(ctx))
			}()
		}
		return zero, err
	}
	fate, d := w.draw(name)
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
	v, err := op(ctx)
	if err != nil && ctx.Err() == nil && !answered(err) {
		w.rec.storeFailed(owners)
	}
	switch fate {
	case loseReply:
		w.rec.fault(w.client, name, "lose", owners, rotate)
		return zero, errInjected
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
// four the engine uses, exactly as inner has them (so the engine takes
// the same paths as without the wrapper), and a description.
func shown(inner driver.Backend) fakebackend.Caps {
	caps := fakebackend.CapsOf(inner) & (fakebackend.Waiter | fakebackend.BatchRenewer | fakebackend.LossNotifier)
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
		return call(w, ctx, "acquire", false, []string{req.Owner}, func(ctx context.Context) (driver.Grant, error) {
			w.rec.attempt(req.Owner)
			g, err := next(ctx, req)
			if debug {
				w.rec.note("acquire %s -> %v %v", req.Owner, g, err)
			}
			return g, err
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
		_, err := call(w, ctx, "release", false, []string{g.Owner}, func(ctx context.Context) (struct{}, error) {
			err := next(ctx, g)
			if debug {
				w.rec.note("release %v -> %v", g, err)
			}
			return struct{}{}, err
		})
		return err
	})
	reach := func(ctx context.Context) error {
		if w.dead.Load() {
			return errCrashed
		}
		_, err := w.outage(ctx)
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
