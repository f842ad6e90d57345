// Package fakebackend is the one programmable fake store of the project's
// tests: it wraps a real driver.Backend (the memory backend, as a rule)
// and lets a test choose which optional capabilities the store shows the
// engine, count its calls, and make a chosen operation fail, block until
// the test lets it go, or answer late after the store applied it.
//
// A Fake forwards every call to the backend it wraps. Around each call it
// runs, in order: the call count; the operation's fault (Set), which may
// block or fail the request before it reaches the store; the operation's
// hook (OnAcquire, OnRenew, …), which replaces the call to the store (it
// is given the call to the store as next); and, for a request the store
// applied, the operation's late fault (SetLate): a store whose reply is
// late or lost.
//
// Capabilities are a matter of type in Go (the engine asks b.(Waiter)),
// so Backend returns a value of a type that implements exactly the
// Fake's Caps: Plain is the bare driver.Backend (waits poll, renewals go
// one at a time), Memory what the memory backend offers. A capability the
// wrapped backend lacks is emulated (Waiter: AcquireWait retries Acquire,
// woken by the wrapped backend's Watch or by a poll; BatchRenewer,
// BatchAcquirer and BatchReleaser: one call per member) or answers
// driver.ErrUnsupported.
//
// Faults and hooks are waits the test controls, never sleeps: a Gate
// holds a request until the test opens it and tells the test when a
// request reached it. LetGo ends every fault's wait at once, so that a
// test whose call hung can end.
//
// It imports the standard library and the root module only, so that
// every module of the repository may use it.
package fakebackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// Op names an operation of a backend.
type Op string

// The operations a Fake counts and faults.
const (
	Acquire      Op = "acquire"
	AcquireWait  Op = "wait"
	Renew        Op = "renew"
	RenewBatch   Op = "renewbatch"
	AcquireBatch Op = "acquirebatch"
	Release      Op = "release"
	ReleaseBatch Op = "releasebatch"
	Inspect      Op = "inspect"
	List         Op = "list"
	Watch        Op = "watch"
	ForceRelease Op = "forcerelease"
	Close        Op = "close"
)

// Requests are the operations that carry a request to the store and can
// be faulted with SetAll: every Op but Watch, ForceRelease and Close.
var Requests = []Op{Acquire, Renew, RenewBatch, Release, Inspect, List, AcquireWait, AcquireBatch, ReleaseBatch}

// Caps is a set of the optional driver capabilities a Fake shows.
type Caps uint16

// The capabilities.
const (
	Waiter Caps = 1 << iota
	Watcher
	BatchRenewer
	LossNotifier
	ForceReleaser
	Describer
	TokenFloorer
	Guarantor
	BatchAcquirer
	BatchReleaser

	// Plain shows no optional capability: the bare driver.Backend.
	Plain Caps = 0
	// Memory is what the memory backend shows.
	Memory  = Watcher | BatchRenewer | LossNotifier | ForceReleaser | Describer | TokenFloorer | Guarantor | BatchAcquirer | BatchReleaser
	allCaps = Memory | Waiter
)

// CapsOf returns the optional capabilities b implements.
func CapsOf(b driver.Backend) Caps {
	var c Caps
	if _, ok := b.(driver.Waiter); ok {
		c |= Waiter
	}
	if _, ok := b.(driver.Watcher); ok {
		c |= Watcher
	}
	if _, ok := b.(driver.BatchRenewer); ok {
		c |= BatchRenewer
	}
	if _, ok := b.(driver.LossNotifier); ok {
		c |= LossNotifier
	}
	if _, ok := b.(driver.ForceReleaser); ok {
		c |= ForceReleaser
	}
	if _, ok := b.(driver.Describer); ok {
		c |= Describer
	}
	if _, ok := b.(driver.TokenFloorer); ok {
		c |= TokenFloorer
	}
	if _, ok := b.(driver.Guarantor); ok {
		c |= Guarantor
	}
	if _, ok := b.(driver.BatchAcquirer); ok {
		c |= BatchAcquirer
	}
	if _, ok := b.(driver.BatchReleaser); ok {
		c |= BatchReleaser
	}
	return c
}

// Fault runs before (Set) or after (SetLate) a request reaches the store.
// It may block (on ctx, a Gate, a channel) and returns nil to let the
// request go on or an error to fail it with. Its ctx is the request's,
// also ended by LetGo.
type Fault func(ctx context.Context) error

// The call to the store a hook is given.
type (
	// AcquireFunc is an Acquire or AcquireWait.
	AcquireFunc = func(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error)
	// RenewFunc is a Renew.
	RenewFunc = func(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error)
	// RenewBatchFunc is a RenewBatch.
	RenewBatchFunc = func(ctx context.Context, gs []driver.Grant, r driver.RenewRequest) ([]driver.RenewResult, error)
	// AcquireBatchFunc is an AcquireBatch.
	AcquireBatchFunc = func(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error)
	// ReleaseFunc is a Release.
	ReleaseFunc = func(ctx context.Context, g driver.Grant) error
	// ReleaseBatchFunc is a ReleaseBatch.
	ReleaseBatchFunc = func(ctx context.Context, gs []driver.Grant) ([]error, error)
	// InspectFunc is an Inspect.
	InspectFunc = func(ctx context.Context, key string) (driver.Info, error)
	// WatchFunc is a Watch.
	WatchFunc = func(ctx context.Context, key string) (<-chan struct{}, error)
)

// Fake is a programmable wrapper of a backend. Its methods are safe for
// concurrent use; hooks are best set before the backend is in use.
type Fake struct {
	inner driver.Backend
	caps  Caps

	gone  context.Context // ended by LetGo
	letGo context.CancelFunc

	mu     sync.Mutex
	calls  map[Op]int
	faults map[Op]Fault
	late   map[Op]Fault
	hooks  struct {
		acquire, acquireWait AcquireFunc
		renew                RenewFunc
		renewBatch           RenewBatchFunc
		acquireBatch         AcquireBatchFunc
		release              ReleaseFunc
		releaseBatch         ReleaseBatchFunc
		inspect              InspectFunc
		watch                WatchFunc
		close                func() error
	}
	pollEvery time.Duration
}

// New returns a Fake over inner that shows caps.
func New(inner driver.Backend, caps Caps) *Fake {
	f := &Fake{inner: inner, caps: caps & allCaps, calls: map[Op]int{}, faults: map[Op]Fault{}, late: map[Op]Fault{}}
	f.gone, f.letGo = context.WithCancel(context.Background())
	return f
}

// Inner returns the wrapped backend.
func (f *Fake) Inner() driver.Backend { return f.inner }

// Backend returns f as a driver.Backend showing f's capabilities.
func (f *Fake) Backend() driver.Backend { return f.As(f.caps) }

// As returns f as a driver.Backend showing caps instead of f's own: two
// views of one Fake share its faults, hooks and counts.
func (f *Fake) As(caps Caps) driver.Backend { return view(f, caps&allCaps) }

// Calls returns how many calls of op reached the Fake so far.
func (f *Fake) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Set programs op's fault, run before the request reaches the store (nil:
// none).
func (f *Fake) Set(op Op, fault Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[op] = fault
}

// SetAll programs the fault of every operation in Requests.
func (f *Fake) SetAll(fault Fault) {
	for _, op := range Requests {
		f.Set(op, fault)
	}
}

// SetLate programs op's late fault, run after the store applied the
// request (it answered without error), before its answer is returned: a
// store whose reply is late, or lost if the fault fails.
func (f *Fake) SetLate(op Op, fault Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.late[op] = fault
}

// LetGo ends the wait of every fault, now and later.
func (f *Fake) LetGo() { f.letGo() }

// Gone returns a context that LetGo ends.
func (f *Fake) Gone() context.Context { return f.gone }

// SetPoll makes the emulated AcquireWait poll every d instead of waiting
// for the wrapped backend's Watch.
func (f *Fake) SetPoll(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pollEvery = d
}

// OnAcquire replaces the store's Acquire with h; next is the store's.
func (f *Fake) OnAcquire(h func(ctx context.Context, r driver.AcquireRequest, next AcquireFunc) (driver.Grant, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.acquire = func(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
		return h(ctx, r, f.inner.Acquire)
	}
}

// OnAcquireWait replaces the AcquireWait with h; acquire is the Fake's
// own Acquire (counted and faulted), to build a wait on.
func (f *Fake) OnAcquireWait(h func(ctx context.Context, r driver.AcquireRequest, acquire AcquireFunc) (driver.Grant, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.acquireWait = func(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
		return h(ctx, r, f.acquire)
	}
}

// OnRenew replaces the store's Renew with h; next is the store's.
func (f *Fake) OnRenew(h func(ctx context.Context, g driver.Grant, r driver.RenewRequest, next RenewFunc) (driver.Grant, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.renew = func(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error) {
		return h(ctx, g, r, f.inner.Renew)
	}
}

// OnRenewBatch replaces the store's RenewBatch with h; next is the
// store's (or one Renew per grant, if the store has no RenewBatch).
func (f *Fake) OnRenewBatch(h func(ctx context.Context, gs []driver.Grant, r driver.RenewRequest, next RenewBatchFunc) ([]driver.RenewResult, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.renewBatch = func(ctx context.Context, gs []driver.Grant, r driver.RenewRequest) ([]driver.RenewResult, error) {
		return h(ctx, gs, r, f.innerRenewBatch)
	}
}

// OnAcquireBatch replaces the store's AcquireBatch with h; next is the
// store's (or one Acquire per request, if the store has no AcquireBatch).
func (f *Fake) OnAcquireBatch(h func(ctx context.Context, reqs []driver.AcquireRequest, next AcquireBatchFunc) ([]driver.AcquireResult, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.acquireBatch = func(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
		return h(ctx, reqs, f.innerAcquireBatch)
	}
}

// OnReleaseBatch replaces the store's ReleaseBatch with h; next is the
// store's (or one Release per grant, if the store has no ReleaseBatch).
func (f *Fake) OnReleaseBatch(h func(ctx context.Context, gs []driver.Grant, next ReleaseBatchFunc) ([]error, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.releaseBatch = func(ctx context.Context, gs []driver.Grant) ([]error, error) {
		return h(ctx, gs, f.innerReleaseBatch)
	}
}

// OnRelease replaces the store's Release with h; next is the store's.
func (f *Fake) OnRelease(h func(ctx context.Context, g driver.Grant, next ReleaseFunc) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.release = func(ctx context.Context, g driver.Grant) error { return h(ctx, g, f.inner.Release) }
}

// OnInspect replaces the store's Inspect with h; next is the store's.
func (f *Fake) OnInspect(h func(ctx context.Context, key string, next InspectFunc) (driver.Info, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.inspect = func(ctx context.Context, key string) (driver.Info, error) { return h(ctx, key, f.inner.Inspect) }
}

// OnWatch replaces the store's Watch with h; next is the store's (or one
// answering driver.ErrUnsupported).
func (f *Fake) OnWatch(h func(ctx context.Context, key string, next WatchFunc) (<-chan struct{}, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.watch = func(ctx context.Context, key string) (<-chan struct{}, error) { return h(ctx, key, f.innerWatch) }
}

// OnClose replaces the store's Close with h; next is the store's.
func (f *Fake) OnClose(h func(next func() error) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks.close = func() error { return h(f.inner.Close) }
}

// enter counts a call of op, runs pick (to read its hook) and returns
// its fault and late fault, all under f.mu.
func (f *Fake) enter(op Op, pick func()) (fault, late Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	if pick != nil {
		pick()
	}
	return f.faults[op], f.late[op]
}

// run runs fault on a context that ctx's end or LetGo ends.
func (f *Fake) run(ctx context.Context, fault Fault) error {
	if fault == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(f.gone, cancel)()
	return fault(ctx)
}

func (f *Fake) acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	var call AcquireFunc
	fault, late := f.enter(Acquire, func() { call = f.hooks.acquire })
	if err := f.run(ctx, fault); err != nil {
		return driver.Grant{}, err
	}
	if call == nil {
		call = f.inner.Acquire
	}
	g, err := call(ctx, r)
	if err == nil {
		if err := f.run(ctx, late); err != nil {
			return driver.Grant{}, err
		}
	}
	return g, err
}

func (f *Fake) acquireWait(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	var call AcquireFunc
	fault, late := f.enter(AcquireWait, func() { call = f.hooks.acquireWait })
	if err := f.run(ctx, fault); err != nil {
		return driver.Grant{}, err
	}
	if call == nil {
		call = f.emulatedWait
	}
	g, err := call(ctx, r)
	if err == nil {
		if err := f.run(ctx, late); err != nil {
			return driver.Grant{}, err
		}
	}
	return g, err
}

// emulatedWait is the AcquireWait of a Fake whose hook does not replace
// it: the wrapped backend's own, if it is a Waiter; else Acquire (the
// Fake's), retried whenever the wrapped backend's Watch reports a change
// of the key, or every SetPoll interval (50ms if the store cannot watch).
func (f *Fake) emulatedWait(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	if w, ok := f.inner.(driver.Waiter); ok {
		return w.AcquireWait(ctx, r)
	}
	f.mu.Lock()
	every := f.pollEvery
	f.mu.Unlock()
	w, watches := driver.Watches(f.inner)
	if every == 0 && !watches {
		every = 50 * time.Millisecond
	}
	for {
		var changed <-chan struct{}
		wctx, cancel := context.WithCancel(ctx)
		if every == 0 {
			ch, err := w.Watch(wctx, r.Key)
			if err != nil {
				cancel()
				return driver.Grant{}, err
			}
			changed = ch
		}
		g, err := f.acquire(ctx, r)
		if !errors.Is(err, driver.ErrNotAcquired) {
			cancel()
			return g, err
		}
		var tick <-chan time.Time
		var t *time.Timer
		if every > 0 {
			t = time.NewTimer(every)
			tick = t.C
		}
		select {
		case <-changed:
		case <-tick:
		case <-ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		cancel()
		if ctx.Err() != nil {
			return driver.Grant{}, ctx.Err()
		}
	}
}

func (f *Fake) renew(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error) {
	var call RenewFunc
	fault, late := f.enter(Renew, func() { call = f.hooks.renew })
	if err := f.run(ctx, fault); err != nil {
		return driver.Grant{}, err
	}
	if call == nil {
		call = f.inner.Renew
	}
	ng, err := call(ctx, g, r)
	if err == nil {
		if err := f.run(ctx, late); err != nil {
			return driver.Grant{}, err
		}
	}
	return ng, err
}

func (f *Fake) innerRenewBatch(ctx context.Context, gs []driver.Grant, r driver.RenewRequest) ([]driver.RenewResult, error) {
	if b, ok := f.inner.(driver.BatchRenewer); ok {
		return b.RenewBatch(ctx, gs, r)
	}
	out := make([]driver.RenewResult, len(gs))
	for i, g := range gs {
		out[i].Grant, out[i].Err = f.inner.Renew(ctx, g, r)
	}
	return out, nil
}

func (f *Fake) renewBatch(ctx context.Context, gs []driver.Grant, r driver.RenewRequest) ([]driver.RenewResult, error) {
	var call RenewBatchFunc
	fault, late := f.enter(RenewBatch, func() { call = f.hooks.renewBatch })
	if err := f.run(ctx, fault); err != nil {
		return nil, err
	}
	if call == nil {
		call = f.innerRenewBatch
	}
	res, err := call(ctx, gs, r)
	if err == nil {
		if err := f.run(ctx, late); err != nil {
			return nil, err
		}
	}
	return res, err
}

func (f *Fake) innerAcquireBatch(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	if b, ok := f.inner.(driver.BatchAcquirer); ok {
		return b.AcquireBatch(ctx, reqs)
	}
	out := make([]driver.AcquireResult, len(reqs))
	for i, r := range reqs {
		out[i].Grant, out[i].Err = f.inner.Acquire(ctx, r)
	}
	return out, nil
}

func (f *Fake) acquireBatch(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	var call AcquireBatchFunc
	fault, late := f.enter(AcquireBatch, func() { call = f.hooks.acquireBatch })
	if err := f.run(ctx, fault); err != nil {
		return nil, err
	}
	if call == nil {
		call = f.innerAcquireBatch
	}
	res, err := call(ctx, reqs)
	if err == nil {
		if err := f.run(ctx, late); err != nil {
			return nil, err
		}
	}
	return res, err
}

func (f *Fake) innerReleaseBatch(ctx context.Context, gs []driver.Grant) ([]error, error) {
	if b, ok := f.inner.(driver.BatchReleaser); ok {
		return b.ReleaseBatch(ctx, gs)
	}
	errs := make([]error, len(gs))
	for i, g := range gs {
		errs[i] = f.inner.Release(ctx, g)
	}
	return errs, nil
}

func (f *Fake) releaseBatch(ctx context.Context, gs []driver.Grant) ([]error, error) {
	var call ReleaseBatchFunc
	fault, late := f.enter(ReleaseBatch, func() { call = f.hooks.releaseBatch })
	if err := f.run(ctx, fault); err != nil {
		return nil, err
	}
	if call == nil {
		call = f.innerReleaseBatch
	}
	errs, err := call(ctx, gs)
	if err == nil {
		if err := f.run(ctx, late); err != nil {
			return nil, err
		}
	}
	return errs, err
}

func (f *Fake) release(ctx context.Context, g driver.Grant) error {
	var call ReleaseFunc
	fault, late := f.enter(Release, func() { call = f.hooks.release })
	if err := f.run(ctx, fault); err != nil {
		return err
	}
	if call == nil {
		call = f.inner.Release
	}
	err := call(ctx, g)
	if err == nil {
		err = f.run(ctx, late)
	}
	return err
}

func (f *Fake) inspect(ctx context.Context, key string) (driver.Info, error) {
	var call InspectFunc
	fault, late := f.enter(Inspect, func() { call = f.hooks.inspect })
	if err := f.run(ctx, fault); err != nil {
		return driver.Info{}, err
	}
	if call == nil {
		call = f.inner.Inspect
	}
	info, err := call(ctx, key)
	if err == nil {
		if err := f.run(ctx, late); err != nil {
			return driver.Info{}, err
		}
	}
	return info, err
}

func (f *Fake) list(ctx context.Context, prefix string) ([]driver.Info, error) {
	fault, late := f.enter(List, nil)
	if err := f.run(ctx, fault); err != nil {
		return nil, err
	}
	out, err := f.inner.List(ctx, prefix)
	if err == nil {
		if err := f.run(ctx, late); err != nil {
			return nil, err
		}
	}
	return out, err
}

func (f *Fake) innerWatch(ctx context.Context, key string) (<-chan struct{}, error) {
	if w, ok := f.inner.(driver.Watcher); ok {
		return w.Watch(ctx, key)
	}
	return nil, fmt.Errorf("fakebackend: the wrapped backend cannot watch: %w", driver.ErrUnsupported)
}

func (f *Fake) watch(ctx context.Context, key string) (<-chan struct{}, error) {
	var call WatchFunc
	fault, _ := f.enter(Watch, func() { call = f.hooks.watch })
	if err := f.run(ctx, fault); err != nil {
		return nil, err
	}
	if call == nil {
		call = f.innerWatch
	}
	return call(ctx, key)
}

func (f *Fake) notifyLoss(g driver.Grant, lost func(error)) func() {
	if n, ok := f.inner.(driver.LossNotifier); ok {
		return n.NotifyLoss(g, lost)
	}
	return func() {}
}

func (f *Fake) forceRelease(ctx context.Context, key string) (driver.Info, error) {
	fault, _ := f.enter(ForceRelease, nil)
	if err := f.run(ctx, fault); err != nil {
		return driver.Info{}, err
	}
	if fr, ok := f.inner.(driver.ForceReleaser); ok {
		return fr.ForceRelease(ctx, key)
	}
	return driver.Info{}, fmt.Errorf("fakebackend: the wrapped backend cannot force a release: %w", driver.ErrUnsupported)
}

func (f *Fake) describe() driver.Description {
	if d, ok := f.inner.(driver.Describer); ok {
		return d.Describe()
	}
	return driver.Description{Name: "fake"}
}

func (f *Fake) highWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if t, ok := f.inner.(driver.TokenFloorer); ok {
		return t.HighWater(ctx, prefix)
	}
	return driver.HighWater{}, fmt.Errorf("fakebackend: the wrapped backend has no token floor: %w", driver.ErrUnsupported)
}

func (f *Fake) raiseFloor(ctx context.Context, key string, floor driver.Token) error {
	if t, ok := f.inner.(driver.TokenFloorer); ok {
		return t.RaiseFloor(ctx, key, floor)
	}
	return fmt.Errorf("fakebackend: the wrapped backend has no token floor: %w", driver.ErrUnsupported)
}

func (f *Fake) guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	if g, ok := f.inner.(driver.Guarantor); ok {
		return g.Guarantees(ctx)
	}
	return nil, fmt.Errorf("fakebackend: the wrapped backend measures no guarantee: %w", driver.ErrUnsupported)
}

func (f *Fake) close() error {
	var call func() error
	f.enter(Close, func() { call = f.hooks.close })
	if call == nil {
		call = f.inner.Close
	}
	return call()
}

// Gate holds requests until the test opens it, and tells the test when
// the first request reached it: the event a test awaits instead of a
// sleep. The zero Gate is not usable; use NewGate.
type Gate struct {
	reached, open chan struct{}
	once, opened  sync.Once
	n             atomic.Int64
}

// NewGate returns a closed gate.
func NewGate() *Gate { return &Gate{reached: make(chan struct{}), open: make(chan struct{})} }

// Wait marks the gate reached and waits until it is open (nil) or ctx
// ends (ctx's error).
func (g *Gate) Wait(ctx context.Context) error {
	g.n.Add(1)
	g.once.Do(func() { close(g.reached) })
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Fault returns a Fault that waits at the gate.
func (g *Gate) Fault() Fault { return g.Wait }

// Reached is closed once a request reached the gate.
func (g *Gate) Reached() <-chan struct{} { return g.reached }

// Waits returns how many requests reached the gate.
func (g *Gate) Waits() int { return int(g.n.Load()) }

// Opened is closed once the gate is open.
func (g *Gate) Opened() <-chan struct{} { return g.open }

// Open lets every held request, and every later one, through.
func (g *Gate) Open() { g.opened.Do(func() { close(g.open) }) }

// Fail returns a Fault that fails every request with err.
func Fail(err error) Fault { return func(context.Context) error { return err } }

// FailOnce returns a Fault that fails the first request with err and
// lets every later one through.
func FailOnce(err error) Fault {
	var done atomic.Bool
	return func(context.Context) error {
		if done.CompareAndSwap(false, true) {
			return err
		}
		return nil
	}
}

// Silent is a Fault that never answers: it returns ctx's error once the
// request's context ends (or LetGo).
func Silent(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}
