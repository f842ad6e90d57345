package etcd

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// maxWatchRestarts bounds how often a loss watch is re-established after
// etcd cancels it (compaction, leader loss). After that the engine's
// renewals still find the loss; the watch only makes it faster.
const maxWatchRestarts = 8

// lossWatchDelay is how long NotifyLoss waits before it starts watching: a
// lease released sooner (most short critical sections) costs no watch at
// all, and a deletion in the meantime is not missed, because the watch
// starts at the revision after the grant's.
const lossWatchDelay = 100 * time.Millisecond

// NotifyLoss implements driver.LossNotifier (see notifyLoss). A token
// that no revision maps to is reported lost at once.
func (b *Backend) NotifyLoss(g driver.Grant, lost func(cause error)) (stop func()) {
	n, err := g, error(nil)
	if r, ok := b.fl.cachedNative(g.Token); ok {
		// The common case, mapped without a context (a timer and a
		// child of b.ctx, shared by every call) that nothing would use.
		n.Token = driver.Token(r)
	} else {
		ctx, cancel := context.WithTimeout(b.ctx, b.cleanupTimeout)
		n, err = b.nativeGrant(ctx, g)
		cancel()
	}
	if err == nil && n.Token == 0 && g.Token != 0 {
		err = driver.ErrNotHeld
	}
	if err != nil {
		var once sync.Once
		t := time.AfterFunc(0, func() { once.Do(func() { lost(err) }) })
		return func() { t.Stop(); once.Do(func() {}) }
	}
	return b.notifyLoss(n, lost)
}

// notifyLoss is NotifyLoss on native tokens (mod revisions; floor.go maps them to the tokens callers see): a watch on g's entry, from the
// revision after its creation, reports its deletion (by a force-release,
// an operator, or its lease expiring or being revoked) as
// driver.ErrNotHeld. Entry names are reused, but never while an entry has
// the name, so the first deletion after the grant's revision is its own.
// The watch starts 100ms after the grant (a lease released before that
// never starts one) and runs on one goroutine per grant, ended by stop or
// Close.
func (b *Backend) notifyLoss(g driver.Grant, lost func(cause error)) (stop func()) {
	name, named := handleName(g.Handle)
	if !named || b.closed.Load() || g.Token == 0 || g.Owner == "" || driver.ValidateKey(g.Key) != nil {
		// A grant without a Handle names no entry to watch: its loss is
		// found by renewal.
		return func() {}
	}
	w := &lossWatch{b: b, g: g, name: name, lost: lost}
	w.t = time.AfterFunc(lossWatchDelay, w.start)
	return w.stop
}

// lossWatch is one grant's loss notification. Its watch's context is
// made when the watch starts: a grant released sooner costs no context
// (a child of b.ctx, whose registration every grant of the backend would
// share a lock for).
type lossWatch struct {
	b    *Backend
	g    driver.Grant
	name string
	lost func(cause error)
	t    *time.Timer
	done atomic.Bool // lost was called, or stop

	mu      sync.Mutex
	stopped bool
	cancel  context.CancelFunc // of the watch, once started
}

// start runs the watch, unless stop ran or the backend closed first.
func (w *lossWatch) start() {
	b := w.b
	b.mu.Lock()
	w.mu.Lock()
	if w.stopped || b.ctx.Err() != nil { // stopped, or the backend closed
		w.mu.Unlock()
		b.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(b.ctx)
	w.cancel = cancel
	w.mu.Unlock()
	b.wg.Add(1)
	b.mu.Unlock()
	defer b.wg.Done()
	defer cancel()
	b.watchLoss(ctx, b.queuePrefix(w.g.Key)+w.name, int64(w.g.Token), w.fire)
}

// fire reports the entry gone, once, unless stop ran.
func (w *lossWatch) fire() {
	if w.done.CompareAndSwap(false, true) {
		w.b.freeName(w.g.Key, w.name, w.g.Owner) // the entry is gone
		w.lost(driver.ErrNotHeld)
	}
}

func (w *lossWatch) stop() {
	w.done.Store(true)
	w.t.Stop()
	w.mu.Lock()
	w.stopped = true
	if w.cancel != nil {
		w.cancel()
	}
	w.mu.Unlock()
}

func (b *Backend) watchLoss(ctx context.Context, key string, rev int64, fire func()) {
	from := rev + 1
	for range maxWatchRestarts {
		wctx, cancel := context.WithCancel(ctx)
		wch := b.cli.Watch(wctx, key, clientv3.WithRev(from), clientv3.WithFilterPut())
		for resp := range wch {
			if resp.Canceled || resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					cancel()
					fire()
					return
				}
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		// The watch ended (compacted past our revision, or etcd cancelled
		// it): check the entry directly and watch again from now.
		resp, err := b.cli.Get(ctx, key)
		if err != nil {
			return
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision > rev {
			fire()
			return
		}
		from = resp.Header.Revision + 1
	}
}
