package etcd

import (
	"context"
	"errors"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// Lock delay (driver.AcquireRequest.LockDelay). An entry lives exactly as
// long as its lease, so nothing of it outlives an unreleased end. A grant
// with a lock delay therefore also puts the key's delay marker,
//
//	PREFIX + escape(key) + "\x00delay"   value: the owner
//
// on a lease of its own whose TTL is the delay plus 4/3 of the entry's
// TTL (whole seconds, rounded up). The grant's renewals keep that lease
// alive after they have confirmed the entry (at most a renewal interval,
// a third of the TTL, after the entry's lease was last kept alive), and
// its release deletes the marker with the entry, in one transaction. When
// the holder crashes or loses its lease, nothing keeps the marker's lease
// alive: it outlives the entry by at least the delay, by etcd's clock,
// and an acquire with a lock delay is refused while it exists and the
// queue is empty. The key has no '/' after the escaped key, so List and
// the queue's prefix reads never see it; a key never contains NUL, so no
// other key's name ends so.
//
// Since etcd's leases count whole seconds and the marker's lease is kept
// alive by renewals rather than at the entry's own keep-alives, the gap
// can be longer than the delay by up to about 4/3 of the TTL plus a
// second: conservative, never shorter. An acquire whose LockDelay is 0
// ignores the marker. With a lock delay, AcquireWait makes one attempt
// (as Acquire) instead of queueing: the engine then waits by polling,
// woken when the delay ends.

const delaySuffix = "\x00delay"

// errDelayMoved is the transient error of a same-owner acquire whose entry
// moved while its lock-delay marker was being put: the engine retries.
var errDelayMoved = errors.New("etcd: the entry moved while its lock-delay marker was put; retry")

// delayKey returns key's lock-delay marker.
func (b *Backend) delayKey(key string) string { return b.prefix + escape(key) + delaySuffix }

// delayTTL is the TTL, in whole seconds, of the marker's lease of a grant
// of ttl with lock delay d.
func delayTTL(ttl, d time.Duration) int64 {
	sec := (ttl + time.Second - 1) / time.Second * time.Second // the entry's lease TTL
	t := d + sec + sec/3
	return int64((t + time.Second - 1) / time.Second)
}

// delays maps a grant (key and owner) to its marker's lease, which its
// renewals keep alive.
type delays struct {
	mu sync.Mutex
	m  map[string]clientv3.LeaseID
}

func delayID(key, owner string) string { return key + "\x00" + owner }

func (d *delays) set(key, owner string, id clientv3.LeaseID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = make(map[string]clientv3.LeaseID)
	}
	d.m[delayID(key, owner)] = id
}

func (d *delays) get(key, owner string) (clientv3.LeaseID, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	id, ok := d.m[delayID(key, owner)]
	return id, ok
}

func (d *delays) drop(key, owner string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.m, delayID(key, owner))
}

// delayCheck reads key's queue head and marker before an acquire with a
// lock delay: a holder of another owner, or a marker with an empty queue,
// is a refusal (the latter with the rest of the marker's lease as the
// HeldError's LockDelay). nil means: go on and try.
func (b *Backend) delayCheck(ctx context.Context, req driver.AcquireRequest, qp string) error {
	resp, err := b.cli.Txn(ctx).Then(clientv3.OpGet(qp, clientv3.WithFirstCreate()...), clientv3.OpGet(b.delayKey(req.Key))).Commit()
	if err != nil {
		return err
	}
	head, marker := firstOf(resp, 0), firstOf(resp, 1)
	switch {
	case head != nil && ownerOf(head) != req.Owner:
		return &driver.HeldError{Holder: holderInfo(req.Key, head)}
	case head != nil || marker == nil || string(marker.Value) == req.Owner:
		return nil
	}
	left := time.Duration(0)
	if marker.Lease != 0 {
		ttl, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(marker.Lease))
		if err != nil {
			return err
		}
		left = time.Duration(ttl.TTL) * time.Second
	}
	// etcd reports whole seconds, rounded down: poll again soon after.
	return &driver.HeldError{Holder: driver.Info{Key: req.Key}, LockDelay: max(left, 100*time.Millisecond)}
}

// keepDelay keeps the marker of g (a grant its renewal has just
// confirmed) alive. A marker lease that is gone (renewals stalled past its
// TTL, longer than the entry's own) is forgotten.
func (b *Backend) keepDelay(ctx context.Context, g driver.Grant) error {
	id, ok := b.delays.get(g.Key, g.Owner)
	if !ok {
		return nil
	}
	_, err := b.cli.KeepAliveOnce(ctx, id)
	if !isLeaseNotFound(err) {
		return err
	}
	b.delays.drop(g.Key, g.Owner)
	return nil
}

// delayOps are the operations a release of owner's entry adds to its
// transaction: the key's marker, if it is owner's, goes with the entry.
func (b *Backend) delayOps(key, owner string) []clientv3.Op {
	k := b.delayKey(key)
	return []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "=", owner)}, []clientv3.Op{clientv3.OpDelete(k)}, nil)}
}
