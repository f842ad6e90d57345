package etcd

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// errQueueEntryGone reports that a waiter's own entry disappeared while it
// waited (its lease expired or it was deleted from outside).
var errQueueEntryGone = errors.New("etcd: queue entry removed while waiting")

// errNamesTaken reports that every entry name a waiter tried was taken by
// another owner's entry (left by failed releases of this backend).
var errNamesTaken = errors.New("etcd: entry names taken by stale entries")

// AcquireWait implements driver.Waiter (see acquireWait). If the floor was
// raised after the waiter queued, its entry is re-put (bump) before the
// grant is returned, so that its token is above the floor.
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
	resp, _, err := b.readFloor(ctx)
	if err == nil && len(resp.Kvs) > 0 && resp.Kvs[0].ModRevision > int64(g.Token) {
		var tok driver.Token
		name, _ := handleName(g.Handle) // acquireWait's grants carry it
		if tok, err = b.bump(ctx, req.Key, b.queuePrefix(req.Key)+name, entryValue(req.Owner, req.Metadata), int64(g.Token)); err == nil {
			g.Token = tok
		}
	}
	if err == nil {
		g.Token, err = b.token(ctx, int64(g.Token))
	}
	if err != nil {
		// Leave no entry behind (as acquireWait does on failure).
		cctx, cancel := context.WithTimeout(context.Background(), b.cleanupTimeout)
		_ = b.release(cctx, g)
		cancel()
		return driver.Grant{}, err
	}
	return g, nil
}

// acquireWait is AcquireWait on native tokens (mod revisions; floor.go maps them to the tokens callers see) with a FIFO queue ordered by create
// revision, like concurrency.Mutex, but with watches that etcd registers as
// "synced":
//
//  1. One transaction puts the owner's entry (unless it exists) and reads
//     the queue's newest entries, which gives the entries older than ours.
//  2. With at most knownPreds older entries, the waiter knows all of them
//     (none can be created later) and watches the queue for their
//     deletions: it is at the head once all are gone, with no further
//     read. Further back, it watches its predecessor and reads the queue
//     again when that one is deleted.
//  3. Watches start at the current revision (a watch started at an older
//     revision would be "unsynced" and caught up only every 100ms); if
//     anything was written between the read and the watch's creation, the
//     waiter reads again what is left.
//
// While it waits, it keeps the backend's lease alive every third of its
// TTL. When ctx ends (or the wait fails, or the backend is closed) it
// deletes its entry with a fresh context bounded by
// Options.CleanupTimeout.
func (b *Backend) acquireWait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.checkRequest(req); err != nil {
		return driver.Grant{}, err
	}
	// End the wait when the backend closes, too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(b.ctx, cancel)
	defer stop()

	s := b.session(req.TTL)
	w := &waiter{b: b, s: s, key: req.Key, owner: req.Owner, qp: b.queuePrefix(req.Key)}
	w.slot(false)
	g, err := w.wait(ctx, req)
	// The spare slots go back, and on failure ours too, whatever the
	// clean-up below achieves: a retry by the same owner finds an entry
	// left behind among the backend's entries (enqueue), not by its name.
	for _, i := range w.spare {
		b.slots.free(req.Key, i, req.Owner)
	}
	if err == nil {
		return g, nil
	}
	b.slots.free(req.Key, w.cur, req.Owner)
	switch {
	case b.closed.Load() && !b.cleanClose.Load():
		// Not closed but crashed (a test's crash): a dead process
		// deletes nothing; the entry goes with its lease.
	case w.rev != 0:
		b.dropEntry(w.me, w.mod)
	case w.sent != 0:
		// The put's outcome is unknown: delete the entry if it is ours
		// (its owner is in the value; the lease tells it is this
		// attempt's).
		cctx, ccancel := context.WithTimeout(context.Background(), b.cleanupTimeout)
		_, _ = b.cli.Txn(cctx).
			If(append(ownedBy(w.me, req.Owner), clientv3.Compare(clientv3.LeaseValue(w.me), "=", w.sent))...).
			Then(clientv3.OpDelete(w.me)).
			Commit()
		ccancel()
	}
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	return driver.Grant{}, err
}

type waiter struct {
	b     *Backend
	s     *session
	key   string
	owner string
	qp    string
	cur   int              // the slot of our entry's name; -1 if not ours to reserve
	spare []int            // slots given up on the way (freed at the end)
	me    string           // our entry: qp + the slot's name
	rev   int64            // our entry's create revision (queue order), once put
	mod   int64            // its mod revision (token)
	lease clientv3.LeaseID // the lease our entry is attached to
	sent  clientv3.LeaseID // the lease of a put whose outcome is unknown
}

// slot reserves the name of our entry: the slot this owner holds, if any
// (an earlier attempt's), else a free one; with another, one that this
// owner does not hold yet (the current one is taken by another owner's
// entry).
func (w *waiter) slot(another bool) {
	if another {
		w.spare = append(w.spare, w.cur)
		w.cur = w.b.slots.takeNew(w.key, w.owner)
	} else {
		w.cur = w.b.slots.take(w.key, w.owner)
	}
	w.me = w.qp + w.b.slotName(w.cur)
}

// adopt makes kv, an entry of our owner left by an earlier attempt, our
// entry: its name's slot is reserved for us if no other owner holds it.
func (w *waiter) adopt(kv *mvccpb.KeyValue) {
	w.spare = append(w.spare, w.cur)
	w.me, w.cur = string(kv.Key), -1
	if i, ok := w.b.slotOf(nameIn(w.qp, w.me)); ok && w.b.slots.claim(w.key, i, w.owner) {
		w.cur = i
	}
}

// maxOwn bounds how many of the backend's own entries of a queue a
// waiter reads (the oldest first) to find one an earlier attempt of its
// owner left.
const maxOwn = 128

// ownEntries reads the backend's own entries of the queue, oldest first.
func (w *waiter) ownEntries() clientv3.Op {
	return clientv3.OpGet(w.qp+w.b.id+".", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(maxOwn))
}

// settleOwn finds the oldest of owner's entries among kvs (the backend's
// own entries of the queue, oldest first) and deletes the others (each
// guarded by its mod revision; a failed delete is left to the orphan
// sweep): an earlier attempt's entry keeps its place in the queue, and the
// owner never waits behind itself. It returns nil if owner has none.
func (w *waiter) settleOwn(ctx context.Context, kvs []*mvccpb.KeyValue, owner string) *mvccpb.KeyValue {
	var oldest *mvccpb.KeyValue
	for _, kv := range kvs {
		if ownerOf(kv) != owner {
			continue
		}
		if oldest == nil {
			oldest = kv
			continue
		}
		if _, err := w.b.deleteEntry(ctx, string(kv.Key), kv.ModRevision); err != nil {
			w.b.orphan(string(kv.Key), kv.ModRevision)
		}
	}
	return oldest
}

// maxSlotTries bounds how many names enqueue tries when it finds them
// taken by other owners' entries (left by this backend's failed
// releases).
const maxSlotTries = 8

// enqueue puts our entry (or finds it from an earlier attempt) and returns
// up to two older entries, nearest first, and the revision they were read
// at.
func (w *waiter) enqueue(ctx context.Context, req driver.AcquireRequest) ([]*mvccpb.KeyValue, int64, error) {
	for attempt, tries := 0, 0; ; attempt++ {
		l, err := w.s.fresh(ctx, 0, true)
		if err != nil {
			return nil, 0, err
		}
		// The put is not abandoned when ctx ends: its outcome must be
		// known to remove the entry afterwards.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.b.cleanupTimeout)
		w.sent = l.id
		resp, err := w.b.cli.Txn(tctx).
			If(clientv3.Compare(clientv3.CreateRevision(w.me), "=", 0)).
			Then(clientv3.OpPut(w.me, entryValue(req.Owner, req.Metadata), clientv3.WithLease(l.id)),
				clientv3.OpGet(w.qp, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(knownPreds+2)),
				w.ownEntries()).
			Else(w.ownEntries()).
			Commit()
		cancel()
		if err == nil || isLeaseNotFound(err) {
			w.sent = 0 // the outcome is known
		}
		if isLeaseNotFound(err) && attempt == 0 {
			w.s.forget(l.id)
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		// The backend's own entries of the queue, read in the same
		// transaction: an entry an earlier attempt of this owner left
		// (its reply lost, its clean-up failed) is found whatever its
		// name, the oldest kept and any other deleted.
		own := resp.Responses[0].GetResponseRange().GetKvs()
		if resp.Succeeded {
			own = resp.Responses[2].GetResponseRange().GetKvs()
		}
		mine := w.settleOwn(ctx, own, req.Owner)
		switch {
		case resp.Succeeded && mine != nil && string(mine.Key) == w.me:
			w.rev, w.mod, w.lease = resp.Header.Revision, resp.Header.Revision, l.id
			var preds []*mvccpb.KeyValue
			for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
				if kv.CreateRevision < w.rev {
					preds = append(preds, kv)
				}
			}
			return preds, resp.Header.Revision, nil
		case mine == nil && resp.Succeeded:
			// Our put is not among the oldest maxOwn of the backend's
			// entries: no older one of ours can be either.
			w.rev, w.mod, w.lease = resp.Header.Revision, resp.Header.Revision, l.id
			return w.predecessors(ctx)
		case mine == nil:
			// The name is taken by another owner's entry (one that a
			// failed release of this backend left): try another name.
			if tries++; tries >= maxSlotTries {
				return nil, 0, errNamesTaken
			}
			w.slot(true)
			attempt = -1
			continue
		}
		if string(mine.Key) != w.me {
			w.adopt(mine) // an older entry of ours: the one just put is deleted
		}
		if string(mine.Value) != entryValue(req.Owner, req.Metadata) || clientv3.LeaseID(mine.Lease) != l.id {
			// Left by an earlier attempt on a lease we no longer keep
			// alive, or with other metadata: replace it.
			if _, err := w.b.deleteEntry(ctx, w.me, mine.ModRevision); err != nil {
				return nil, 0, err
			}
			if attempt >= 2 {
				return nil, 0, errQueueEntryGone
			}
			continue
		}
		w.rev, w.mod, w.lease = mine.CreateRevision, mine.ModRevision, l.id
		return w.predecessors(ctx)
	}
}

// knownPreds is how many older entries a waiter tracks itself: with at
// most that many ahead of it, it watches the queue for their deletions and
// needs no further reads; further back, it watches its predecessor only
// and reads the queue again when that one goes.
const knownPreds = 16

// predecessors returns up to knownPreds+1 entries older than ours, nearest
// first, and the revision they were read at.
func (w *waiter) predecessors(ctx context.Context) ([]*mvccpb.KeyValue, int64, error) {
	resp, err := w.b.cli.Get(ctx, w.qp, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(w.rev-1), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(knownPreds+1))
	if err != nil {
		return nil, 0, err
	}
	return resp.Kvs, resp.Header.Revision, nil
}

func (w *waiter) wait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	preds, at, err := w.enqueue(ctx, req)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return driver.Grant{}, err
	}
	l, _ := w.s.fresh(ctx, w.lease, false)
	keepEvery := max(l.granted/3, 100*time.Millisecond)
	ticker := time.NewTicker(keepEvery)
	defer ticker.Stop()
	for {
		if len(preds) == 0 {
			start := time.Now()
			l, err := w.s.fresh(ctx, w.lease, false)
			if errors.Is(err, errLeaseGone) {
				return driver.Grant{}, errQueueEntryGone
			}
			if err != nil {
				return driver.Grant{}, err
			}
			// The token is final once Renew confirms the grant (the engine
			// always does): if a holder rotated its token after we
			// queued, Renew re-puts our entry to get a higher one.
			return driver.Grant{Key: req.Key, Owner: req.Owner, Token: driver.Token(w.mod), TTL: l.ttlLeft(start), Handle: l.handle(nameIn(w.qp, w.me))}, nil
		}
		if len(preds) <= knownPreds {
			// Every older entry is known, and none can be added: we are
			// at the head once all of them are deleted.
			gone, err := w.awaitAll(ctx, ticker, preds, at)
			if err != nil {
				return driver.Grant{}, err
			}
			if gone {
				preds = nil
				continue
			}
		} else if _, err := w.awaitDelete(ctx, ticker, preds[0], at); err != nil {
			return driver.Grant{}, err
		}
		if preds, at, err = w.predecessors(ctx); err != nil {
			return driver.Grant{}, err
		}
	}
}

// watchQueue watches the deletions in our queue (or of one key) from the
// current revision, so that etcd registers the watch as synced.
// WithRequireLeader: etcd cancels the watch if its member loses the leader
// (we then read the queue again), and the different metadata puts
// waiters' watches on their own gRPC stream, so their creation never
// queues behind the backend's loss watches.
func (w *waiter) watchQueue(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	opts = append(opts, clientv3.WithCreatedNotify(), clientv3.WithFilterPut())
	return w.b.cli.Watch(clientv3.WithRequireLeader(ctx), key, opts...)
}

// keepAlive is run on every tick of the waiter's ticker.
func (w *waiter) keepAlive(ctx context.Context) error {
	if _, err := w.s.fresh(ctx, w.lease, false); err != nil {
		if errors.Is(err, errLeaseGone) {
			return errQueueEntryGone
		}
		return err
	}
	return nil
}

// awaitAll waits until every entry of preds (all the entries older than
// ours, read at revision at) is deleted, with one watch on the queue. It
// returns false if the watch ended for another reason.
func (w *waiter) awaitAll(ctx context.Context, ticker *time.Ticker, preds []*mvccpb.KeyValue, at int64) (bool, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	left := make(map[string]bool, len(preds))
	for _, kv := range preds {
		left[string(kv.Key)] = true
	}
	wch := w.watchQueue(wctx, w.qp, clientv3.WithPrefix())
	created := false
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-ticker.C:
			if err := w.keepAlive(ctx); err != nil {
				return false, err
			}
		case resp, ok := <-wch:
			if !ok || resp.Canceled || resp.Err() != nil {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				return false, nil // read the queue again
			}
			if resp.Created && !created {
				created = true
				if resp.Header.Revision != at {
					// Written between our read and the watch's
					// registration: read again what is left.
					now, _, err := w.predecessors(ctx)
					if err != nil {
						return false, err
					}
					left = make(map[string]bool, len(now))
					for _, kv := range now {
						left[string(kv.Key)] = true
					}
				}
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					delete(left, string(ev.Kv.Key))
				}
			}
			if created && len(left) == 0 {
				return true, nil
			}
		}
	}
}

// awaitDelete waits until entry pred (read at revision at) is deleted. It
// returns gone=false if the watch ended for another reason (the caller
// then reads the queue again).
func (w *waiter) awaitDelete(ctx context.Context, ticker *time.Ticker, pred *mvccpb.KeyValue, at int64) (gone bool, err error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	key := string(pred.Key)
	wch := w.watchQueue(wctx, key)
	created := false
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-ticker.C:
			if err := w.keepAlive(ctx); err != nil {
				return false, err
			}
		case resp, ok := <-wch:
			if !ok || resp.Canceled || resp.Err() != nil {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				return false, nil // read the queue again
			}
			if resp.Created && !created {
				created = true
				if resp.Header.Revision != at {
					// Something was written between our read and the
					// watch's registration: the predecessor may have
					// gone in that gap.
					gr, err := w.b.cli.Get(ctx, key)
					if err != nil {
						return false, err
					}
					if len(gr.Kvs) == 0 || gr.Kvs[0].CreateRevision != pred.CreateRevision {
						return true, nil
					}
				}
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					return true, nil
				}
			}
		}
	}
}
