package zookeeper

import (
	"bytes"
	"context"
	"errors"
	"path"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencelock/fencelock/driver"
)

// Lock delay (driver.AcquireRequest.LockDelay). A lock znode is ephemeral:
// nothing of it outlives its session to say when it ended. A grant with a
// lock delay therefore also writes the key's persistent marker,
//
//	ROOT/%lockdelay/ESCAPED-KEY    data: the owner [NUL "seen"]
//
// and its release deletes it (after the lock znode; a force-release too).
// An acquire with a lock delay that finds the marker of another owner and
// an empty queue knows the holder ended without a release, but not when:
// it marks the marker seen (a write, whose mtime is the server's time of
// the first sighting) and the key stays refused until the delay has passed
// since then, judged by the server's clock (the mtime of a write to the
// marker's directory); the acquire that finds it passed deletes the marker
// and goes on. The delay so counts from the first sighting after the end,
// at or after the end: conservative. An acquire without a lock delay
// ignores the marker. With a lock delay, AcquireWait makes one attempt (as
// Acquire) instead of queueing: the head of a queue holds at once.
//
// The directory's name cannot be produced by escapeKey ("%lo" is not an
// escape), so List skips it.

const delayDir = "%lockdelay"

var seenMark = []byte("\x00seen")

func (b *Backend) delayRoot() string { return path.Join(b.root, delayDir) }

func (b *Backend) delayPath(key string) string { return path.Join(b.delayRoot(), escapeKey(key)) }

// delayOwner returns the owner a marker names and whether it was seen
// ended.
func delayOwner(data []byte) (string, bool) {
	o, rest, _ := bytes.Cut(data, []byte{0})
	return string(o), bytes.Equal(rest, seenMark[1:])
}

// delayed records the grants of this backend that wrote a marker (key and
// owner), so that their release deletes it.
type delayed struct {
	mu sync.Mutex
	m  map[string]bool
}

func delayedID(key, owner string) string { return key + "\x00" + owner }

func (d *delayed) set(key, owner string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = make(map[string]bool)
	}
	d.m[delayedID(key, owner)] = true
}

// take reports whether key's grant of owner wrote a marker, and forgets it.
func (d *delayed) take(key, owner string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	ok := d.m[delayedID(key, owner)]
	delete(d.m, delayedID(key, owner))
	return ok
}

// delayCheck refuses an acquire with a lock delay while key's last holder
// ended without a release less than the delay ago (see above). nil means:
// go on and try.
func (b *Backend) delayCheck(ctx context.Context, req driver.AcquireRequest, parent string) error {
	dp := b.delayPath(req.Key)
	data, st, err := b.conn.Get(ctx, dp)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	owner, seen := delayOwner(data)
	if owner == req.Owner {
		return nil // ours: a retry
	}
	names, _, err := b.conn.Children(ctx, parent)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	if len(names) > 0 {
		return nil // held or queued: the attempt reports the holder
	}
	if !seen {
		_, err := b.conn.Set(ctx, dp, append([]byte(owner), seenMark...), st.Version)
		if err != nil && !errors.Is(err, zk.ErrBadVersion) && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
		// Seen now (or changed meanwhile: look again soon).
		return &driver.HeldError{Holder: driver.Info{Key: req.Key}, LockDelay: req.LockDelay}
	}
	now, err := b.conn.Set(ctx, b.delayRoot(), nil, -1)
	if err != nil {
		return err
	}
	if left := time.UnixMilli(st.Mtime).Add(req.LockDelay).Sub(time.UnixMilli(now.Mtime)); left > 0 {
		return &driver.HeldError{Holder: driver.Info{Key: req.Key}, LockDelay: left}
	}
	if err := b.conn.Delete(ctx, dp, st.Version); err != nil && !errors.Is(err, zk.ErrBadVersion) && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	return nil
}

// putDelay writes the marker of req's grant (see above), over any earlier
// one: the grant is the holder.
func (b *Backend) putDelay(ctx context.Context, req driver.AcquireRequest) error {
	dp := b.delayPath(req.Key)
	for range 3 {
		_, err := b.conn.Create(ctx, dp, []byte(req.Owner), zk.FlagPersistent, b.acl)
		switch {
		case err == nil:
			b.delays.set(req.Key, req.Owner)
			return nil
		case errors.Is(err, zk.ErrNodeExists):
			if _, err := b.conn.Set(ctx, dp, []byte(req.Owner), -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return err
			} else if err == nil {
				b.delays.set(req.Key, req.Owner)
				return nil
			}
		case errors.Is(err, zk.ErrNoNode):
			if err := b.ensurePath(ctx, b.delayRoot()); err != nil {
				return err
			}
		default:
			return err
		}
	}
	return errors.New("zookeeper: the lock-delay marker kept changing while it was written")
}

// dropDelay deletes key's marker if owner's grant wrote it (a release),
// or whoever's it is (any, a force-release). A failure leaves it: the
// next acquire with a lock delay then waits the delay, conservatively.
func (b *Backend) dropDelay(ctx context.Context, key, owner string, any bool) {
	if !b.delays.take(key, owner) && !any {
		return
	}
	dp := b.delayPath(key)
	for range 3 {
		data, st, err := b.conn.Get(ctx, dp)
		if err != nil {
			return
		}
		if o, _ := delayOwner(data); !any && o != owner {
			return
		}
		if err := b.conn.Delete(ctx, dp, st.Version); !errors.Is(err, zk.ErrBadVersion) {
			return
		}
	}
}
