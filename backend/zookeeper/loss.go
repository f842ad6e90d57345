package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

// Causes passed to a LossNotifier's lost callback. Both match
// driver.ErrNotHeld; the second also matches zk.ErrSessionExpired.
var (
	errZnodeDeleted   = fmt.Errorf("%w: the lock's znode was deleted", driver.ErrNotHeld)
	errSessionExpired = fmt.Errorf("%w: %w", driver.ErrNotHeld, zk.ErrSessionExpired)
	errConnClosed     = fmt.Errorf("%w: the ZooKeeper connection was closed, ending its session", driver.ErrNotHeld)
)

// nodeWatch is the state of a loss watch on one znode, for RenewBatch.
type nodeWatch struct {
	events  int   // events seen for the path (counted by the event callback)
	armed   bool  // a watch is set and no event has come since
	version int32 // the znode's Stat when the watch was set
	mzxid   int64
}

// nodeEvent is called by go-zookeeper's event callback, synchronously in
// its receive loop, for every watch event (and every watch dropped on
// session expiry or close): before any later reply is delivered.
func (b *Backend) nodeEvent(p string) {
	b.mu.Lock()
	if w := b.watched[p]; w != nil {
		w.events++
		w.armed = false
	}
	b.mu.Unlock()
}

type lossWatch struct {
	fired    atomic.Bool // lost started, or stop called
	stopCh   chan struct{}
	stopOnce sync.Once
}

// NotifyLoss implements driver.LossNotifier (see notifyLoss). A grant
// without a handle whose token no zxid maps to is reported lost at once.
func (b *Backend) NotifyLoss(g driver.Grant, lost func(cause error)) (stop func()) {
	if _, ok := parseHandle(g.Handle); ok {
		return b.notifyLoss(g, lost) // watches the handle's znode
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.floorTimeout())
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

// notifyLoss is NotifyLoss (floor.go) on native tokens. A goroutine watches the
// grant's znode (a data watch, armed lossWatchDelay after the grant): its
// deletion (force-release, or the session's end) or the session's expiry
// reported by go-zookeeper calls lost at once, for every lease of the
// session together. A disconnection alone does not: the session may
// survive it, and the engine's local validity covers the gap.
func (b *Backend) notifyLoss(g driver.Grant, lost func(cause error)) (stop func()) {
	w := &lossWatch{stopCh: make(chan struct{})}
	stop = func() {
		w.fired.Store(true)
		w.stopOnce.Do(func() { close(w.stopCh) })
	}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return stop
	}
	b.wg.Add(1)
	b.mu.Unlock()
	fire := func(cause error) {
		if w.fired.CompareAndSwap(false, true) {
			lost(cause)
		}
	}
	go func() {
		defer b.wg.Done()
		if !b.sleep(w.stopCh, lossWatchDelay) {
			return
		}
		// The watch's requests end with stop or Close.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-w.stopCh:
			case <-b.done:
			case <-ctx.Done():
			}
			cancel()
		}()
		h, ok := parseHandle(g.Handle)
		if !ok {
			var err error
			if h, ok, err = b.lookup(ctx, g); err == nil && !ok {
				fire(errZnodeDeleted)
				return
			} else if err != nil {
				return // the engine's renewals will tell
			}
		}
		nw := &nodeWatch{}
		b.mu.Lock()
		b.watched[h.path] = nw
		b.mu.Unlock()
		defer func() {
			b.mu.Lock()
			if b.watched[h.path] == nw {
				delete(b.watched, h.path)
			}
			b.mu.Unlock()
		}()
		backoff := 50 * time.Millisecond
		for {
			b.mu.Lock()
			ev0 := nw.events
			b.mu.Unlock()
			_, st, ch, err := b.conn.GetW(ctx, h.path)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				fire(errZnodeDeleted)
				return
			case err != nil:
				// Not connected: try again; the session may well survive.
				if !b.sleep(w.stopCh, backoff) {
					return
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			backoff = 50 * time.Millisecond
			b.mu.Lock()
			// Armed only if no event for the path came in meanwhile: one
			// could concern the watch just set.
			nw.armed, nw.version, nw.mzxid = nw.events == ev0, st.Version, st.Mzxid
			b.mu.Unlock()
			select {
			case ev := <-ch:
				switch {
				case ev.Type == zk.EventNodeDeleted:
					fire(errZnodeDeleted)
					return
				case ev.Type == zk.EventNotWatching && errors.Is(ev.Err, zk.ErrSessionExpired):
					fire(errSessionExpired)
					return
				case ev.Type == zk.EventNotWatching:
					if !b.closed.Load() {
						fire(errConnClosed)
					}
					return
				}
				// Data changed (a rotation): watch again.
			case <-w.stopCh:
				return
			case <-b.done:
				return
			}
		}
	}()
	return stop
}

// sleep waits d; it reports false if stop or Close came first.
func (b *Backend) sleep(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	case <-b.done:
		return false
	}
}

// lossWatchDelay is how long after a grant NotifyLoss arms its watch on the
// holder's znode. Most short leases end before it and never cost the
// server a watch; a loss that happens earlier is found when the watch is
// armed (the znode is already gone), so detection is late by at most this.
const lossWatchDelay = 50 * time.Millisecond
