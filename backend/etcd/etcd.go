package etcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
)

// maxTxnOps is how many reads RenewBatch puts in one transaction: etcd's
// default limit (--max-txn-ops).
const maxTxnOps = 128

// Backend is a lock store on an etcd cluster. It implements
// driver.Backend and the optional capabilities driver.Waiter (FIFO
// queueing), driver.Watcher (a watch on a key's queue, for observers),
// driver.BatchRenewer, driver.LossNotifier (a watch on the holder's
// entry), driver.ForceReleaser and driver.Describer.
type Backend struct {
	cli            *clientv3.Client
	own            bool // Close closes cli
	prefix         string
	cleanupTimeout time.Duration

	ctx    context.Context // cancelled by Close; parent of every watch
	cancel context.CancelFunc
	wg     sync.WaitGroup // loss watchers; Add under mu while !closed
	closed atomic.Bool    // set under mu
	// cleanClose is set by Close just before closed. The clean-ups that
	// can run after closed is set (revoking a lease granted or kept alive
	// while Close runs, session.fresh; deleting the entry of a wait that
	// Close ended, acquireWait) run only if it is set: the conformance
	// suite's crash sets closed alone, as a dead process cleans nothing
	// up.
	cleanClose atomic.Bool

	// testHookLeaseAnswered, if set (tests only, before first use), runs
	// in session.fresh when a grant or keep-alive has been answered,
	// before the session takes its lock to record it.
	testHookLeaseAnswered func()

	mu       sync.Mutex
	sessions map[int64]*session // by TTL in seconds

	id    string    // names this backend's entries (keys.go)
	slots slotTable // entry slots in use, per lock key

	orphans backendkit.Orphans[string, int64] // entries whose deletion failed: key → mod revision
	hot     backendkit.HotSet                 // keys found held recently (see Acquire)

	fl floors // the token offsets (floor.go)

	delays delays // lock-delay markers' leases of this backend's grants (lockdelay.go)
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.Waiter        = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.LossNotifier  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// New returns a Backend on a caller-owned client. Close does not close
// cli. A nil opts means defaults; invalid options return an
// *driver.InvalidOptionError. New does no I/O; ctx is reserved.
func New(ctx context.Context, cli *clientv3.Client, opts *Options) (*Backend, error) {
	if cli == nil {
		return nil, errors.New("etcd: New: nil *clientv3.Client")
	}
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	bctx, cancel := context.WithCancel(context.Background())
	return &Backend{
		cli:            cli,
		id:             newBackendID(),
		prefix:         o.Prefix,
		cleanupTimeout: o.CleanupTimeout,
		ctx:            bctx,
		cancel:         cancel,
		sessions:       make(map[int64]*session),
		hot:            backendkit.HotSet{TTL: hotFor, Max: maxHot},
	}, nil
}

// Client returns the etcd client the backend uses.
func (b *Backend) Client() *clientv3.Client { return b.cli }

// Prefix returns the etcd key prefix of the backend's lock queues.
func (b *Backend) Prefix() string { return b.prefix }

// checkRequest is the preamble of Acquire and AcquireWait.
func (b *Backend) checkRequest(req driver.AcquireRequest) error {
	if err := driver.CheckAcquire(req); err != nil {
		return err
	}
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return nil
}

func holderInfo(key string, kv *mvccpb.KeyValue) driver.Info {
	owner, md := parseValue(kv.Value)
	return driver.Info{Key: key, Owner: owner, Token: driver.Token(kv.ModRevision), Metadata: md}
}

// entryValue is the value of an entry: the owner, a NUL and the
// metadata's bytes (none when there is no metadata). An owner never
// contains NUL (driver.ValidateOwner), so the NUL ends it; earlier versions
// wrote the owner alone when there was no metadata, which parseValue reads
// the same way.
func entryValue(owner string, md []byte) string {
	return owner + "\x00" + string(md)
}

// ownedBy compares entry k's value with owner in etcd: it holds exactly
// when the value is owner, a NUL and anything (see entryValue). Values
// above owner and below owner+"\x01" are those that begin with owner
// followed by a byte below 0x01: a NUL.
func ownedBy(k, owner string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(k), ">", owner),
		clientv3.Compare(clientv3.Value(k), "<", owner+"\x01"),
	}
}

// ownerOf returns the owner of entry kv.
func ownerOf(kv *mvccpb.KeyValue) string {
	owner, _ := parseValue(kv.Value)
	return owner
}

// parseValue splits an entry's value into its owner and metadata (nil if
// none, as in entries written by earlier versions).
func parseValue(v []byte) (owner string, md []byte) {
	o, m, _ := bytes.Cut(v, []byte{0})
	if len(m) == 0 {
		return string(o), nil
	}
	return string(o), append([]byte(nil), m...)
}

func firstOf(r *clientv3.TxnResponse, i int) *mvccpb.KeyValue {
	if kvs := r.Responses[i].GetResponseRange().GetKvs(); len(kvs) > 0 {
		return kvs[0]
	}
	return nil
}

// Acquire implements driver.Backend (see acquire); the token offset is
// the cached one, checked in the acquiring transaction itself.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := b.acquire(ctx, req)
	if err != nil {
		return driver.Grant{}, b.tokens().HeldError(ctx, err)
	}
	g.Token, err = b.token(ctx, int64(g.Token))
	if err != nil {
		return driver.Grant{}, err
	}
	return g, nil
}

// acquire is Acquire on native tokens (mod revisions; floor.go maps them
// to the tokens callers see). It is one transaction: if key's queue is
// empty and the token floor key is the version this backend has cached
// (its mod revision compared), put the owner's entry (attached to the
// backend's lease); with nothing cached yet, the transaction reads the
// floor key instead of comparing it. The token is the entry's create
// revision, and the floor in force at it is the cached one. A failed
// transaction costs one more round trip, a read-only transaction of the
// queue's head and the floor key: a key found held, or (an empty queue,
// the floor key moved) another attempt with the floor just read.
//
// Comparing the floor key instead of reading it costs the server less:
// at 16 goroutines on free keys the read took about 0.04 of raw's rate
// more than the compare (TxnForms, 2026-11-25).
func (b *Backend) acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.checkRequest(req); err != nil {
		return driver.Grant{}, err
	}
	s := b.session(req.TTL)
	qp := b.queuePrefix(req.Key)
	slot := b.slots.take(req.Key, req.Owner)
	name := b.slotName(slot)
	me := qp + name
	// The slot stays reserved for a grant only (see slotTable).
	keep := false
	defer func() {
		if !keep {
			b.slots.free(req.Key, slot, req.Owner)
		}
	}()
	if b.hot.Hot(req.Key) {
		// The key was held a moment ago: read before writing. The
		// transaction below is a Raft write (fsync) even when its compare
		// fails; under contention most attempts would fail.
		resp, err := b.cli.Get(ctx, qp, clientv3.WithFirstCreate()...)
		if err != nil {
			return driver.Grant{}, err
		}
		if len(resp.Kvs) > 0 && ownerOf(resp.Kvs[0]) != req.Owner {
			b.hot.Mark(req.Key)
			return driver.Grant{}, &driver.HeldError{Holder: holderInfo(req.Key, resp.Kvs[0])}
		}
	}
	// With a lock delay: refuse while the key's marker outlives an
	// unreleased end, else put ours with the entry, on a lease of its own
	// (lockdelay.go), revoked again unless the entry's put succeeds.
	var delayLease clientv3.LeaseID
	if req.LockDelay > 0 {
		if err := b.delayCheck(ctx, req, qp); err != nil {
			return driver.Grant{}, err
		}
		lr, err := b.cli.Grant(ctx, delayTTL(req.TTL, req.LockDelay))
		if err != nil {
			return driver.Grant{}, err
		}
		delayLease = lr.ID
		defer func() {
			if id, ok := b.delays.get(req.Key, req.Owner); !ok || id != delayLease {
				_ = b.revoke(delayLease)
			}
		}()
	}
	// leaseRetried: a lease revoked from outside was replaced once.
	// readFloor: the floor key moved under the cached version; the next
	// transaction reads it instead of comparing it, and so cannot fail on
	// it (a raise per round trip would otherwise keep a free key
	// refused).
	leaseRetried, readFloor := false, false
	for {
		l, err := s.fresh(ctx, 0, true)
		if err != nil {
			return driver.Grant{}, err
		}
		start := time.Now()
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(qp), "=", 0).WithPrefix()}
		ops := []clientv3.Op{clientv3.OpPut(me, entryValue(req.Owner, req.Metadata), clientv3.WithLease(l.id))}
		if delayLease != 0 {
			dk := b.delayKey(req.Key)
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(dk), "=", 0))
			ops = append(ops, clientv3.OpPut(dk, req.Owner, clientv3.WithLease(delayLease)))
		}
		fmod, cached := b.fl.known()
		cached = cached && !readFloor
		floorAt := len(ops) // the index of the floor key's read among the responses
		if cached {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(b.floorKey()), "=", fmod))
		} else {
			ops = append(ops, clientv3.OpGet(b.floorKey()))
		}
		resp, err := b.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if isLeaseNotFound(err) && !leaseRetried {
			leaseRetried = true
			s.forget(l.id) // revoked from outside: grant a new one
			continue
		}
		if err != nil {
			return driver.Grant{}, err
		}
		g := driver.Grant{Key: req.Key, Owner: req.Owner}
		if resp.Succeeded {
			// The token offset in force at the entry's revision: the
			// cached floor, which the transaction compared, or the
			// floor it read (floor.go).
			if cached {
				b.fl.held(resp.Header.Revision, fmod)
			} else if err := b.fl.observe(resp.Header.Revision, firstOf(resp, floorAt)); err != nil {
				// A floor key that does not parse: no token can be
				// mapped, and the entry just put must not stay.
				b.dropEntry(me, resp.Header.Revision)
				return driver.Grant{}, err
			}
			g.Token = driver.Token(resp.Header.Revision)
			g.TTL = l.ttlLeft(start)
			g.Handle = l.handle(name)
			keep = true
			if delayLease != 0 {
				b.delays.set(req.Key, req.Owner, delayLease)
			}
			return g, nil
		}
		// Held: read the queue's head (and the floor, for its token) in
		// a read-only transaction. The reads are not in the acquiring
		// transaction's Else branch because every write request goes
		// through Raft whole, Else included: at 16 goroutines on free
		// keys two Else reads cost about 0.04 of raw's rate (TxnForms).
		// Reading after the compare failed only makes the head newer,
		// which every use below allows for (a head that is gone reads as
		// a key held by nobody known; our own entry is re-checked by its
		// mod revision). The key is marked hot only if it is held.
		resp, err = b.cli.Txn(ctx).Then(clientv3.OpGet(qp, clientv3.WithFirstCreate()...), clientv3.OpGet(b.floorKey())).Commit()
		if err != nil {
			return driver.Grant{}, err
		}
		if err := b.fl.observe(resp.Header.Revision, firstOf(resp, 1)); err != nil {
			return driver.Grant{}, err
		}
		head := firstOf(resp, 0)
		if head == nil {
			if f := firstOf(resp, 1); cached && (f == nil && fmod != 0 || f != nil && f.ModRevision != fmod) {
				// The queue is empty and the floor key moved: the
				// compare on the floor may be what failed. Again,
				// reading the floor this time.
				readFloor = true
				continue
			}
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
		}
		b.hot.Mark(req.Key)
		if mine := head; ownerOf(mine) == req.Owner {
			// A retry of an acquisition that succeeded (the queue's head
			// is the owner's own entry, under the name it was put with;
			// owners are unique per acquisition): same grant, with this request's
			// metadata. Replacing the metadata re-puts the entry, which
			// gives it a new token (as a rotation does). The marker is
			// read only here, after the transaction (a rare path, kept
			// out of every acquisition's request): it only ever grows, so
			// a later read can only make the re-put below more likely,
			// and the re-put is guarded by the entry's mod revision.
			ml, err := b.keepLease(ctx, clientv3.LeaseID(mine.Lease))
			if err != nil {
				return driver.Grant{}, err
			}
			mr, err := b.cli.Get(ctx, b.markerKey(req.Key))
			if err != nil {
				return driver.Grant{}, err
			}
			g.Token = driver.Token(mine.ModRevision)
			value := entryValue(req.Owner, req.Metadata)
			// Re-put, too, an entry older than the floor key (read with
			// the head): an entry that queued as a waiter before a raise,
			// as AcquireWait does.
			floorNewer := firstOf(resp, 1) != nil && firstOf(resp, 1).ModRevision > mine.ModRevision
			if (len(mr.Kvs) > 0 && mr.Kvs[0].ModRevision > mine.ModRevision) || floorNewer || string(mine.Value) != value {
				tok, err := b.bump(ctx, req.Key, string(mine.Key), value, mine.ModRevision)
				if err != nil {
					return driver.Grant{}, err
				}
				g.Token = tok
			}
			if delayLease != 0 {
				// The earlier attempt's marker may be on a lease this
				// call does not keep alive: put it on ours, while the
				// entry is the one just checked.
				dk := b.delayKey(req.Key)
				dr, err := b.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(string(mine.Key)), "=", int64(g.Token))).
					Then(clientv3.OpPut(dk, req.Owner, clientv3.WithLease(delayLease))).Commit()
				if err != nil {
					return driver.Grant{}, err
				}
				if !dr.Succeeded {
					return driver.Grant{}, errDelayMoved
				}
				b.delays.set(req.Key, req.Owner, delayLease)
			}
			headName := nameIn(qp, string(mine.Key))
			keep = headName == name
			g.TTL = ml.ttlLeft(start)
			g.Handle = ml.handle(headName)
			return g, nil
		}
		return driver.Grant{}, &driver.HeldError{Holder: holderInfo(req.Key, head)}
	}
}

// Acquire reads before writing for a key found held less than a second
// ago (remembering at most 1024 keys): a queue entry costs a write and a
// delete, each a Raft round and an fsync, so a contender that will wait
// anyway is cheaper served by the read. A second covers the engine's first
// retries of a contended key; keys stay cold otherwise.
const (
	hotFor = time.Second
	maxHot = 1024
)

// entryOp reads g's entry: by the name its Handle carries, else (a grant
// built from Inspect, or by an earlier version) as the entry of g's queue
// whose mod revision is g's token (there is at most one). Either way the
// caller checks the owner in its value.
func (b *Backend) entryOp(g driver.Grant) clientv3.Op {
	qp := b.queuePrefix(g.Key)
	if name, ok := handleName(g.Handle); ok {
		return clientv3.OpGet(qp + name)
	}
	return clientv3.OpGet(qp, clientv3.WithPrefix(), clientv3.WithMinModRev(int64(g.Token)), clientv3.WithMaxModRev(int64(g.Token)))
}

// checkOps reads a grant's entry, its queue's head and the key's rotation
// marker.
func (b *Backend) checkOps(g driver.Grant) []clientv3.Op {
	return []clientv3.Op{b.entryOp(g), clientv3.OpGet(b.queuePrefix(g.Key), clientv3.WithFirstCreate()...), clientv3.OpGet(b.markerKey(g.Key))}
}

// bump re-puts entry k of key with value (its owner and metadata, see
// entryValue), keeping its lease, if its mod revision is still mod, giving
// it a new, higher token, and writes the key's marker in the same
// transaction. ErrNotHeld if the entry changed.
//
// Every re-put of an entry goes through bump, so the marker's mod revision
// is at least every token that is not its entry's create revision. That is
// what lets a grant keep its create revision as its token when the marker
// is older than the entry: every token issued before it is either a create
// revision of an entry ahead of it in the queue (lower), a revision from
// before the entry existed (lower), or a re-put (at most the marker).
// A re-put that skipped the marker would let a later grant keep a token
// below it.
func (b *Backend) bump(ctx context.Context, key, k, value string, mod int64) (driver.Token, error) {
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", mod)).
		Then(clientv3.OpPut(k, value, clientv3.WithIgnoreLease()), clientv3.OpPut(b.markerKey(key), "")).
		Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, driver.ErrNotHeld
	}
	return driver.Token(resp.Header.Revision), nil
}

// current reports whether the entry and head read by checkOps show g as
// the holder, and returns the lease its entry is attached to. A nil head
// skips the head check (RenewBatch: the grant was confirmed as the head
// before, and no entry can queue ahead of an existing one).
func current(g driver.Grant, mine, head *mvccpb.KeyValue) (clientv3.LeaseID, bool) {
	if mine == nil || mine.ModRevision != int64(g.Token) || mine.Lease == 0 {
		return 0, false
	}
	if ownerOf(mine) != g.Owner {
		return 0, false
	}
	if head != nil && head.CreateRevision != mine.CreateRevision {
		return 0, false
	}
	if g.Handle != "" {
		if h, ok := parseHandle(g.Handle); !ok || h != clientv3.LeaseID(mine.Lease) {
			return 0, false
		}
	}
	return clientv3.LeaseID(mine.Lease), true
}

// lostEntry frees the slot of g's entry name once a read (mine) shows
// that no entry of g's owner has it any more: the engine forgets a lease
// it lost without releasing it. An entry of the owner under another token
// (a rotation whose reply was lost) keeps the slot until it is released.
func (b *Backend) lostEntry(g driver.Grant, mine *mvccpb.KeyValue) {
	b.delays.drop(g.Key, g.Owner) // its marker now runs out
	name, ok := handleName(g.Handle)
	if ok && (mine == nil || ownerOf(mine) != g.Owner) {
		b.freeName(g.Key, name, g.Owner)
	}
}

type leaseResult struct {
	l   lease
	err error
}

// Renew implements driver.Backend (see renew).
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	return b.tokens().Renew(ctx, g, req, b.renew)
}

// renew is Renew on native tokens (mod revisions; floor.go maps them to the tokens callers see): it checks in one read transaction that
// g's entry still exists with g's token (its mod revision) at the head of
// its queue, and keeps the entry's lease alive (shared with the backend's
// other entries: one keep-alive serves every renewal within 1/20 of the
// TTL). Renew never creates anything. With Rotate it re-puts the entry
// (keeping its lease) and the key's rotation marker in one transaction
// guarded by the mod revision: the new mod revision is the new token. A
// grant whose entry is older than the marker (a waiter that queued before
// an earlier holder re-put its entry, by a rotation or by such a
// confirmation) is re-put the same way, marker included, on its first
// Renew (the engine's confirmation), so its token exceeds every token
// issued before it. With SetMetadata the entry is re-put the same way with
// the new metadata in its value (unless it already has it), so setting
// metadata also gives the grant a new token; the re-put is guarded by the
// mod revision just checked, so a takeover in between makes it fail with
// ErrNotHeld and change nothing. Any other re-put keeps the value, and so
// the metadata.
func (b *Backend) renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.ValidateKey(g.Key); err != nil {
		return driver.Grant{}, err
	}
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	if g.Owner == "" || g.Token == 0 || driver.ValidateOwner(g.Owner) != nil {
		return driver.Grant{}, driver.ErrNotHeld
	}
	start := time.Now()
	// When the handle names one of this backend's leases, keep it alive
	// while the entry is read: one round trip instead of two.
	var early chan leaseResult
	if h, ok := parseHandle(g.Handle); ok {
		if s := b.sessionOf(h); s != nil {
			early = make(chan leaseResult, 1)
			go func() {
				l, err := s.fresh(ctx, h, false)
				early <- leaseResult{l, err}
			}()
		}
	}
	resp, err := b.cli.Txn(ctx).Then(b.checkOps(g)...).Commit()
	var lr leaseResult
	if early != nil {
		lr = <-early
	}
	if err != nil {
		return driver.Grant{}, err
	}
	mine := firstOf(resp, 0)
	id, ok := current(g, mine, firstOf(resp, 1))
	if !ok {
		b.lostEntry(g, mine)
		return driver.Grant{}, driver.ErrNotHeld
	}
	// Rotation re-puts the entry (new mod revision = new token) and the
	// key's marker. An entry older than the marker (it queued before an
	// earlier holder's re-put) is re-put the same way, so that its token
	// exceeds every token issued before it (see bump).
	marker := firstOf(resp, 2)
	value := string(mine.Value)
	if req.SetMetadata {
		value = entryValue(g.Owner, req.Metadata)
	}
	if req.Rotate || (marker != nil && marker.ModRevision > mine.ModRevision) || value != string(mine.Value) {
		if g.Token, err = b.bump(ctx, g.Key, string(mine.Key), value, mine.ModRevision); err != nil {
			if errors.Is(err, driver.ErrNotHeld) {
				b.lostEntry(g, nil) // changed since the read: not ours any more
			}
			return driver.Grant{}, err
		}
	}
	if early == nil {
		lr.l, lr.err = b.keepLease(ctx, id)
	}
	if errors.Is(lr.err, errLeaseGone) {
		b.lostEntry(g, nil) // the lease's entries went with it
		return driver.Grant{}, driver.ErrNotHeld
	}
	if lr.err != nil {
		return driver.Grant{}, lr.err
	}
	if err := b.keepDelay(ctx, g); err != nil {
		return driver.Grant{}, err
	}
	g.TTL = lr.l.ttlLeft(start)
	g.Handle = lr.l.handle(nameIn(b.queuePrefix(g.Key), string(mine.Key)))
	return g, nil
}

// RenewBatch implements driver.BatchRenewer (see renewBatch).
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	return b.tokens().RenewBatch(ctx, grants, req, b.renewBatch)
}

// renewBatch is RenewBatch on native tokens (mod revisions; floor.go maps them to the tokens callers see): the grants' entries are read
// in transactions of up to 128 reads, sent concurrently, while the leases
// their handles name are kept alive (one keep-alive per distinct lease,
// usually one for the whole batch). A transaction that fails affects only
// its own grants. An entry that still exists with the grant's create
// revision is still the holder: no entry can queue ahead of it later.
func (b *Backend) renewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	req.SetMetadata, req.Metadata = false, nil // a batch keeps every entry's metadata
	if req.Rotate {
		// Rotation writes each entry: one Renew per grant.
		out := make([]driver.RenewResult, len(grants))
		for i, g := range grants {
			out[i].Grant, out[i].Err = b.renew(ctx, g, req)
		}
		return out, nil
	}
	start := time.Now()
	out := make([]driver.RenewResult, len(grants))
	ids := make([]clientv3.LeaseID, len(grants))
	names := make([]string, len(grants)) // each entry's name
	var wg sync.WaitGroup
	leases := make(map[clientv3.LeaseID]*leaseResult)
	for _, g := range grants {
		if h, ok := parseHandle(g.Handle); ok && leases[h] == nil {
			leases[h] = new(leaseResult)
		}
	}
	for id, lr := range leases {
		wg.Go(func() { lr.l, lr.err = b.keepLease(ctx, id) })
	}
	var idx []int
	var ops []clientv3.Op
	flush := func(idx []int, ops []clientv3.Op) {
		wg.Go(func() {
			resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
			for j, i := range idx {
				if err != nil {
					out[i].Err = err
					continue
				}
				mine := firstOf(resp, j)
				id, ok := current(grants[i], mine, nil)
				if !ok {
					b.lostEntry(grants[i], mine)
					out[i].Err = driver.ErrNotHeld
					continue
				}
				ids[i] = id
				names[i] = nameIn(b.queuePrefix(grants[i].Key), string(mine.Key))
			}
		})
	}
	for i, g := range grants {
		if driver.ValidateKey(g.Key) != nil || g.Owner == "" || g.Token == 0 || driver.ValidateOwner(g.Owner) != nil {
			out[i].Err = driver.ErrNotHeld
			continue
		}
		idx = append(idx, i)
		ops = append(ops, b.entryOp(g))
		if len(ops) == maxTxnOps {
			flush(idx, ops)
			idx, ops = nil, nil
		}
	}
	if len(ops) > 0 {
		flush(idx, ops)
	}
	wg.Wait()
	failed := 0
	for i, id := range ids {
		if id == 0 {
			if out[i].Err != nil && !errors.Is(out[i].Err, driver.ErrNotHeld) {
				failed++
			}
			continue
		}
		lr := leases[id]
		if lr == nil { // no handle named it
			lr = new(leaseResult)
			lr.l, lr.err = b.keepLease(ctx, id)
			leases[id] = lr
		}
		switch {
		case errors.Is(lr.err, errLeaseGone):
			b.lostEntry(grants[i], nil) // the lease's entries went with it
			out[i].Err = driver.ErrNotHeld
		case lr.err != nil:
			out[i].Err = lr.err
			failed++
		default:
			g := grants[i]
			if err := b.keepDelay(ctx, g); err != nil {
				out[i].Err = err
				failed++
				continue
			}
			g.TTL = lr.l.ttlLeft(start)
			g.Handle = lr.l.handle(names[i])
			out[i].Grant = g
		}
	}
	if failed == len(grants) && failed > 0 {
		return nil, out[0].Err
	}
	return out, nil
}

// Release implements driver.Backend (see release).
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	n, err := b.nativeGrant(ctx, g)
	if err != nil {
		return err
	}
	return b.release(ctx, n)
}

// release is Release on native tokens (mod revisions; floor.go maps them to the tokens callers see): it deletes g's entry only if its mod
// revision is still g's token, in one transaction (never a delete by key name
// alone, see etcd-io/etcd#22082). The shared lease is not revoked.
func (b *Backend) release(ctx context.Context, g driver.Grant) error {
	if err := driver.ValidateKey(g.Key); err != nil {
		return err
	}
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if g.Owner == "" || g.Token == 0 || driver.ValidateOwner(g.Owner) != nil {
		return driver.ErrNotHeld
	}
	qp, tok := b.queuePrefix(g.Key), int64(g.Token)
	var ok bool
	var err error
	name, named := handleName(g.Handle)
	if named {
		ok, err = b.deleteEntryWith(ctx, qp+name, tok, b.delayOps(g.Key, g.Owner), ownedBy(qp+name, g.Owner)...)
	} else {
		// A grant without a Handle (the engine's clean-up by owner,
		// built from Inspect): find the entry by its token, check its
		// owner, and delete that version of it.
		resp, gerr := b.cli.Get(ctx, qp, clientv3.WithPrefix(), clientv3.WithMinModRev(tok), clientv3.WithMaxModRev(tok))
		if gerr != nil {
			return gerr
		}
		if len(resp.Kvs) == 0 || ownerOf(resp.Kvs[0]) != g.Owner {
			return driver.ErrNotHeld
		}
		if b.closed.Load() {
			// Closed while the entry was looked up: a closed backend
			// writes nothing more (Close revokes its leases, which
			// deletes their entries; a crashed one is dead).
			return driver.ErrClosed
		}
		name = nameIn(qp, string(resp.Kvs[0].Key))
		ok, err = b.deleteEntryWith(ctx, qp+name, tok, b.delayOps(g.Key, g.Owner))
	}
	if ok {
		b.delays.drop(g.Key, g.Owner)
	}
	// The slot is free again whatever the outcome: an entry left under
	// its name is deleted by the orphan sweep below or expires, and
	// until then any put under the name fails its guard.
	b.freeName(g.Key, name, g.Owner)
	if err != nil {
		// The entry may outlive this failure on the shared lease: retry
		// the deletion with the next keep-alive that gets through.
		b.orphan(qp+name, tok)
		return err
	}
	if !ok {
		return driver.ErrNotHeld
	}
	return nil
}

// deleteEntry deletes entry k if its mod revision (its token) is mod and
// the further comparisons hold.
func (b *Backend) deleteEntry(ctx context.Context, k string, mod int64, also ...clientv3.Cmp) (bool, error) {
	return b.deleteEntryWith(ctx, k, mod, nil, also...)
}

// deleteEntryWith is deleteEntry with more operations (ops) in the
// deleting transaction.
func (b *Backend) deleteEntryWith(ctx context.Context, k string, mod int64, ops []clientv3.Op, also ...clientv3.Cmp) (bool, error) {
	resp, err := b.cli.Txn(ctx).
		If(append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", mod)}, also...)...).
		Then(append([]clientv3.Op{clientv3.OpDelete(k)}, ops...)...).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// dropEntry deletes entry k (mod revision mod), which a failed call
// leaves behind, with a context of its own bounded by CleanupTimeout; if
// that fails, the orphan sweep retries it.
func (b *Backend) dropEntry(k string, mod int64) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cleanupTimeout)
	defer cancel()
	if _, err := b.deleteEntry(ctx, k, mod); err != nil {
		b.orphan(k, mod)
	}
}

// maxSweep bounds the deletions one sweep sends.
const maxSweep = 64

// orphan records entry k (mod revision rev) whose deletion failed.
func (b *Backend) orphan(k string, rev int64) { b.orphans.Add(k, rev) }

// sweep retries the deletion of orphaned entries in one transaction of
// independent guarded deletes. It runs after a keep-alive got through, so
// that an entry whose release failed does not live on with the lease its
// backend keeps renewing for other locks.
func (b *Backend) sweep(ctx context.Context) {
	batch := b.orphans.Batch(maxSweep)
	if len(batch) == 0 {
		return
	}
	ops := make([]clientv3.Op, 0, len(batch))
	for k, rev := range batch {
		ops = append(ops, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", rev)},
			[]clientv3.Op{clientv3.OpDelete(k)}, nil))
	}
	if _, err := b.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return
	}
	for k, rev := range batch {
		b.orphans.Done(k, rev)
	}
}

// remaining asks etcd how long lease id has left; 0 if unknown.
func (b *Backend) remaining(ctx context.Context, id int64) time.Duration {
	if id == 0 {
		return 0
	}
	resp, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil || resp.TTL <= 0 {
		return 0
	}
	return time.Duration(resp.TTL) * time.Second
}

// Inspect implements driver.Backend (see inspect).
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	info, err := b.inspect(ctx, key)
	if err != nil {
		return driver.Info{}, err
	}
	return b.tokens().Info(ctx, info)
}

// inspect is Inspect on native tokens (mod revisions; floor.go maps them to the tokens callers see): the holder is the entry with the
// lowest create revision in key's queue; Remaining is its lease's time to
// live as etcd reports it (whole seconds).
func (b *Backend) inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
	}
	resp, err := b.cli.Get(ctx, b.queuePrefix(key), clientv3.WithFirstCreate()...)
	if err != nil {
		return driver.Info{}, err
	}
	if len(resp.Kvs) == 0 {
		return driver.Info{Key: key}, nil
	}
	info := holderInfo(key, resp.Kvs[0])
	info.Remaining = b.remaining(ctx, resp.Kvs[0].Lease)
	return info, nil
}

// maxListLeases bounds the TimeToLive requests of one List.
const maxListLeases = 16

// List implements driver.Backend (see list).
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	infos, err := b.list(ctx, prefix)
	if err != nil {
		return nil, err
	}
	return b.tokens().Infos(ctx, infos)
}

// list is List on native tokens (mod revisions; floor.go maps them to the tokens callers see) with one range read of the prefix; each
// key's holder is its entry with the lowest create revision. Remaining is
// filled in from up to 16 distinct leases (usually one per client).
func (b *Backend) list(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	resp, err := b.cli.Get(ctx, b.prefix+escape(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	type head struct {
		kv  *mvccpb.KeyValue
		key string
	}
	heads := make(map[string]head)
	var order []string
	for _, kv := range resp.Kvs {
		key, ok := b.parseEntry(string(kv.Key))
		if !ok {
			continue
		}
		h, seen := heads[key]
		if !seen {
			order = append(order, key)
		}
		if !seen || kv.CreateRevision < h.kv.CreateRevision {
			heads[key] = head{kv, key}
		}
	}
	ttls := make(map[int64]time.Duration)
	out := make([]driver.Info, 0, len(order))
	for _, key := range order {
		h := heads[key]
		info := holderInfo(key, h.kv)
		if d, ok := ttls[h.kv.Lease]; ok {
			info.Remaining = d
		} else if len(ttls) < maxListLeases {
			d = b.remaining(ctx, h.kv.Lease)
			ttls[h.kv.Lease] = d
			info.Remaining = d
		}
		out = append(out, info)
	}
	return out, nil
}

// ErrHolderChanged is returned by ForceRelease when the holder it read was
// replaced before it could delete it. Nothing was removed; try again.
var ErrHolderChanged = errors.New("etcd: the holder changed during force-release; nothing removed")

// ForceRelease implements driver.ForceReleaser (see forceRelease).
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	info, err := b.forceRelease(ctx, key)
	if err != nil {
		return driver.Info{}, err
	}
	return b.tokens().Info(ctx, info)
}

// forceRelease is ForceRelease on native tokens (mod revisions; floor.go maps them to the tokens callers see): it deletes the head of
// key's queue, guarded by its create revision. The holder's loss watch
// fires at once; the next waiter becomes the holder with a higher token.
// The holder's lease is not revoked (it is shared with its other locks).
func (b *Backend) forceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
	}
	resp, err := b.cli.Get(ctx, b.queuePrefix(key), clientv3.WithFirstCreate()...)
	if err != nil {
		return driver.Info{}, err
	}
	if len(resp.Kvs) == 0 {
		return driver.Info{Key: key}, nil
	}
	kv := resp.Kvs[0]
	info := holderInfo(key, kv)
	// A forced release frees the key at once: the lock-delay marker goes
	// with the entry.
	ok, err := b.deleteEntryWith(ctx, string(kv.Key), kv.ModRevision, []clientv3.Op{clientv3.OpDelete(b.delayKey(key))})
	if err != nil {
		return driver.Info{}, err
	}
	if !ok {
		return driver.Info{}, ErrHolderChanged
	}
	return info, nil
}

// Describe implements driver.Describer.
func (b *Backend) Describe() driver.Description {
	return driver.Description{
		Name:          "etcd",
		Fencing:       "mod revision of the holder's queue entry (etcd's cluster-wide revision); survives restarts and compaction; rotation re-puts the entry",
		Clock:         "server (etcd leader's lease expiry, whole seconds)",
		Liveness:      "lease TTL: one etcd lease per Backend and TTL, kept alive by renewals; a dead process's locks are freed when it expires",
		Scope:         driver.ScopeStore,
		FailoverSafe:  true,
		Failover:      "Raft: a write is acknowledged once a majority has it, so a new leader has every grant and revision; a minority partition cannot grant",
		LossDetection: "pushed by a watch on the holder's entry (deleted or its lease expired), else " + driver.LossByRenewal,
	}
}

// revoke revokes lease id with a fresh context bounded by CleanupTimeout.
func (b *Backend) revoke(id clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), b.cleanupTimeout)
	defer cancel()
	if _, err := b.cli.Revoke(ctx, id); err != nil && !isLeaseNotFound(err) {
		return fmt.Errorf("etcd: revoke lease %x: %w", int64(id), err)
	}
	return nil
}

// Close implements driver.Backend: it stops the loss watches, revokes the
// backend's leases (freeing any entry still attached to them, so a clean
// shutdown does not leave locks to expire), and closes the etcd client if
// Open created it. A client passed to New is left open.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return nil
	}
	b.cleanClose.Store(true)
	b.closed.Store(true)
	b.cancel() // under b.mu: no loss watch starts after this
	b.mu.Unlock()
	b.wg.Wait()
	b.mu.Lock()
	var ids []clientv3.LeaseID
	for _, s := range b.sessions {
		s.mu.Lock()
		if s.id != 0 {
			ids = append(ids, s.id)
			s.id = 0
		}
		s.mu.Unlock()
	}
	b.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := b.revoke(id); err != nil {
			errs = append(errs, err)
		}
	}
	if b.own {
		if err := b.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
