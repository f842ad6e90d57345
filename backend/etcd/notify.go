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
	ctx, cancel := context.WithTimeout(b.ctx, b.cleanupTimeout)
	n, err := b.nativeGrant(ctx, g)
	cancel()
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
	var done atomic.Bool
	name, named := handleName(g.Handle)
	if !named || b.closed.Load() || g.Token == 0 || g.Owner == "" || driver.ValidateKey(g.Key) != nil {
		// A grant without a Handle names no entry to watch: its loss is
		// found by renewal.
		return func() { done.Store(true) }
	}
	ctx, cancel := context.WithCancel(b.ctx)
	fire := func() {
		if done.CompareAndSwap(false, true) {
			b.freeName(g.Key, name, g.Owner) // the entry is gone
			lost(driver.ErrNotHeld)
		}
	}
	key, rev := b.queuePrefix(g.Key)+name, int64(g.Token)
	t := time.AfterFunc(lossWatchDelay, func() {
		b.mu.Lock()
		if ctx.Err() != nil { // stopped, or the backend closed
			b.mu.Unlock()
			return
		}
		b.wg.Add(1)
		b.mu.Unlock()
		defer b.wg.Done()
		b.watchLoss(ctx, key, rev, fire)
	})
	return func() {
		done.Store(true)
		t.Stop()
		cancel()
	}
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
