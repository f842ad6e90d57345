package contender

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/faultproxy"
	"github.com/fencelock/fencelock/safety/history"
)

// Mutant names a deliberately broken backend behaviour, for the negative
// controls: the checker must flag each one.
type Mutant string

// The mutants.
const (
	// NoMutant is the real backend, unchanged.
	NoMutant Mutant = ""
	// MutantToken: the token is not incremented; every grant reports
	// token 1 (the real token is still used with the store).
	MutantToken Mutant = "token-not-incremented"
	// MutantExpiry: the expiry check is removed; Renew (and RenewBatch)
	// "succeed" without asking the store, so a holder never learns that
	// its record expired.
	MutantExpiry Mutant = "expiry-check-removed"
	// MutantRelease: release without owner check; Release removes the
	// key's record whoever holds it (a ForceRelease), so a stale release
	// frees a newer holder's lock.
	MutantRelease Mutant = "release-without-owner-check"
	// MutantRenewAfterRelease: renewal continues after release; Release
	// reports success after one store round trip (a renewal, not a
	// delete), and the grant keeps being renewed in the background, so
	// the key stays held by a lease whose holder believes it released it.
	MutantRenewAfterRelease Mutant = "renewal-after-release"
)

// Mutants lists every mutant, for tests that run them all.
var Mutants = []Mutant{MutantToken, MutantExpiry, MutantRelease, MutantRenewAfterRelease}

func (m Mutant) valid() bool {
	if m == NoMutant {
		return true
	}
	for _, k := range Mutants {
		if m == k {
			return true
		}
	}
	return false
}

// callState travels in the context of one Acquire or Release call of the
// contender, so the backend decorator can drop the reply of one of its
// store round trips and report whether it did.
type callState struct {
	drop bool // drop the reply of one attempt of this call
	mu   sync.Mutex
	hit  bool // an attempt failed after its reply was dropped
}

type callKey struct{}

func withCall(ctx context.Context, cs *callState) context.Context {
	return context.WithValue(ctx, callKey{}, cs)
}

// recorder decorates a driver.Backend: it records the raw grant of every
// owner (for stale operations), drops replies on request through the
// contender's proxy, implements the mutants, and reports batches of
// renewals and waits as events. It keeps the optional capabilities of the
// backend it wraps (see decorate).
type recorder struct {
	inner  driver.Backend
	proxy  *faultproxy.Proxy // nil: no proxy
	mutant Mutant
	ttl    time.Duration
	emit   func(history.Event)
	// stores makes the recorder report every record the store grants
	// and every release it is asked for (history.StoreAcquired,
	// StoreReleased): Config.Multi.
	stores bool

	batch  driver.BatchRenewer
	bacq   driver.BatchAcquirer
	brel   driver.BatchReleaser
	forcer driver.ForceReleaser
	waiter driver.Waiter
	watch  driver.Watcher
	loss   driver.LossNotifier

	mu      sync.Mutex
	grants  map[string]driver.Grant // by owner: the last grant as the engine saw it
	real    map[string]driver.Token // MutantToken: the real token by owner
	zombies map[string]bool         // MutantRenewAfterRelease: owners still renewed

	life context.Context // cancelled by Close
	end  context.CancelFunc
	wg   sync.WaitGroup
}

func newRecorder(inner driver.Backend, proxy *faultproxy.Proxy, mutant Mutant, ttl time.Duration, emit func(history.Event)) *recorder {
	r := &recorder{
		inner:   inner,
		proxy:   proxy,
		mutant:  mutant,
		ttl:     ttl,
		emit:    emit,
		grants:  make(map[string]driver.Grant),
		real:    make(map[string]driver.Token),
		zombies: make(map[string]bool),
	}
	r.batch, _ = inner.(driver.BatchRenewer)
	r.bacq, _ = inner.(driver.BatchAcquirer)
	r.brel, _ = inner.(driver.BatchReleaser)
	r.forcer, _ = inner.(driver.ForceReleaser)
	r.waiter, _ = inner.(driver.Waiter)
	r.watch, _ = driver.Watches(inner)
	r.loss, _ = inner.(driver.LossNotifier)
	r.life, r.end = context.WithCancel(context.Background())
	return r
}

// Optional capabilities the engine discovers by type assertion; the
// decorator must offer exactly those of the backend it wraps.
type (
	watchPart struct{ r *recorder }
	waitPart  struct{ r *recorder }
	lossPart  struct{ r *recorder }
	batchPart struct{ r *recorder }
)

// AcquireBatch passes a batch of the engine's coalesced acquire attempts
// through, with a BatchAcquire event for it. A reply drop a call asked
// for (withDrop) applies to its single attempts only: a batch carries
// other calls' attempts too.
func (p batchPart) AcquireBatch(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	res, err := p.r.bacq.AcquireBatch(ctx, reqs)
	p.r.emit(history.Event{Kind: history.BatchAcquire, N: len(reqs), Err: errString(err)})
	if err != nil {
		return res, err
	}
	for i := range res {
		if res[i].Err == nil {
			p.r.took(res[i].Grant)
			res[i].Grant = p.r.granted(res[i].Grant)
		}
	}
	return res, nil
}

// ReleaseBatch passes a batch of coalesced releases through, with a
// BatchRelease event for it; under a mutant of Release, each grant goes
// through the mutant's Release instead.
func (p batchPart) ReleaseBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	r := p.r
	if r.mutant == MutantRelease || r.mutant == MutantRenewAfterRelease {
		errs := make([]error, len(grants))
		for i, g := range grants {
			errs[i] = r.Release(ctx, g)
		}
		return errs, nil
	}
	real := make([]driver.Grant, len(grants))
	for i, g := range grants {
		real[i] = r.unmutate(g)
		if r.stores {
			r.emit(history.Event{Kind: history.StoreReleased, Key: g.Key, Token: uint64(real[i].Token), Note: g.Owner})
		}
	}
	errs, err := r.brel.ReleaseBatch(ctx, real)
	r.emit(history.Event{Kind: history.BatchRelease, N: len(grants), Err: errString(err)})
	return errs, err
}

func (p watchPart) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	ch, err := p.r.watch.Watch(ctx, key)
	p.r.emit(history.Event{Kind: history.Wait, Key: key, Note: "watch", Err: errString(err)})
	return ch, err
}

func (p waitPart) AcquireWait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	p.r.emit(history.Event{Kind: history.Wait, Key: req.Key, Note: "acquire_wait"})
	g, err := p.r.waiter.AcquireWait(ctx, req)
	if err != nil {
		return g, err
	}
	p.r.took(g)
	return p.r.granted(g), nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (p lossPart) NotifyLoss(g driver.Grant, lost func(cause error)) (stop func()) {
	return p.r.loss.NotifyLoss(p.r.unmutate(g), lost)
}

// decorate returns r as a driver.Backend with the same optional
// capabilities (Watcher, Waiter, LossNotifier, and BatchAcquirer with
// BatchReleaser) as r.inner. BatchRenewer, ForceReleaser and Describer
// are always offered: every backend of the suite has them, and without
// them the decorator falls back to one call per grant, ErrUnsupported
// and a bare name.
func (r *recorder) decorate() driver.Backend {
	w, q, l, b := r.watch != nil, r.waiter != nil, r.loss != nil, r.bacq != nil && r.brel != nil
	switch {
	case w && q && l && b:
		return struct {
			*recorder
			watchPart
			waitPart
			lossPart
			batchPart
		}{r, watchPart{r}, waitPart{r}, lossPart{r}, batchPart{r}}
	case w && q && l:
		return struct {
			*recorder
			watchPart
			waitPart
			lossPart
		}{r, watchPart{r}, waitPart{r}, lossPart{r}}
	case w && q && b:
		return struct {
			*recorder
			watchPart
			waitPart
			batchPart
		}{r, watchPart{r}, waitPart{r}, batchPart{r}}
	case w && l && b:
		return struct {
			*recorder
			watchPart
			lossPart
			batchPart
		}{r, watchPart{r}, lossPart{r}, batchPart{r}}
	case q && l && b:
		return struct {
			*recorder
			waitPart
			lossPart
			batchPart
		}{r, waitPart{r}, lossPart{r}, batchPart{r}}
	case w && q:
		return struct {
			*recorder
			watchPart
			waitPart
		}{r, watchPart{r}, waitPart{r}}
	case w && l:
		return struct {
			*recorder
			watchPart
			lossPart
		}{r, watchPart{r}, lossPart{r}}
	case w && b:
		return struct {
			*recorder
			watchPart
			batchPart
		}{r, watchPart{r}, batchPart{r}}
	case q && l:
		return struct {
			*recorder
			waitPart
			lossPart
		}{r, waitPart{r}, lossPart{r}}
	case q && b:
		return struct {
			*recorder
			waitPart
			batchPart
		}{r, waitPart{r}, batchPart{r}}
	case l && b:
		return struct {
			*recorder
			lossPart
			batchPart
		}{r, lossPart{r}, batchPart{r}}
	case w:
		return struct {
			*recorder
			watchPart
		}{r, watchPart{r}}
	case q:
		return struct {
			*recorder
			waitPart
		}{r, waitPart{r}}
	case l:
		return struct {
			*recorder
			lossPart
		}{r, lossPart{r}}
	case b:
		return struct {
			*recorder
			batchPart
		}{r, batchPart{r}}
	}
	return r
}

// granted records g (from the store) and returns it as the engine must
// see it.
func (r *recorder) granted(g driver.Grant) driver.Grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mutant == MutantToken {
		r.real[g.Owner] = g.Token
		g.Token = 1
	}
	r.grants[g.Owner] = g
	return g
}

// unmutate returns g as the store knows it.
func (r *recorder) unmutate(g driver.Grant) driver.Grant {
	if r.mutant != MutantToken {
		return g
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.real[g.Owner]; ok {
		g.Token = t
	}
	return g
}

// grant returns the last grant the engine saw for owner.
func (r *recorder) grant(owner string) (driver.Grant, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.grants[owner]
	return g, ok
}

// withDrop runs op, dropping the reply of its store round trip if ctx
// carries a call that asked for it and no earlier attempt was hit.
func (r *recorder) withDrop(ctx context.Context, op func() error) error {
	cs, _ := ctx.Value(callKey{}).(*callState)
	if cs == nil || r.proxy == nil {
		return op()
	}
	cs.mu.Lock()
	arm := cs.drop && !cs.hit
	cs.mu.Unlock()
	if !arm {
		return op()
	}
	d := r.proxy.DropNextReply()
	err := op()
	if !d.Cancel() && err != nil {
		// A request went out under the drop and the call failed: the
		// store may have acted on it.
		cs.mu.Lock()
		cs.hit = true
		cs.mu.Unlock()
	}
	return err
}

func (r *recorder) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	var g driver.Grant
	err := r.withDrop(ctx, func() (err error) {
		g, err = r.inner.Acquire(ctx, req)
		return err
	})
	if err != nil {
		return g, err
	}
	r.took(g)
	return r.granted(g), nil
}

// took reports a record the store granted (with stores).
func (r *recorder) took(g driver.Grant) {
	if r.stores {
		r.emit(history.Event{Kind: history.StoreAcquired, Key: g.Key, Token: uint64(g.Token), Note: g.Owner})
	}
}

func (r *recorder) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if r.mutant == MutantExpiry {
		return g, nil // the store is never asked
	}
	g2, err := r.inner.Renew(ctx, r.unmutate(g), req)
	if err != nil {
		return g2, err
	}
	return r.granted(g2), nil
}

func (r *recorder) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	res := make([]driver.RenewResult, len(grants))
	if r.mutant == MutantExpiry {
		for i, g := range grants {
			res[i].Grant = g
		}
		return res, nil
	}
	if r.batch == nil {
		for i, g := range grants {
			res[i].Grant, res[i].Err = r.Renew(ctx, g, req)
		}
		return res, nil
	}
	real := make([]driver.Grant, len(grants))
	for i, g := range grants {
		real[i] = r.unmutate(g)
	}
	out, err := r.batch.RenewBatch(ctx, real, req)
	if len(grants) > 1 {
		r.emit(history.Event{Kind: history.BatchRenew, N: len(grants), Err: errString(err)})
	}
	if err != nil {
		return out, err
	}
	for i := range out {
		if out[i].Err == nil {
			out[i].Grant = r.granted(out[i].Grant)
		}
	}
	return out, nil
}

func (r *recorder) Release(ctx context.Context, g driver.Grant) error {
	real := r.unmutate(g)
	if r.stores {
		r.emit(history.Event{Kind: history.StoreReleased, Key: g.Key, Token: uint64(real.Token), Note: g.Owner})
	}
	switch {
	case r.mutant == MutantRelease && r.forcer != nil:
		return r.withDrop(ctx, func() error {
			info, err := r.forcer.ForceRelease(ctx, real.Key)
			if err == nil && !info.Locked() {
				err = driver.ErrNotHeld
			}
			return err
		})
	case r.mutant == MutantRenewAfterRelease:
		err := r.withDrop(ctx, func() error {
			ng, err := r.inner.Renew(ctx, real, driver.RenewRequest{TTL: r.ttl})
			if err == nil {
				real = ng
			}
			return err
		})
		if errors.Is(err, driver.ErrNotHeld) {
			return err
		}
		r.startZombie(real)
		return err
	}
	return r.withDrop(ctx, func() error { return r.inner.Release(ctx, real) })
}

// startZombie keeps renewing g until it is no longer held or the backend
// is closed (MutantRenewAfterRelease).
func (r *recorder) startZombie(g driver.Grant) {
	r.mu.Lock()
	if r.zombies[g.Owner] || r.life.Err() != nil {
		r.mu.Unlock()
		return
	}
	r.zombies[g.Owner] = true
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		every := r.ttl / 4
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-r.life.Done():
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(r.life, every)
			ng, err := r.inner.Renew(ctx, g, driver.RenewRequest{TTL: r.ttl})
			cancel()
			switch {
			case errors.Is(err, driver.ErrNotHeld):
				return
			case err == nil:
				g = ng
			}
		}
	}()
}

func (r *recorder) Inspect(ctx context.Context, key string) (driver.Info, error) {
	return r.inner.Inspect(ctx, key)
}

func (r *recorder) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	return r.inner.List(ctx, prefix)
}

func (r *recorder) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if r.forcer == nil {
		return driver.Info{}, driver.ErrUnsupported
	}
	return r.forcer.ForceRelease(ctx, key)
}

func (r *recorder) Describe() driver.Description {
	if d, ok := r.inner.(driver.Describer); ok {
		return d.Describe()
	}
	return driver.Description{}
}

// Close stops the zombies and closes the wrapped backend.
func (r *recorder) Close() error {
	r.mu.Lock()
	r.end()
	r.mu.Unlock()
	r.wg.Wait()
	return r.inner.Close()
}
