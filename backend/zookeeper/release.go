package zookeeper

import (
	"context"
	"errors"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

// Release implements driver.Backend (see release).
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	n, err := b.nativeGrant(ctx, g)
	if err != nil {
		return err
	}
	return b.release(ctx, n)
}

// release is Release (floor.go) on native tokens: it deletes the grant's own znode,
// version-checked, and nothing else. If it fails, the znode is left to
// the sweep.
func (b *Backend) release(ctx context.Context, g driver.Grant) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	// A sweep that ctx ended does not stop the release: its delete is
	// then not sent, and the znode is left to a later sweep (below).
	serr := b.sweep(ctx)
	h, ok, err := b.ownHandle(ctx, g)
	if err != nil {
		return cmpOr(serr, err)
	}
	if !ok {
		return driver.ErrNotHeld
	}
	if h.unconfirmed {
		h.version = -1 // the path is this grant's alone
	}
	b.mu.Lock()
	from, amb := b.rotating[h.path]
	b.mu.Unlock()
	err = b.conn.Delete(ctx, h.path, h.version)
	if errors.Is(err, zk.ErrBadVersion) && amb && from == h.version {
		err = b.conn.Delete(ctx, h.path, h.version+1) // our rotation did go through
	}
	switch {
	case err == nil:
		if amb {
			b.mu.Lock()
			delete(b.rotating, h.path)
			b.mu.Unlock()
		}
		b.dropDelay(ctx, g.Key, g.Owner, false) // released: no lock delay
		return nil
	case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
		b.delays.take(g.Key, g.Owner) // not ours: its marker runs its delay
		return driver.ErrNotHeld
	}
	// Not sent (zk.ErrNoServer), not connected, or the reply was lost: the
	// caller gave the lock up, but a session that survives its
	// reconnection would keep the znode, and the key held, as long as this
	// client lives (the engine tries a lost lease's release only once).
	// The sweep deletes it, at the latest once the client has a session
	// again (see reconnected).
	b.addOrphan(orphan{path: h.path}, err)
	return cmpOr(serr, err)
}

// ForceRelease implements driver.ForceReleaser (see forceRelease).
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	info, err := b.forceRelease(ctx, key)
	if err != nil {
		return driver.Info{}, err
	}
	return b.tokens().Info(ctx, info)
}

// forceRelease is ForceRelease (floor.go) on native tokens: it deletes the key's
// current holder znode. The holder's NotifyLoss watch fires at once; the
// next contender in the queue becomes the holder with a higher token.
func (b *Backend) forceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	for range 5 {
		node, data, st, err := b.holder(ctx, b.parent(key))
		if err != nil || node == "" {
			return driver.Info{Key: key}, err
		}
		err = b.conn.Delete(ctx, node, st.Version)
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			continue
		}
		if err != nil {
			return driver.Info{}, err
		}
		owner, md := parseData(data)
		b.dropDelay(ctx, key, owner, true) // a forced release frees at once
		return driver.Info{Key: key, Owner: owner, Token: driver.Token(st.Mzxid), Metadata: md}, nil
	}
	return driver.Info{}, errors.New("zookeeper: the lock's holder kept changing during ForceRelease")
}
