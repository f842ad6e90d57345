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
)

// Faults is what the wrapping driver does to one client's calls. Each call
// draws its fate independently: its reply is delayed, lost after the call
// took effect (an ambiguous operation), or the call fails before it reaches
// the store (a transient error).
type faults struct {
	// Per mille of calls for each fault.
	Delay, Lose, Fail int
	// MaxDelay bounds a delayed reply.
	MaxDelay time.Duration
	// Seed seeds the client's fault draws.
	Seed uint64

	maxDelayTenths int // MaxDelay in tenths of the TTL, as generated
}

func (f faults) any() bool { return f.Delay+f.Lose+f.Fail > 0 }

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
)

// faulty wraps a backend and injects faults into one client's calls. It
// exposes exactly the optional capabilities of the backend it wraps (see
// wrap), so the engine takes the same paths as without it.
type faulty struct {
	b      driver.Backend
	f      faults
	rec    *recorder
	client int
	dead   atomic.Bool

	mu  sync.Mutex
	rnd *rand.Rand
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
	}
	return pass, 0
}

// call runs op under the fate drawn for it. owners names the leases the
// call concerns (for the history); rotate marks a rotating renewal.
func (w *faulty) call(ctx context.Context, name string, rotate bool, owners []string, op func() error) error {
	if w.dead.Load() {
		return errCrashed
	}
	fate, d := w.draw(name)
	if fate == failBefore {
		w.rec.fault(w.client, name, "fail", owners, false)
		return errInjected
	}
	err := op()
	switch fate {
	case loseReply:
		w.rec.fault(w.client, name, "lose", owners, rotate)
		return errInjected
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
				return ctx.Err()
			}
		}
	}
	if w.dead.Load() {
		return errCrashed
	}
	return err
}

func (w *faulty) Acquire(ctx context.Context, req driver.AcquireRequest) (g driver.Grant, err error) {
	err = w.call(ctx, "acquire", false, []string{req.Owner}, func() error {
		w.rec.attempt(req.Owner)
		g, err = w.b.Acquire(ctx, req)
		if debug {
			w.rec.note("acquire %s -> %v %v", req.Owner, g, err)
		}
		return err
	})
	return g, err
}

func (w *faulty) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (ng driver.Grant, err error) {
	// A metadata update may issue a new token as a rotation does (etcd and
	// ZooKeeper re-put the record, whose version is the token): a fault
	// that hides its outcome is treated like one hiding a rotation's.
	err = w.call(ctx, "renew", req.Rotate || req.SetMetadata, []string{g.Owner}, func() error {
		ng, err = w.b.Renew(ctx, g, req)
		if debug {
			w.rec.note("renew rotate %v %v -> %v %v", req.Rotate, g, ng, err)
		}
		if err == nil && ng.Token != g.Token {
			w.rec.rotated(g.Owner, ng.Token)
		}
		return err
	})
	return ng, err
}

func (w *faulty) Release(ctx context.Context, g driver.Grant) error {
	return w.call(ctx, "release", false, []string{g.Owner}, func() error {
		err := w.b.Release(ctx, g)
		if debug {
			w.rec.note("release %v -> %v", g, err)
		}
		return err
	})
}

// debug, from FENCELOCK_GEN_DEBUG, adds every engine event and every
// acquire, renewal and release the store answered to a failing program's history.
var debug = os.Getenv("FENCELOCK_GEN_DEBUG") != ""

func (w *faulty) Inspect(ctx context.Context, key string) (info driver.Info, err error) {
	if w.dead.Load() {
		return info, errCrashed
	}
	return w.b.Inspect(ctx, key)
}

func (w *faulty) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if w.dead.Load() {
		return nil, errCrashed
	}
	return w.b.List(ctx, prefix)
}

func (w *faulty) Close() error { return w.b.Close() }

func (w *faulty) Describe() driver.Description {
	if d, ok := w.b.(driver.Describer); ok {
		return d.Describe()
	}
	return driver.Description{Name: "backend"}
}

func (w *faulty) AcquireWait(ctx context.Context, req driver.AcquireRequest) (g driver.Grant, err error) {
	err = w.call(ctx, "acquire-wait", false, []string{req.Owner}, func() error {
		w.rec.attempt(req.Owner)
		g, err = w.b.(driver.Waiter).AcquireWait(ctx, req)
		return err
	})
	return g, err
}

func (w *faulty) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if w.dead.Load() {
		return nil, errCrashed
	}
	return w.b.(driver.Watcher).Watch(ctx, key)
}

func (w *faulty) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) (res []driver.RenewResult, err error) {
	owners := make([]string, len(grants))
	for i, g := range grants {
		owners[i] = g.Owner
	}
	err = w.call(ctx, "renew-batch", req.Rotate, owners, func() error {
		res, err = w.b.(driver.BatchRenewer).RenewBatch(ctx, grants, req)
		for i, r := range res {
			if r.Err == nil && i < len(grants) && r.Grant.Token != grants[i].Token {
				w.rec.rotated(grants[i].Owner, r.Grant.Token)
			}
		}
		if debug {
			w.rec.note("renew-batch rotate %v grants %v -> %v %v", req.Rotate, grants, res, err)
		}
		return err
	})
	return res, err
}

func (w *faulty) NotifyLoss(g driver.Grant, lost func(error)) func() {
	return w.b.(driver.LossNotifier).NotifyLoss(g, lost)
}

// crash makes the client behave like a dead process: its calls fail
// before reaching the store.
func (w *faulty) crash() { w.dead.Store(true) }

// The engine discovers capabilities by type assertion, so the wrapper
// must have exactly the wrapped backend's. These types cover every
// combination of the four the engine uses.
type (
	base interface {
		driver.Backend
		driver.Describer
	}
	wa = driver.Waiter
	wt = driver.Watcher
	bt = driver.BatchRenewer
	ln = driver.LossNotifier
)

// wrap returns w with exactly the optional capabilities of w.b.
func wrap(w *faulty) driver.Backend {
	_, a := w.b.(driver.Waiter)
	_, t := driver.Watches(w.b)
	_, r := w.b.(driver.BatchRenewer)
	_, l := w.b.(driver.LossNotifier)
	mask := 0
	for i, has := range []bool{a, t, r, l} {
		if has {
			mask |= 1 << i
		}
	}
	switch mask {
	case 0b0000:
		return struct{ base }{w}
	case 0b0001:
		return struct {
			base
			wa
		}{w, w}
	case 0b0010:
		return struct {
			base
			wt
		}{w, w}
	case 0b0011:
		return struct {
			base
			wa
			wt
		}{w, w, w}
	case 0b0100:
		return struct {
			base
			bt
		}{w, w}
	case 0b0101:
		return struct {
			base
			wa
			bt
		}{w, w, w}
	case 0b0110:
		return struct {
			base
			wt
			bt
		}{w, w, w}
	case 0b0111:
		return struct {
			base
			wa
			wt
			bt
		}{w, w, w, w}
	case 0b1000:
		return struct {
			base
			ln
		}{w, w}
	case 0b1001:
		return struct {
			base
			wa
			ln
		}{w, w, w}
	case 0b1010:
		return struct {
			base
			wt
			ln
		}{w, w, w}
	case 0b1011:
		return struct {
			base
			wa
			wt
			ln
		}{w, w, w, w}
	case 0b1100:
		return struct {
			base
			bt
			ln
		}{w, w, w}
	case 0b1101:
		return struct {
			base
			wa
			bt
			ln
		}{w, w, w, w}
	case 0b1110:
		return struct {
			base
			wt
			bt
			ln
		}{w, w, w, w}
	default:
		return struct {
			base
			wa
			wt
			bt
			ln
		}{w, w, w, w, w}
	}
}
