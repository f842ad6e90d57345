package zookeeper

import (
	"bytes"
	"context"
	"errors"
	"path"
	"slices"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

// Acquire implements driver.Backend (see acquire); the token offset is
// the one checked in the acquiring transaction itself.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := b.acquire(ctx, req)
	if err != nil {
		return driver.Grant{}, b.tokens().HeldError(ctx, err)
	}
	g, err = b.tokenGrant(ctx, g)
	if err == nil && req.LockDelay > 0 {
		// The grant marks its key for a lock delay (lockdelay.go); a
		// grant whose marker could not be written is not handed out.
		if err = b.putDelay(ctx, req); err != nil {
			if h, ok := parseHandle(g.Handle); ok {
				b.deleteOwn(ctx, h.path)
			}
			return driver.Grant{}, err
		}
	}
	return g, err
}

// tokenGrant maps a new grant's token; if that fails, the grant's znode is
// deleted (leaving nothing behind, as a failed acquire does).
func (b *Backend) tokenGrant(ctx context.Context, g driver.Grant) (driver.Grant, error) {
	t, err := b.token(ctx, int64(g.Token))
	if err != nil {
		if h, ok := parseHandle(g.Handle); ok {
			b.deleteOwn(ctx, h.path)
		}
		return driver.Grant{}, err
	}
	g.Token = t
	return g, nil
}

// acquire is Acquire (floor.go) on native tokens: one attempt. It joins the key's queue
// and, unless it is first, leaves it again and reports the holder.
func (b *Backend) acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.validate(ctx, req); err != nil {
		return driver.Grant{}, err
	}
	if err := b.sweep(ctx); err != nil {
		return driver.Grant{}, err
	}
	parent := b.parent(req.Key)
	if req.LockDelay > 0 {
		if err := b.delayCheck(ctx, req, parent); err != nil {
			return driver.Grant{}, err
		}
	}
	if b.hot.Hot(req.Key) {
		// Contended lately: look before writing, so a contender that
		// will wait anyway costs the server two reads instead of two
		// writes.
		node, data, st, err := b.holder(ctx, parent)
		if err != nil {
			return driver.Grant{}, err
		}
		if owner := ownerOf(data); node != "" && (owner != req.Owner || st.EphemeralOwner != b.conn.SessionID()) {
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Owner: owner, Token: driver.Token(st.Mzxid)}}
		}
	}
	e, err := b.enqueue(ctx, parent, nodeData(req.Owner, req.Metadata))
	if err != nil {
		return driver.Grant{}, err
	}
	node := e.node
	if e.n == 1 {
		// Alone: every earlier holder's znode was deleted before ours was
		// created, so our czxid is above all their tokens.
		return b.grant(req.Key, req.Owner, node, 0, e.czxid), nil
	}
	b.hot.Mark(req.Key)
	for range 5 {
		names, pst, err := b.conn.Children(ctx, parent)
		if err != nil {
			b.deleteOwn(ctx, node)
			return driver.Grant{}, err
		}
		cs := sortChildren(names)
		own := path.Base(node)
		if len(cs) == 0 || !slices.ContainsFunc(cs, func(c child) bool { return c.name == own }) {
			return driver.Grant{}, errors.New("zookeeper: our contender znode vanished (session expired?)")
		}
		if cs[0].name == own {
			// The holder left meanwhile.
			if pst.Aversion == e.aversion {
				return b.acquiredLate(ctx, b.grant(req.Key, req.Owner, node, 0, e.czxid), nil)
			}
			g, err := b.bump(ctx, req, node, 0)
			return b.acquiredLate(ctx, g, err)
		}
		lowest := parent + "/" + cs[0].name
		data, st, err := b.conn.Get(ctx, lowest)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			b.deleteOwn(ctx, node)
			return driver.Grant{}, err
		}
		b.deleteOwn(ctx, node)
		if ownerOf(data) == req.Owner && st.EphemeralOwner == b.conn.SessionID() {
			// A retry of an acquire whose reply was lost: the lock is
			// already ours (bump writes this request's metadata).
			g, err := b.bump(ctx, req, lowest, st.Version)
			return b.acquiredLate(ctx, g, err)
		}
		return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Owner: ownerOf(data), Token: driver.Token(st.Mzxid)}}
	}
	b.deleteOwn(ctx, node)
	return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
}

// Acquire reads before writing for a key found held less than hotFor ago
// (remembering at most maxHot keys). Joining a queue costs two writes (the
// multi, then the delete of a contender that lost), each fsynced by a
// quorum, against two reads served by the connected server; two seconds
// span the engine's first backoff steps for a contended key.
const (
	hotFor = 2 * time.Second
	maxHot = 4096
)

// bump rewrites the holder znode's data (version-checked) with req's owner
// and metadata so that its mzxid, the grant's token, is a fresh zxid:
// higher than every token issued for the key before, including rotated
// ones.
func (b *Backend) bump(ctx context.Context, req driver.AcquireRequest, node string, version int32) (driver.Grant, error) {
	st, err := b.markedSet(ctx, node, nodeData(req.Owner, req.Metadata), version)
	if err != nil {
		if !definiteZK(err) {
			b.deleteOwn(ctx, node)
		}
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
		}
		return driver.Grant{}, err
	}
	return b.grant(req.Key, req.Owner, node, st.Version, st.Mzxid), nil
}

// markedSet rewrites a holder znode (version-checked) with data to give it a
// fresh mzxid: a rotated token, a hand-off token above a rotated one, or new
// metadata (which is therefore a new token too). Then it
// rewrites the parent's ACL (unchanged) to bump the parent's ACL version,
// the key's "a token above some czxid was issued" mark: a contender whose
// predecessors all left compares the parent's ACL version with the one at
// its own creation, and only if it changed does it need a fresh zxid of
// its own (see confirm). The token counts as issued only once both writes
// succeeded, so a crash in between issues nothing.
//
// While the outcome is unknown (no reply, or the mark not yet set), the
// node stays in b.rotating, so that a later Renew or Release of the grant
// (which still names the old version) can finish the job instead of taking
// the lock for lost while its znode lives on.
func (b *Backend) markedSet(ctx context.Context, node string, data []byte, version int32) (*zk.Stat, error) {
	b.setRotating(node, version)
	st, err := b.conn.Set(ctx, node, data, version)
	if err != nil {
		if definiteZK(err) {
			b.clearRotating(node)
		}
		return nil, err
	}
	if err := b.mark(ctx, node); err != nil {
		return nil, err
	}
	b.clearRotating(node)
	return st, nil
}

// keptSet is markedSet keeping the znode's data (its owner and metadata):
// it reads the data, and rewrites it only if the znode still has the given
// version (else zk.ErrBadVersion, nothing written).
func (b *Backend) keptSet(ctx context.Context, node string, version int32) (*zk.Stat, error) {
	data, st, err := b.conn.Get(ctx, node)
	if err != nil {
		return nil, err
	}
	if st.Version != version {
		return nil, zk.ErrBadVersion
	}
	return b.markedSet(ctx, node, data, version)
}

// nodeData is a contender znode's data: the owner, followed, when there is
// metadata, by a NUL byte and the metadata. An owner never contains NUL
// (driver.ValidateOwner), and a znode without metadata holds the owner
// alone, as earlier versions wrote it.
func nodeData(owner string, md []byte) []byte {
	if len(md) == 0 {
		return []byte(owner)
	}
	d := make([]byte, 0, len(owner)+1+len(md))
	d = append(append(append(d, owner...), 0), md...)
	return d
}

// parseData splits a contender znode's data into its owner and metadata
// (nil if none, as in znodes written by earlier versions).
func parseData(data []byte) (owner string, md []byte) {
	o, m, _ := bytes.Cut(data, []byte{0})
	if len(m) == 0 {
		return string(o), nil
	}
	return string(o), append([]byte(nil), m...)
}

// ownerOf returns the owner in a contender znode's data.
func ownerOf(data []byte) string {
	owner, _ := parseData(data)
	return owner
}

func (b *Backend) setRotating(node string, version int32) {
	b.mu.Lock()
	b.rotating[node] = version
	b.mu.Unlock()
}

func (b *Backend) clearRotating(node string) {
	b.mu.Lock()
	delete(b.rotating, node)
	b.mu.Unlock()
}

func (b *Backend) mark(ctx context.Context, node string) error {
	_, err := b.conn.SetACL(ctx, path.Dir(node), b.acl, -1)
	return err
}

func (b *Backend) validate(ctx context.Context, req driver.AcquireRequest) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if err := driver.CheckAcquire(req); err != nil {
		return err
	}
	return nil
}
