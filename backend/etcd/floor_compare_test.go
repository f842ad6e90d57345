package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// Review of 5a7ad5d (acquire compares the cached token floor's mod
// revision instead of reading the floor key). The tests drive the
// interleavings with fcKV, a KV wrapper that runs hooks right before and
// right after acquire's writing transaction is committed: the window
// between the backend's snapshot of the floor (floors.known) and the
// server's compare, and the window between the grant and floors.held.

// fcInfo describes one acquiring transaction (a put of an entry guarded by
// the queue-prefix compare).
type fcInfo struct {
	entry    string // the entry put
	cmpFloor bool   // the transaction compares the floor key's mod revision
	fmod     int64  // the mod revision it compares with
	resp     *clientv3.TxnResponse
	err      error
}

// fcKV counts requests and hooks acquiring transactions.
type fcKV struct {
	clientv3.KV
	floorKey string

	txns, gets atomic.Int64

	mu     sync.Mutex
	before func(fcInfo)                                // before an acquiring transaction commits
	after  func(fcInfo) (*clientv3.TxnResponse, error) // after it commits (returns what acquire sees)
	log    []fcInfo                                    // acquiring transactions, in order
}

func (k *fcKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.gets.Add(1)
	return k.KV.Get(ctx, key, opts...)
}

func (k *fcKV) Txn(ctx context.Context) clientv3.Txn {
	k.txns.Add(1)
	return &fcTxn{Txn: k.KV.Txn(ctx), k: k}
}

func (k *fcKV) set(before func(fcInfo), after func(fcInfo) (*clientv3.TxnResponse, error)) {
	k.mu.Lock()
	k.before, k.after = before, after
	k.mu.Unlock()
}

func (k *fcKV) acquires() []fcInfo {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]fcInfo(nil), k.log...)
}

func (k *fcKV) reset() {
	k.mu.Lock()
	k.log = nil
	k.mu.Unlock()
	k.txns.Store(0)
	k.gets.Store(0)
}

type fcTxn struct {
	clientv3.Txn
	k         *fcKV
	prefixCmp bool
	cmpFloor  bool
	fmod      int64
	entry     string
	putsFloor bool
}

func (t *fcTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	for _, c := range cs {
		pc := pb.Compare(c)
		if pc.Target == pb.Compare_CREATE && len(pc.RangeEnd) > 0 {
			t.prefixCmp = true
		}
		if string(pc.Key) == t.k.floorKey && pc.Target == pb.Compare_MOD {
			t.cmpFloor = true
			t.fmod = pc.GetModRevision()
		}
	}
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *fcTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if op.IsPut() {
			if string(op.KeyBytes()) == t.k.floorKey {
				t.putsFloor = true
			} else if t.entry == "" {
				t.entry = string(op.KeyBytes())
			}
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *fcTxn) Commit() (*clientv3.TxnResponse, error) {
	acq := t.prefixCmp && t.entry != "" && !t.putsFloor
	if !acq {
		return t.Txn.Commit()
	}
	info := fcInfo{entry: t.entry, cmpFloor: t.cmpFloor, fmod: t.fmod}
	t.k.mu.Lock()
	before, after := t.k.before, t.k.after
	t.k.mu.Unlock()
	if before != nil {
		before(info)
	}
	info.resp, info.err = t.Txn.Commit()
	t.k.mu.Lock()
	t.k.log = append(t.k.log, info)
	t.k.mu.Unlock()
	if after != nil {
		return after(info)
	}
	return info.resp, info.err
}

// fcBackend returns a backend on other's prefix whose client is hooked by
// an fcKV (hooking every acquiring transaction).
func fcBackend(t *testing.T, other *Backend) (*Backend, *fcKV) {
	t.Helper()
	k := &fcKV{floorKey: other.floorKey()}
	b, _ := backendVia(t, other, func(kv clientv3.KV) clientv3.KV { k.KV = kv; return k })
	return b, k
}

// fcRaise raises the floor on r far above every token issued so far (a
// raise that appends a segment) and returns the floor.
func fcRaise(t *testing.T, ctx context.Context, r *Backend) driver.Token {
	t.Helper()
	hw, err := r.HighWater(ctx, "")
	if err != nil {
		t.Error(err)
		return 0
	}
	resp, h0, err := r.readFloor(ctx)
	if err != nil {
		t.Error(err)
		return 0
	}
	// hw.Global is the token of the read's revision: with nothing written
	// since the last raise (revision W, the floor key's), W's token is under
	// the old offset, below that raise's floor. Above both.
	floor := hw.Global
	if len(resp.Kvs) > 0 {
		floor = max(floor, driver.Token(resp.Kvs[0].ModRevision+h0.Last()))
	}
	floor += 1_000_000
	if err := r.RaiseFloor(ctx, "", floor); err != nil {
		t.Error(err)
		return 0
	}
	if _, h, err := r.readFloor(ctx); err != nil || h.Last() <= h0.Last() {
		t.Errorf("RaiseFloor(%d) left the offset at %d (from %d), %v; want a new segment", floor, h.Last(), h0.Last(), err)
	}
	return floor
}

// fcCache returns b's cached floor: its key's mod revision, the revision
// it is exact up to, and the current offset.
func fcCache(b *Backend) (mod, at, off int64) {
	b.fl.mu.Lock()
	defer b.fl.mu.Unlock()
	if b.fl.h.IsZero() {
		return b.fl.mod, b.fl.at, -1
	}
	return b.fl.mod, b.fl.at, b.fl.h.Last()
}

// fcWarm acquires and releases a key on b: b has a cached floor after it.
// fcPair opens two fresh backends a and c on one prefix, and b, a third
// on a's prefix whose acquiring transactions are hooked (fcBackend), with
// a floor cached (fcWarm).
func fcPair(t *testing.T) (context.Context, *Backend, *Backend, *Backend, *fcKV) {
	t.Helper()
	ctx := ctxT(t)
	bs := openFresh(t, 2)
	a, c := bs[0], bs[1]
	b, kv := fcBackend(t, a)
	fcWarm(t, ctx, b)
	return ctx, a, c, b, kv
}

// fcOne is fcPair with one fresh backend a beside b.
func fcOne(t *testing.T) (context.Context, *Backend, *Backend, *fcKV) {
	t.Helper()
	ctx := ctxT(t)
	a := openFresh(t, 1)[0]
	b, kv := fcBackend(t, a)
	fcWarm(t, ctx, b)
	return ctx, a, b, kv
}

func fcWarm(t *testing.T, ctx context.Context, b *Backend) {
	t.Helper()
	g, err := b.Acquire(ctx, lockReq("fc-warm", "warm"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if _, _, off := fcCache(b); off < 0 {
		t.Fatal("no floor cached after an Acquire")
	}
}

// fcCheck checks that g is what every other backend (whose caches may
// differ) reports for its key, and that g renews on b as it is.
func fcCheck(t *testing.T, ctx context.Context, b *Backend, g driver.Grant, others ...*Backend) {
	t.Helper()
	for i, o := range others {
		info, err := o.Inspect(ctx, g.Key)
		if err != nil || info.Token != g.Token || info.Owner != g.Owner {
			t.Errorf("Inspect on backend %d = %+v, %v; want %q with token %d", i, info, err, g.Owner, g.Token)
		}
	}
	if r, err := b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL}); err != nil || r.Token != g.Token {
		t.Errorf("Renew = %+v, %v; want token %d unchanged", r, err, g.Token)
	}
}

// The basic cross-process case: b caches the floor (acquire, release), a
// raises it with a new segment, b acquires: b's snapshot is stale, the
// floor compare must fail and the retry must grant above the floor. Also
// for a raise that only rewrites the floor key (no segment: a floor just
// above the current tokens), where any token issued later is above it.
func TestRaiseElsewhereBetweenCacheAndAcquire(t *testing.T) {
	for _, segment := range []bool{true, false} {
		t.Run(fmt.Sprintf("segment=%v", segment), func(t *testing.T) {
			ctx, a, c, b, kv := fcPair(t)
			var floor driver.Token
			if segment {
				floor = fcRaise(t, ctx, a)
			} else {
				hw, err := a.HighWater(ctx, "")
				if err != nil {
					t.Fatal(err)
				}
				floor = hw.Global + 1
				if err := a.RaiseFloor(ctx, "k", floor); err != nil {
					t.Fatal(err)
				}
			}
			kv.reset()
			g, err := b.Acquire(ctx, lockReq("k", "o"))
			if err != nil {
				t.Fatal(err)
			}
			if g.Token <= floor {
				t.Errorf("token %d after RaiseFloor(%d) returned on another backend", g.Token, floor)
			}
			if log := kv.acquires(); len(log) != 2 || !log[0].cmpFloor || log[0].resp == nil || log[0].resp.Succeeded || !log[1].resp.Succeeded {
				t.Errorf("acquiring transactions %+v; want a failed compare of the stale floor, then a grant", log)
			}
			fcCheck(t, ctx, b, g, a, c)
		})
	}
}

// The raise lands exactly in the window: after b took its snapshot of the
// floor (known) and before the server evaluates b's transaction. The
// token must be above the floor (the mutation "cached floor trusted
// without the compare" gives a token below it).
func TestRaiseInsideAcquireWindow(t *testing.T) {
	ctx, a, c, b, kv := fcPair(t)
	var floor driver.Token
	var once sync.Once
	kv.set(func(fcInfo) { once.Do(func() { floor = fcRaise(t, ctx, a) }) }, nil)
	g, err := b.Acquire(ctx, lockReq("k", "o"))
	kv.set(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if floor == 0 {
		t.Fatal("the hook did not run")
	}
	if g.Token <= floor {
		t.Errorf("token %d; the floor %d was raised before the acquiring transaction reached etcd", g.Token, floor)
	}
	fcCheck(t, ctx, b, g, a, c)
}

// Two acquires on one backend with different snapshots: g1 took its
// snapshot, then a raises the floor and g2 (same backend) acquires in
// full (its retry refreshes the shared cache) before g1's transaction is
// evaluated with g1's older snapshot. Both tokens are above the floor,
// and g1's is above g2's (granted later).
func TestConcurrentSnapshotsOneBackend(t *testing.T) {
	ctx, a, c, b, kv := fcPair(t)
	var floor driver.Token
	var g2 driver.Grant
	var g2err error
	var once sync.Once
	kv.set(func(i fcInfo) {
		if !strings.HasPrefix(i.entry, b.queuePrefix("g1")) {
			return
		}
		once.Do(func() {
			floor = fcRaise(t, ctx, a)
			g2, g2err = b.Acquire(ctx, lockReq("g2", "o2"))
		})
	}, nil)
	g1, err := b.Acquire(ctx, lockReq("g1", "o1"))
	kv.set(nil, nil)
	if err != nil || g2err != nil {
		t.Fatal(err, g2err)
	}
	if g1.Token <= floor || g2.Token <= floor || g1.Token <= g2.Token {
		t.Errorf("g1 %d, g2 %d (g2 granted first); the floor %d was raised before both", g1.Token, g2.Token, floor)
	}
	var g1tx []fcInfo
	for _, i := range kv.acquires() {
		if strings.HasPrefix(i.entry, b.queuePrefix("g1")) {
			g1tx = append(g1tx, i)
		}
	}
	if len(g1tx) != 2 || g1tx[0].resp.Succeeded {
		t.Errorf("g1's transactions %+v; want its stale compare to fail once", g1tx)
	}
	fcCheck(t, ctx, b, g1, a, c)
	fcCheck(t, ctx, b, g2, a, c)
}

// held racing observe: b's transaction is granted at R; before acquire
// records it (held), a raises the floor (segment at W > R) and b reads
// the new floor (the cache moves on, read above R). held must not
// extend the new cache, and the token of R must be mapped with the offset
// in force at R (the old one), consistently with other backends; the
// grant renews and rotates (above the floor) with the mapping.
func TestHeldRacesObserve(t *testing.T) {
	ctx := ctxT(t)
	bs := openFresh(t, 2)
	a, c := bs[0], bs[1]
	b, kv := fcBackend(t, a)
	if _, err := a.HighWater(ctx, ""); err != nil {
		t.Fatal(err)
	}
	fcRaise(t, ctx, a) // a non-zero offset first
	fcWarm(t, ctx, b)
	mod0, _, off0 := fcCache(b)
	var floor driver.Token
	var rev int64
	var once sync.Once
	kv.set(nil, func(i fcInfo) (*clientv3.TxnResponse, error) {
		once.Do(func() {
			if i.err != nil || !i.resp.Succeeded || !i.cmpFloor || i.fmod != mod0 {
				t.Errorf("the acquiring transaction %+v; want a granted compare of mod %d", i, mod0)
				return
			}
			rev = i.resp.Header.Revision
			floor = fcRaise(t, ctx, a)
			if _, _, err := b.readFloor(ctx); err != nil {
				t.Error(err)
			}
		})
		return i.resp, i.err
	})
	g, err := b.Acquire(ctx, lockReq("k", "o"))
	kv.set(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := driver.Token(rev + off0); g.Token != want {
		t.Errorf("token %d; want %d (revision %d + the offset %d in force at it)", g.Token, want, rev, off0)
	}
	if mod, at, off := fcCache(b); mod == mod0 || at <= rev || off == off0 {
		t.Errorf("cache after the race: mod %d, at %d, offset %d; want the raised floor (not mod %d), read above %d", mod, at, off, mod0, rev)
	}
	fcCheck(t, ctx, b, g, a, c)
	r, err := b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL, Rotate: true})
	if err != nil || r.Token <= floor {
		t.Fatalf("rotation = %+v, %v; want a token above the floor %d", r, err, floor)
	}
	fcCheck(t, ctx, b, r, a, c)
	if err := c.Release(ctx, g); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Release with the pre-rotation token = %v; want ErrNotHeld", err)
	}
	if err := b.Release(ctx, r); err != nil {
		t.Error(err)
	}
}

// The other order of held and observe: the cache is refreshed (same
// floor key version, read at a higher revision) between the snapshot and
// the commit; held then extends it to the grant's revision.
func TestObserveSameVersionInWindow(t *testing.T) {
	ctx := ctxT(t)
	bs := openFresh(t, 2)
	a, c := bs[0], bs[1]
	b, kv := fcBackend(t, a)
	fcRaise(t, ctx, a)
	fcWarm(t, ctx, b)
	_, _, off0 := fcCache(b)
	var once sync.Once
	kv.set(func(fcInfo) {
		once.Do(func() {
			if _, err := b.HighWater(ctx, ""); err != nil {
				t.Error(err)
			}
		})
	}, nil)
	kv.reset()
	g, err := b.Acquire(ctx, lockReq("k", "o"))
	kv.set(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := kv.acquires()
	if len(log) != 1 || !log[0].resp.Succeeded {
		t.Fatalf("acquiring transactions %+v; want one grant", log)
	}
	if want := driver.Token(log[0].resp.Header.Revision + off0); g.Token != want {
		t.Errorf("token %d; want %d", g.Token, want)
	}
	if _, at, _ := fcCache(b); at < log[0].resp.Header.Revision {
		t.Errorf("cache exact up to %d after a grant at %d proved the cached version current", at, log[0].resp.Header.Revision)
	}
	fcCheck(t, ctx, b, g, a, c)
}

// A raise on the backend itself updates its cache: the next acquire is
// one transaction (no failed compare, no read) and its token is above
// the floor. With a warm cache and no raise, an acquire is exactly one
// request, and mapping its token reads nothing (so it cannot fail after
// the entry was put).
func TestRaiseOnSameBackend(t *testing.T) {
	ctx, a, b, kv := fcOne(t)
	kv.reset()
	g, err := b.Acquire(ctx, lockReq("k0", "o"))
	if err != nil {
		t.Fatal(err)
	}
	if n, m := kv.txns.Load(), kv.gets.Load(); n != 1 || m != 0 {
		t.Errorf("a warm Acquire sent %d transactions and %d reads; want 1 and 0", n, m)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	hw, err := b.HighWater(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	floor := hw.Global + 1_000_000 // a new segment; nothing read after the raise
	if err := b.RaiseFloor(ctx, "", floor); err != nil {
		t.Fatal(err)
	}
	kv.reset()
	g, err = b.Acquire(ctx, lockReq("k1", "o"))
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= floor {
		t.Errorf("token %d after RaiseFloor(%d) on the same backend", g.Token, floor)
	}
	if n, m := kv.txns.Load(), kv.gets.Load(); n != 1 || m != 0 {
		t.Errorf("Acquire after the backend's own raise sent %d transactions and %d reads; want 1 and 0 (the raise updates the cache)", n, m)
	}
	fcCheck(t, ctx, b, g, a)
}

// The compare fails on both the queue (held by another) and the floor
// (raised by a third backend): a HeldError naming the holder with its
// token unchanged by the raise; once released, a grant above the floor
// and above the holder's token.
func TestHeldAndFloorMoved(t *testing.T) {
	ctx := ctxT(t)
	bs := openFresh(t, 3)
	a, h, c := bs[0], bs[1], bs[2]
	b, _ := fcBackend(t, a)
	fcWarm(t, ctx, b)
	hg, err := h.Acquire(ctx, lockReq("k", "holder"))
	if err != nil {
		t.Fatal(err)
	}
	floor := fcRaise(t, ctx, a)
	_, err = b.Acquire(ctx, lockReq("k", "o"))
	var held *driver.HeldError
	if !errors.As(err, &held) || held.Holder.Owner != "holder" || held.Holder.Token != hg.Token {
		t.Fatalf("Acquire of a held key after a raise = %v; want a HeldError naming holder with token %d", err, hg.Token)
	}
	fcCheck(t, ctx, h, hg, a, b, c)
	if err := h.Release(ctx, hg); err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(ctx, lockReq("k", "o"))
	if err != nil {
		t.Fatal(err)
	}
	if g.Token <= floor || g.Token <= hg.Token {
		t.Errorf("token %d; want above the floor %d and the previous holder's %d", g.Token, floor, hg.Token)
	}
	fcCheck(t, ctx, b, g, a, c)
}

// A retry of an acquire whose reply was lost (the "head is our own entry"
// path): with a raise between the lost grant and the retry the entry is
// re-put above the floor; without one the retry returns the lost grant's
// token as mapped then. Either way one entry.
func TestLostReplyRetry(t *testing.T) {
	for _, raise := range []bool{true, false} {
		t.Run(fmt.Sprintf("raise=%v", raise), func(t *testing.T) {
			ctx := ctxT(t)
			bs := openFresh(t, 2)
			a, c := bs[0], bs[1]
			b, kv := fcBackend(t, a)
			fcRaise(t, ctx, a)
			fcWarm(t, ctx, b)
			_, _, off0 := fcCache(b)
			var floor driver.Token
			var rev int64
			var once sync.Once
			kv.set(nil, func(i fcInfo) (*clientv3.TxnResponse, error) {
				lost := false
				once.Do(func() {
					if i.err != nil || !i.resp.Succeeded {
						t.Errorf("first acquiring transaction %+v; want a grant", i)
						return
					}
					rev, lost = i.resp.Header.Revision, true
					if raise {
						floor = fcRaise(t, ctx, a)
					}
				})
				if lost {
					return nil, errReplyLost
				}
				return i.resp, i.err
			})
			if _, err := b.Acquire(ctx, lockReq("k", "o")); !errors.Is(err, errReplyLost) {
				t.Fatalf("Acquire with its reply lost = %v", err)
			}
			g, err := b.Acquire(ctx, lockReq("k", "o"))
			kv.set(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if raise && g.Token <= floor {
				t.Errorf("retry after RaiseFloor(%d): token %d", floor, g.Token)
			}
			if !raise && g.Token != driver.Token(rev+off0) {
				t.Errorf("retry: token %d; want the lost grant's %d", g.Token, rev+off0)
			}
			if n := queueLen(t, a, "k"); n != 1 {
				t.Errorf("%d entries after the retry; want 1", n)
			}
			fcCheck(t, ctx, b, g, a, c)
		})
	}
}

// Defect found in review of 5a7ad5d (fixed): a free key, and the floor
// key moves between each of acquire's snapshots and its transaction, so
// the floor compare fails every time. 5a7ad5d retried three moves, and a
// fourth made Acquire return a HeldError (ErrNotAcquired, "a definite
// answer": the key is held) for a key nobody held at any point. A
// transaction that failed on the floor is now followed by one that reads
// the floor instead of comparing it, and cannot fail on it. The moves here are raises on another backend that only rewrite
// the floor key (a floor just above the tokens issued now, what a dual
// backend levelling its lower side sends); raises with new segments do
// the same. Through the engine, TryAcquire reports ErrNotAcquired.
func TestFreeKeyUnderFloorChurn(t *testing.T) {
	for _, moves := range []int{1, 4, 10} {
		t.Run(fmt.Sprintf("moves=%d", moves), func(t *testing.T) {
			ctx, a, c, b, kv := fcPair(t)
			kv.reset()
			var mu sync.Mutex
			done := 0
			var floor driver.Token
			kv.set(func(fcInfo) {
				mu.Lock()
				defer mu.Unlock()
				if done == moves {
					return
				}
				done++
				hw, err := a.HighWater(ctx, "")
				if err != nil {
					t.Error(err)
					return
				}
				floor = hw.Global + 1
				r0, _, err := a.readFloor(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if err := a.RaiseFloor(ctx, "", floor); err != nil {
					t.Error(err)
				}
				if r1, _, err := a.readFloor(ctx); err != nil || len(r1.Kvs) == 0 || len(r0.Kvs) > 0 && r1.Kvs[0].ModRevision == r0.Kvs[0].ModRevision {
					t.Errorf("RaiseFloor(%d) did not move the floor key: %v", floor, err)
				}
				if q := queueLen(t, a, "k"); q != 0 {
					t.Errorf("queue of k has %d entries", q)
				}
			}, nil)
			g, err := b.Acquire(ctx, lockReq("k", "o"))
			kv.set(nil, nil)
			log := kv.acquires()
			if err != nil {
				t.Fatalf("Acquire of a free key while the floor key moved %d times: %v (%d acquiring transactions, none granted)", moves, err, len(log))
			}
			if g.Token <= floor {
				t.Errorf("token %d after RaiseFloor(%d)", g.Token, floor)
			}
			if len(log) != 2 || log[1].cmpFloor {
				t.Errorf("%d acquiring transactions (%+v); want 2: the compare that failed on the floor, then one that reads it", len(log), log)
			}
			fcCheck(t, ctx, b, g, a, c)
		})
	}
}

// Found in review of 5a7ad5d (fixed; performance): a floor compare that
// failed on a free key marked the key hot (b.hot.Mark before the
// read-only transaction), so the next Acquire of that key within a second
// first read the queue: two requests instead of one, although nobody
// held it. A key is now marked hot only when the read finds it held.
func TestFloorMoveDoesNotMarkKeyHot(t *testing.T) {
	ctx, a, b, kv := fcOne(t)
	fcRaise(t, ctx, a)
	g, err := b.Acquire(ctx, lockReq("k", "o"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	kv.reset()
	g, err = b.Acquire(ctx, lockReq("k", "o2"))
	if err != nil {
		t.Fatal(err)
	}
	if n, m := kv.txns.Load(), kv.gets.Load(); n != 1 || m != 0 {
		t.Errorf("Acquire of a key that was never held, after a floor move: %d transactions, %d reads; want 1 and 0 (hot: %v)", n, m, b.hot.Hot("k"))
	}
	_ = b.Release(ctx, g)
}

// The floor key rewritten by hand: with the same meaning (explicit
// starts, new mod revision) b's stale compare fails and the retry, which
// reads the floor, grants with the same offset; with a value that does not parse the acquire
// fails and leaves no entry; deleted, b re-reads it and maps its tokens
// as every other backend does (the tokens drop to the revisions: an
// operator's deletion loses the offsets, as before 5a7ad5d).
func TestFloorKeyRewrittenByHand(t *testing.T) {
	ctx := ctxT(t)
	bs := openFresh(t, 2)
	a, c := bs[0], bs[1]
	b, kv := fcBackend(t, a)
	raw := rawClient(t, a)
	fcRaise(t, ctx, a)
	fcWarm(t, ctx, b)
	mod0, _, off0 := fcCache(b)
	resp, err := raw.Get(ctx, a.floorKey())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatal(resp, err)
	}
	h, err := parseHistory(resp.Kvs[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Put(ctx, a.floorKey(), h.EncodeOffsets()); err != nil {
		t.Fatal(err)
	}
	kv.reset()
	g, err := b.Acquire(ctx, lockReq("k1", "o"))
	if err != nil {
		t.Fatalf("Acquire after the floor key was re-put with the same segments: %v", err)
	}
	log := kv.acquires()
	if len(log) != 2 || log[0].resp.Succeeded || !log[0].cmpFloor || log[0].fmod != mod0 || log[1].cmpFloor {
		t.Errorf("acquiring transactions %+v; want the stale compare to fail, then one that reads the floor", log)
	}
	if want := driver.Token(log[len(log)-1].resp.Header.Revision + off0); g.Token != want {
		t.Errorf("token %d; want %d (same offset)", g.Token, want)
	}
	fcCheck(t, ctx, b, g, a, c)

	if _, err := raw.Put(ctx, a.floorKey(), "garbage"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, lockReq("k2", "o")); !errors.Is(err, errFloorKey) {
		t.Errorf("Acquire with the floor key unparsable = %v; want errFloorKey", err)
	}
	if n := queueLen(t, a, "k2"); n != 0 {
		t.Errorf("a failed Acquire (unparsable floor key) left %d entries", n)
	}
	if _, err := raw.Put(ctx, a.floorKey(), h.EncodeOffsets()); err != nil {
		t.Fatal(err)
	}

	if _, err := raw.Delete(ctx, a.floorKey()); err != nil {
		t.Fatal(err)
	}
	kv.reset()
	g2, err := b.Acquire(ctx, lockReq("k3", "o"))
	if err != nil {
		t.Fatalf("Acquire after the floor key was deleted: %v", err)
	}
	if log := kv.acquires(); len(log) != 2 || log[0].resp.Succeeded {
		t.Errorf("acquiring transactions %+v; want the stale compare to fail once", log)
	}
	fcCheck(t, ctx, b, g2, a, c)
	if g2.Token < g.Token {
		t.Logf("after deleting the floor key by hand: token %d, below the earlier %d (the operator's deletion drops the offsets, as before 5a7ad5d)", g2.Token, g.Token)
	}
}

// Defect older than 5a7ad5d, found in its review (fixed): a backend with
// no cached floor reads the floor key in the acquiring transaction, after
// the entry is put; an unparsable floor key made Acquire return an error
// with the entry left in the queue (on the backend's shared lease, so it
// lived as long as the backend renewed anything), and the key held by a
// ghost. The entry is now deleted (or, failing that, left to the sweep).
func TestFreshBackendBadFloorKeyLeavesNoEntry(t *testing.T) {
	ctx := ctxT(t)
	bs := openFresh(t, 1)
	a := bs[0]
	b, _ := fcBackend(t, a) // nothing cached
	raw := rawClient(t, a)
	if _, err := raw.Put(ctx, a.floorKey(), "garbage"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, lockReq("k", "o")); !errors.Is(err, errFloorKey) {
		t.Errorf("Acquire with the floor key unparsable = %v; want errFloorKey", err)
	}
	if n := queueLen(t, a, "k"); n != 0 {
		t.Errorf("a failed Acquire (unparsable floor key, no cached floor) left %d entries: %v", n, queueDump(t, a, a, "k"))
	}
}

// Renew with rotation and AcquireWait on a backend whose cache was
// extended by held (its last grant) and is stale after a raise elsewhere:
// both map through a fresh read, above the floor.
func TestRotateAndWaitAfterForeignRaise(t *testing.T) {
	ctx := ctxT(t)
	bs := openFresh(t, 2)
	a, c := bs[0], bs[1]
	b, _ := fcBackend(t, a)
	fcWarm(t, ctx, b)
	g, err := b.Acquire(ctx, lockReq("k", "o"))
	if err != nil {
		t.Fatal(err)
	}
	floor := fcRaise(t, ctx, a)
	fcCheck(t, ctx, b, g, a, c)
	r, err := b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL, Rotate: true})
	if err != nil || r.Token <= floor {
		t.Fatalf("rotation after RaiseFloor(%d) = %+v, %v", floor, r, err)
	}
	fcCheck(t, ctx, b, r, a, c)
	floor2 := fcRaise(t, ctx, a)
	w, err := b.AcquireWait(ctx, lockReq("kw", "w"))
	if err != nil || w.Token <= floor2 {
		t.Fatalf("AcquireWait after RaiseFloor(%d) = %+v, %v", floor2, w, err)
	}
	fcCheck(t, ctx, b, w, a, c)
	// And a waiter of b queued behind b's own holder, granted after a raise.
	ch := waitFor(ctx, b, "k", "w2")
	awaitQueue(t, a, "k", 2)
	floor3 := fcRaise(t, ctx, a)
	if err := b.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	res := <-ch
	if res.err != nil || res.g.Token <= floor3 || res.g.Token <= r.Token {
		t.Fatalf("waiter granted after RaiseFloor(%d) = %+v, %v; previous holder %d", floor3, res.g, res.err, r.Token)
	}
	if n, err := b.Renew(ctx, res.g, driver.RenewRequest{TTL: fenceTTL}); err != nil || n.Token <= floor3 {
		t.Fatalf("the waiter's confirmation = %+v, %v", n, err)
	}
}

// Many acquires on one backend (each goroutine its own keys, so its own
// snapshots) while another backend raises the floor now and then: every
// token is above every floor whose raise returned before the acquire
// began, tokens per key increase, and the grants map back (Renew).
func TestConcurrentAcquiresAndRaises(t *testing.T) {
	ctx := ctxT(t)
	a := openFresh(t, 1)[0]
	b, _ := fcBackend(t, a)
	fcWarm(t, ctx, b)
	const workers, rounds, every = 4, 25, 6
	var raised atomic.Uint64 // the highest floor whose raise returned
	progress := make(chan struct{}, workers*rounds)
	stop := make(chan struct{})
	raiserDone := make(chan struct{})
	go func() {
		defer close(raiserDone)
		n := 0
		for {
			select {
			case <-stop:
				return
			case <-progress:
			}
			if n++; n%every != 0 {
				continue
			}
			if f := fcRaise(t, ctx, a); f != 0 {
				raised.Store(uint64(f))
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var prev [2]driver.Token
			for i := range rounds {
				key := fmt.Sprintf("w%d-%d", w, i%2)
				before := driver.Token(raised.Load())
				g, err := b.Acquire(ctx, lockReq(key, fmt.Sprintf("o%d-%d", w, i)))
				if err != nil {
					t.Errorf("worker %d round %d: %v", w, i, err)
					return
				}
				if g.Token <= before || g.Token <= prev[i%2] {
					t.Errorf("worker %d round %d: token %d; floor raised before it %d, previous token of %s %d", w, i, g.Token, before, key, prev[i%2])
				}
				prev[i%2] = g.Token
				if r, err := b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL}); err != nil || r.Token != g.Token {
					t.Errorf("worker %d round %d: Renew = %+v, %v", w, i, r, err)
				}
				if err := b.Release(ctx, g); err != nil {
					t.Errorf("worker %d round %d: Release: %v", w, i, err)
				}
				progress <- struct{}{}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-raiserDone
	if raised.Load() == 0 {
		t.Error("no raise ran")
	}
}
