package zookeeper

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// errCleanupPending is what Inspect returns for a key with a contender
// znode of this backend still to be deleted, or to be searched for (a
// create whose reply was lost may be executed later). The engine takes it
// as a failed clean-up and looks again with backoff (see driver), which
// sweeps again: the engine's retries, not a loop in the backend, finish
// the clean-up. Inspect returns it as a *cleanupPendingError, which also
// names why the clean-up is still pending, if an attempt failed.
var errCleanupPending = errors.New("zookeeper: a clean-up of this key's contender znodes is pending")

// cleanupPendingError is errCleanupPending with the failure of the last
// clean-up attempt (a delete or a nonce search that failed, with its
// cause: on a stopped server, the refused connection), nil if none
// failed since the last sweep that went through (a nonce search still
// running). errors.Is matches errCleanupPending and the cause's chain.
type cleanupPendingError struct{ cause error }

func (e *cleanupPendingError) Error() string {
	if e.cause == nil {
		return errCleanupPending.Error()
	}
	return errCleanupPending.Error() + "; the last attempt failed: " + e.cause.Error()
}

func (e *cleanupPendingError) Unwrap() []error {
	if e.cause == nil {
		return []error{errCleanupPending}
	}
	return []error{errCleanupPending, e.cause}
}

// pendingError is Inspect's error for a key whose clean-up is pending.
func (b *Backend) pendingError() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &cleanupPendingError{cause: b.cleanupErr}
}

// Sweep pacing: after a sweep that left work pending, the next one waits
// sweepMinWait, doubling up to sweepMaxWait, so a pending nonce search
// does not cost a read per call; maxSweep bounds the clean-ups of one
// sweep.
const (
	sweepMinWait = 50 * time.Millisecond
	sweepMaxWait = 2 * time.Second
	maxSweep     = 64
)

// orphan is a contender znode that may exist although nobody will use it:
// a create whose reply was lost (nonce set, path unknown) or a delete that
// failed (path set).
type orphan struct {
	parent string
	nonce  string
	path   string
	// until: a create whose reply was lost may still be executed a little
	// later (the server can read the request from the dead connection
	// after the client has reconnected), so a nonce is searched for until
	// a session timeout has passed.
	until time.Time
}

// key is the orphan's name in b.orphans.
func (o orphan) key() string {
	if o.path != "" {
		return o.path
	}
	return "nonce:" + o.nonce
}

// under reports whether the orphan is in the queue of parent.
func (o orphan) under(parent string) bool {
	return o.parent == parent || strings.HasPrefix(o.path, parent+"/")
}

// addOrphan records a pending clean-up; cause is the failure that left it
// (a delete or create whose request failed), or nil (a znode found to be
// nobody's).
func (b *Backend) addOrphan(o orphan, cause error) {
	b.orphans.Add(o.key(), o)
	b.mu.Lock()
	b.nextSweep = time.Time{} // the next call sweeps
	if cause != nil {
		b.cleanupErr = cause
	}
	b.mu.Unlock()
}

// reconnected is called by the event callback of a connection Open made
// each time the client has a session again. Clean-ups that failed while
// it was disconnected (a waiter's queue znode, a lost lease's release, a
// create whose reply was lost) may be what other contenders wait for, and
// nothing else would run them if this client made no further call: it
// sweeps now, at once, in a goroutine of its own (the callback must not
// block go-zookeeper's event loop).
func (b *Backend) reconnected() {
	if b.orphans.Len() == 0 {
		return
	}
	b.sweepSoon()
}

// sweepSoon sweeps at once, in a goroutine of its own, and again at the
// sweep's pace while clean-ups are left, all bounded by floorTimeout: one
// sweep right after a reconnection can fail (the server is still
// settling) or find another sweep running (a Release's, still waiting on
// the server that was down), and a client that makes no further call
// would then never sweep, keeping waiters behind an orphaned znode.
func (b *Backend) sweepSoon() {
	b.mu.Lock() // orders this after Close, as NotifyLoss does
	if b.closed.Load() {
		b.mu.Unlock()
		return
	}
	b.nextSweep = time.Time{}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), b.floorTimeout())
		defer cancel()
		for {
			_ = b.sweep(ctx)
			if b.orphans.Len() == 0 || b.closed.Load() || ctx.Err() != nil {
				return
			}
			b.mu.Lock()
			wait := max(time.Until(b.nextSweep), sweepMinWait)
			b.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-b.done: // Close
				t.Stop()
				return
			case <-t.C:
			}
		}
	}()
}

// sweep tries the pending clean-ups once each. The calls the engine drives
// (Acquire, AcquireWait, Renew, RenewBatch, Release, Inspect) run it
// first, and so does a reconnection (see reconnected); the backend never
// loops or waits to retry (see driver). It costs nothing when nothing is
// pending, and one sweep at a time runs. Its requests are bounded by ctx,
// the caller's: if ctx ends, it stops and returns the error of the request
// it gave up on (the clean-ups stay pending); else it returns nil.
func (b *Backend) sweep(ctx context.Context) error {
	if b.orphans.Len() == 0 || !b.sweeping.CompareAndSwap(false, true) {
		return nil
	}
	defer b.sweeping.Store(false)
	b.mu.Lock()
	early := time.Now().Before(b.nextSweep)
	b.mu.Unlock()
	if early {
		return nil
	}
	left := false
	var failed error
	for k, o := range b.orphans.Batch(maxSweep) {
		if b.closed.Load() {
			return nil
		}
		if err := b.cleanOrphan(ctx, o); err != nil {
			if ctx.Err() != nil {
				return err // pending still; the sweep pacing is unchanged
			}
			left, failed = true, err
			b.log.Warn("zookeeper: could not delete an orphaned contender znode yet; retrying on a later call", "znode", o.path, "parent", o.parent, "err", err)
			continue
		}
		if o.nonce != "" && time.Now().Before(o.until) {
			left = true // look again later
			continue
		}
		b.orphans.Done(k, o)
	}
	b.mu.Lock()
	b.cleanupErr = failed
	if left {
		b.sweepWait = min(max(2*b.sweepWait, sweepMinWait), sweepMaxWait)
		b.nextSweep = time.Now().Add(b.sweepWait)
	} else {
		b.sweepWait = 0
	}
	b.mu.Unlock()
	return nil
}

// cleanOrphan deletes an orphaned znode, or every znode of its nonce.
func (b *Backend) cleanOrphan(ctx context.Context, o orphan) error {
	if o.path != "" {
		if err := b.conn.Delete(ctx, o.path, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		return nil
	}
	names, _, err := b.conn.Children(ctx, o.parent)
	if errors.Is(err, zk.ErrNoNode) {
		err = nil
	}
	for _, n := range names {
		if strings.HasPrefix(n, nodePrefix+o.nonce+seqMarker) {
			if e := b.conn.Delete(ctx, o.parent+"/"+n, -1); e != nil && !errors.Is(e, zk.ErrNoNode) {
				err = e
			}
		}
	}
	return err
}

// pendingUnder reports whether a clean-up in the queue of parent is
// pending.
func (b *Backend) pendingUnder(parent string) bool {
	return b.orphans.Any(func(_ string, o orphan) bool { return o.under(parent) })
}
