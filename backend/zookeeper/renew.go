package zookeeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

// Renew implements driver.Backend (see renew).
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	return b.tokens().Renew(ctx, g, req, b.renew)
}

// renew is Renew (floor.go) on native tokens. The lock lives as long as the session,
// so a renewal proves two things in one round trip: the session is alive
// (the server answered on it) and the znode is still ours (same version and
// zxid, owned by this session). With Rotate it rewrites the znode's data,
// version-checked, and the new mzxid is the new token. With SetMetadata it
// rewrites the data the same way with the new metadata (unless the znode
// already has it), so setting metadata also issues a new token; the
// version check makes a takeover in between fail with ErrNotHeld. Either
// way the znode is read with Get instead of Exists (still one round trip),
// so that a rotation writes back the data it found, metadata included.
func (b *Backend) renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	if err := b.sweep(ctx); err != nil {
		return driver.Grant{}, err
	}
	h, ok, err := b.ownHandle(ctx, g)
	if err != nil {
		return driver.Grant{}, err
	}
	if !ok {
		return driver.Grant{}, driver.ErrNotHeld
	}
	if h.unconfirmed {
		synced := b.startSync(ctx) // pipelined with confirm's read
		cg, err := b.confirm(ctx, g, h)
		cg, err = b.confirmedLate(ctx, synced, cg, err)
		if err != nil || !req.SetMetadata {
			return cg, err
		}
		// Confirmed: now set the metadata as for any held grant.
		return b.renew(ctx, cg, driver.RenewRequest{TTL: req.TTL, SetMetadata: true, Metadata: req.Metadata})
	}
	var (
		exists = true
		data   []byte
		st     *zk.Stat
	)
	// A renewal that writes nothing confirms with the leader (see
	// confirmedTTL); a rotation's write goes through the leader anyway.
	synced := func() error { return nil }
	if !req.Rotate {
		synced = b.startSync(ctx)
	}
	if req.Rotate || req.SetMetadata {
		data, st, err = b.conn.Get(ctx, h.path)
		if errors.Is(err, zk.ErrNoNode) {
			exists, err = false, nil
		}
	} else {
		exists, st, err = b.conn.Exists(ctx, h.path)
	}
	if serr := synced(); err == nil && serr != nil {
		err = fmt.Errorf("zookeeper: renew: the server could not confirm the session with its leader (sync): %w", serr)
	}
	if err != nil {
		return driver.Grant{}, err
	}
	sid := b.conn.SessionID()
	if !exists || st.EphemeralOwner != sid {
		return driver.Grant{}, driver.ErrNotHeld
	}
	if st.Version != h.version || st.Mzxid != h.token {
		// A rotation of ours whose reply was lost may have gone through.
		b.mu.Lock()
		from, amb := b.rotating[h.path]
		b.mu.Unlock()
		if !amb || from != h.version || st.Version != h.version+1 {
			return driver.Grant{}, driver.ErrNotHeld
		}
		if err := b.mark(ctx, h.path); err != nil {
			return driver.Grant{}, err
		}
		h.version, h.token = st.Version, st.Mzxid
	}
	b.clearRotating(h.path)
	if req.SetMetadata {
		if nd := nodeData(g.Owner, req.Metadata); !bytes.Equal(nd, data) {
			data = nd
			req.Rotate = true // a write, and so a new token
		}
	}
	if !req.Rotate {
		return b.grant(g.Key, g.Owner, h.path, h.version, h.token), nil
	}
	st, err = b.markedSet(ctx, h.path, data, h.version)
	if err != nil {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return driver.Grant{}, driver.ErrNotHeld
		}
		return driver.Grant{}, err
	}
	return b.grant(g.Key, g.Owner, h.path, st.Version, st.Mzxid), nil
}

// confirmedTTL is the validity a grant reports (Grant.Valid): a third of
// the session timeout, counted from the start of the request that
// confirmed it. Its Grant.TTL stays the session timeout, which is how long
// the leader keeps a crashed holder's znode. The leader alone expires sessions, from the touches its followers
// relay, while a follower cut off from the leader still answers its
// clients (pings and reads) until it gives up on the leader, after
// syncLimit × tickTime, which may be longer than the session timeout. So
// an answer proves nothing about the leader's clock unless it passed
// through the leader: every renewal either writes (a rotation) or sends a
// sync, pipelined with its read, and fails if that does not come back.
// Once it does, started at s, the follower was in touch with the leader
// after s, and had been since the client's last touch before
// s − tickTime/2 (the leader pings its followers every tickTime/2, and a
// follower that loses its leader drops its clients' connections); the
// client touches the server at least every third of the session timeout
// T (go-zookeeper's ping interval), and a tickTime is at most T/2 (a
// session is negotiated between 2 and 20 tickTimes unless the server is
// configured otherwise). So the leader heard of the session after
// s − T/3 − T/4, and a further T/12 covers delivery and scheduling:
// the leader expires the session no earlier than s + T/3. (A session
// just created or moved to another server was touched by the leader
// itself after s − T/3 − T/4, which gives the same bound.)
func (b *Backend) confirmedTTL() time.Duration { return b.SessionTimeout() / 3 }
