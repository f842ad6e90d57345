package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

// AcquireWait implements driver.Waiter (see acquireWait). The token of a
// waiter's grant is provisional, as before: the confirming Renew applies
// the floor (handOff).
func (b *Backend) AcquireWait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if req.LockDelay > 0 && req.LockDelay <= driver.MaxTTL {
		// The head of a queue holds the key at once, delay or not: with a
		// lock delay, one attempt instead (see lockdelay.go).
		return b.Acquire(ctx, req)
	}
	g, err := b.acquireWait(ctx, req)
	if err != nil {
		return driver.Grant{}, b.tokens().HeldError(ctx, err)
	}
	return b.tokenGrant(ctx, g)
}

// acquireWait is AcquireWait (floor.go) on native tokens: it joins the key's queue and
// waits, FIFO, watching only its immediate predecessor (no herd effect:
// a release wakes exactly one waiter). When its predecessor was the lowest
// znode at the last listing, the predecessor's deletion alone proves this
// contender is first, so the hand-off costs no further read.
//
// The returned grant's token is provisional (the znode's czxid, which a
// predecessor's rotated token may exceed); the engine's confirming Renew
// settles it in one read, or gives the znode a fresh zxid if some token
// above the czxid was issued meanwhile (see confirm). Callers outside the
// engine must Renew before using the token.
//
// When ctx ends first, the queue znode is deleted before AcquireWait
// returns ctx's error (that delete waits at most answerGrace for its
// answer; if the server does not answer, a later call deletes it: see
// sweep).
func (b *Backend) acquireWait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.validate(ctx, req); err != nil {
		return driver.Grant{}, err
	}
	if err := b.sweep(ctx); err != nil {
		return driver.Grant{}, err
	}
	parent := b.parent(req.Key)
	e, err := b.enqueue(ctx, parent, nodeData(req.Owner, req.Metadata))
	if err != nil {
		return driver.Grant{}, err
	}
	if e.n == 1 {
		return b.grant(req.Key, req.Owner, e.node, 0, e.czxid), nil
	}
	if err := b.waitFirst(ctx, parent, e.node); err != nil {
		return driver.Grant{}, err
	}
	g := b.grant(req.Key, req.Owner, e.node, 0, e.czxid)
	g.Handle = handle{token: e.czxid, tag: ownerTag(req.Owner), path: e.node, unconfirmed: true, aversion: e.aversion}.String()
	return g, nil
}

// errVanished is what a waiter gets when its own queue znode is gone.
var errVanished = errors.New("zookeeper: our queue znode vanished (session expired?)")

// waitFirst waits until node, a contender znode under parent, is the first
// of its queue, watching only its immediate predecessor. On an error other
// than errVanished it has deleted node (or left it to a later sweep or to
// the end of the session).
func (b *Backend) waitFirst(ctx context.Context, parent, node string) error {
	own := path.Base(node)
	pred, predLowest := "", false
	// The watch on the predecessor is what wakes the waiter: its deletion
	// or change, or the session's end (EventNotWatching). Across a
	// reconnection the session keeps its watches (go-zookeeper sets them
	// again; the server fires those whose znodes changed meanwhile). The
	// queue is also re-read every recheckEvery, as a defence against a
	// missed event; the stall after a server died that it was once meant
	// to cure was a handshake go-zookeeper waited on for 6⅔ session
	// timeouts with this waiter's calls queued behind it (see
	// dialer.handshakeTimeout).
	recheck := time.NewTimer(b.recheckEvery())
	defer recheck.Stop()
	for {
		if pred == "" {
			if err := ctx.Err(); err != nil {
				b.deleteOwn(ctx, node)
				return err
			}
			p, lowest, err := b.predecessor(ctx, parent, own)
			switch {
			case errors.Is(err, errVanished):
				return err
			case err != nil:
				b.deleteOwn(ctx, node)
				return err
			case p == "":
				return nil
			}
			pred, predLowest = p, lowest
		}
		_, _, ch, err := b.conn.GetW(ctx, pred)
		if errors.Is(err, zk.ErrNoNode) {
			if predLowest {
				return nil
			}
			pred = ""
			continue
		}
		if err != nil {
			b.deleteOwn(ctx, node)
			return err
		}
		select {
		case ev := <-ch:
			b.wakeups.Add(1)
			switch ev.Type {
			case zk.EventNodeDeleted:
				if predLowest {
					return nil
				}
				pred = ""
			case zk.EventNodeDataChanged:
				// The predecessor rotated its token: watch it again.
			default:
				// Not watching any more: the session expired or the
				// connection closed.
				b.deleteOwn(ctx, node)
				if b.closed.Load() {
					return driver.ErrClosed
				}
				return fmt.Errorf("zookeeper: waiting for %s: %w", pred, ev.Err)
			}
		case <-recheck.C:
			b.rechecks.Add(1)
			_ = b.sweep(ctx) // our own orphan may be ahead of us in the queue
			pred = ""
			recheck.Reset(b.recheckEvery())
		case <-ctx.Done():
			b.deleteOwn(ctx, node)
			return ctx.Err()
		case <-b.done:
			if !b.owned {
				b.deleteOwn(ctx, node) // the caller's connection, and session, live on
			}
			return driver.ErrClosed
		}
	}
}

// predecessor lists parent's queue and returns the contender znode just
// before own ("" if own is first) and whether that one is the lowest; it
// returns errVanished if own is not in the queue.
func (b *Backend) predecessor(ctx context.Context, parent, own string) (pred string, lowest bool, err error) {
	b.lists.Add(1)
	names, _, err := b.conn.Children(ctx, parent)
	if err != nil {
		return "", false, err
	}
	cs := sortChildren(names)
	switch idx := slices.IndexFunc(cs, func(c child) bool { return c.name == own }); idx {
	case -1:
		return "", false, errVanished
	case 0:
		return "", false, nil
	default:
		return parent + "/" + cs[idx-1].name, idx == 1, nil
	}
}

// recheckEvery is how often a waiter re-reads its queue besides its watch
// (a defence, see waitFirst): the session timeout (at least 500ms), the
// time within which the store itself would notice a vanished holder.
func (b *Backend) recheckEvery() time.Duration {
	return max(b.SessionTimeout(), 500*time.Millisecond)
}

// confirm turns an AcquireWait grant into a held one in one read: the
// parent's children (our znode must be the lowest, which also proves the
// session alive) and Stat. Our czxid is above every token issued for the
// key before our znode was created; a token issued later can only come from
// a rotation or a hand-off of a predecessor, and every such write bumps the
// parent's ACL version first (markedSet). So if the ACL version is the one
// we saw at creation, the czxid is the token; otherwise we take a fresh
// zxid the same way.
func (b *Backend) confirm(ctx context.Context, g driver.Grant, h handle) (driver.Grant, error) {
	names, pst, err := b.conn.Children(ctx, path.Dir(h.path))
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return driver.Grant{}, driver.ErrNotHeld
	case err != nil:
		return driver.Grant{}, err
	}
	cs := sortChildren(names)
	if len(cs) == 0 || cs[0].name != path.Base(h.path) {
		return driver.Grant{}, driver.ErrNotHeld
	}
	if pst.Aversion == h.aversion {
		return b.grant(g.Key, g.Owner, h.path, 0, h.token), nil
	}
	st, err := b.keptSet(ctx, h.path, 0)
	switch {
	case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
		return driver.Grant{}, driver.ErrNotHeld
	case err != nil:
		return driver.Grant{}, err
	}
	return b.grant(g.Key, g.Owner, h.path, st.Version, st.Mzxid), nil
}
