package etcd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// lossyKV is an etcd client's KV with a switch that drops the reply of the
// next writing transaction after the server has applied it: what a client
// sees when its connection fails between the commit and the answer.
type lossyKV struct {
	clientv3.KV
	drop atomic.Bool
}

var errReplyLost = errors.New("test: reply lost after the server applied the transaction")

func (k *lossyKV) Txn(ctx context.Context) clientv3.Txn {
	return &hookTxn{Txn: k.KV.Txn(ctx), commit: k.commit}
}

func (k *lossyKV) commit(writes bool, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	resp, err := commit()
	if err == nil && writes && k.drop.CompareAndSwap(true, false) {
		return nil, errReplyLost
	}
	return resp, err
}

// hookTxn is a transaction that notes whether it writes (a put, delete or
// nested transaction in either branch) and commits through commit, which
// gets that and the plain commit: the fault-injecting KVs of these tests
// wrap their transactions in it.
type hookTxn struct {
	clientv3.Txn
	writes bool
	commit func(writes bool, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error)
}

func (t *hookTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }

func (t *hookTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.note(ops)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *hookTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.note(ops)
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *hookTxn) note(ops []clientv3.Op) {
	for _, op := range ops {
		if op.IsPut() || op.IsDelete() || op.IsTxn() {
			t.writes = true
		}
	}
}

func (t *hookTxn) Commit() (*clientv3.TxnResponse, error) { return t.commit(t.writes, t.Txn.Commit) }

// backendVia returns a backend on other's prefix (closed at the end of the
// test) whose client's KV is wrap of a fresh client's, and that client.
func backendVia(t *testing.T, other *Backend, wrap func(clientv3.KV) clientv3.KV) (*Backend, *clientv3.Client) {
	t.Helper()
	cli := rawClient(t, other)
	cli.KV = wrap(cli.KV)
	b, err := New(t.Context(), cli, &Options{Prefix: other.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, cli
}

// lossyBackend returns a backend on other's prefix whose client drops the
// reply of the next writing transaction when lossy.drop is set.
func lossyBackend(t *testing.T, other *Backend) (*Backend, *lossyKV) {
	t.Helper()
	lossy := new(lossyKV)
	b, _ := backendVia(t, other, func(kv clientv3.KV) clientv3.KV { lossy.KV = kv; return lossy })
	return b, lossy
}

// A rotation whose reply is lost leaves the owner's entry re-put under a
// token its owner never learned: the retry with the old token is answered
// ErrNotHeld, and the entry, on the backend's shared lease, stays alive as
// long as the backend renews anything. The engine's clean-up by owner
// (Inspect, then Release of a grant built from it, Handle empty) removes
// it: the key is free for another client at once, and nothing of the
// owner is left on the shared lease.
func TestRotationWithLostReplyOwnerCleanupFreesKey(t *testing.T) {
	ctx := ctxT(t)
	const key, owner = "ghost", "owner"
	other := open(t) // another client on the same prefix
	lossy := new(lossyKV)
	b, cli := backendVia(t, other, func(kv clientv3.KV) clientv3.KV { lossy.KV = kv; return lossy })

	// A second lock keeps the backend's shared lease renewed throughout.
	keeper, err := b.Acquire(ctx, lockReq("ghost-keeper", "keeper"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(ctx, lockReq(key, owner))
	if err != nil {
		t.Fatal(err)
	}
	lossy.drop.Store(true)
	if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL, Rotate: true}); err == nil || errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("rotating Renew with its reply lost = %v; want a transient error", err)
	}
	if lossy.drop.Load() {
		t.Fatal("the rotation wrote nothing")
	}
	info, err := other.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Owner != owner || info.Token <= g.Token {
		t.Fatalf("after the lost rotation Inspect = %+v; want %q holding with a token above %d", info, owner, g.Token)
	}
	// The engine retries with the grant it knows: not held, nothing changed.
	for _, rotate := range []bool{false, true} {
		if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL, Rotate: rotate}); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Renew (Rotate %v) with the pre-rotation token = %v; want ErrNotHeld", rotate, err)
		}
	}
	if err := b.Release(ctx, g); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release with the pre-rotation token = %v; want ErrNotHeld", err)
	}
	// The ghost is still there, on the lease the keeper's renewals keep
	// alive.
	if keeper, err = b.Renew(ctx, keeper, driver.RenewRequest{TTL: fenceTTL}); err != nil {
		t.Fatal(err)
	}
	if now, err := other.Inspect(ctx, key); err != nil || now.Owner != info.Owner || now.Token != info.Token {
		t.Fatalf("Inspect = %+v, %v; want the re-put entry %+v still there", now, err, info)
	}
	if gl, kl := holderLease(t, b, key), holderLease(t, b, "ghost-keeper"); gl != kl {
		t.Fatalf("the re-put entry is on lease %x, the keeper on %x; want the shared lease", gl, kl)
	}
	if _, err := other.Acquire(ctx, lockReq(key, "next")); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire while the ghost is there = %v; want ErrNotAcquired", err)
	}

	// The engine's clean-up by owner: a grant built from Inspect.
	if err := b.Release(ctx, driver.Grant{Key: key, Owner: info.Owner, Token: info.Token}); err != nil {
		t.Fatalf("owner clean-up Release: %v", err)
	}
	next, err := other.Acquire(ctx, lockReq(key, "next"))
	if err != nil {
		t.Fatalf("Acquire by another client right after the clean-up: %v", err)
	}
	if next.Token <= info.Token {
		t.Fatalf("next holder's token %d not above the lost rotation's %d", next.Token, info.Token)
	}
	// Nothing of the owner lingers on the shared lease.
	resp, err := cli.Get(ctx, b.prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if ownerOf(kv) == owner || (kv.Lease != 0 && clientv3.LeaseID(kv.Lease) == holderLease(t, b, "ghost-keeper") && ownerOf(kv) != "keeper") {
			t.Errorf("left behind: %q = %q (lease %x)", kv.Key, kv.Value, kv.Lease)
		}
	}
	if err := other.Release(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, keeper); err != nil {
		t.Fatal(err)
	}
}

// The same for the re-put that settles a waited grant (its entry is older
// than the marker: a holder rotated after it queued) when that reply is
// lost: the engine's Renew and Release with the provisional token are
// answered ErrNotHeld, and the clean-up by owner frees the key at once.
func TestSettlingRePutWithLostReplyOwnerCleanupFreesKey(t *testing.T) {
	ctx := ctxT(t)
	const key, owner = "ghost-settle", "waiter"
	other := open(t)
	b, lossy := lossyBackend(t, other)

	h, err := other.Acquire(ctx, lockReq(key, "holder"))
	if err != nil {
		t.Fatal(err)
	}
	w := waitFor(ctx, b, key, owner)
	awaitQueue(t, other, key, 2)
	if h, err = other.Renew(ctx, h, driver.RenewRequest{TTL: fenceTTL, Rotate: true}); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	r := <-w
	if r.err != nil {
		t.Fatal(r.err)
	}
	lossy.drop.Store(true)
	if _, err := b.Renew(ctx, r.g, driver.RenewRequest{TTL: fenceTTL}); err == nil || errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("settling Renew with its reply lost = %v; want a transient error", err)
	}
	if lossy.drop.Load() {
		t.Fatal("the settling Renew wrote nothing: the marker was not newer than the entry")
	}
	info, err := other.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Owner != owner || info.Token <= h.Token {
		t.Fatalf("after the lost re-put Inspect = %+v; want %q holding with a token above the rotated %d", info, owner, h.Token)
	}
	if _, err := b.Renew(ctx, r.g, driver.RenewRequest{TTL: fenceTTL}); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Renew with the provisional token = %v; want ErrNotHeld", err)
	}
	if err := b.Release(ctx, r.g); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release with the provisional token = %v; want ErrNotHeld", err)
	}
	if err := b.Release(ctx, driver.Grant{Key: key, Owner: info.Owner, Token: info.Token}); err != nil {
		t.Fatalf("owner clean-up Release: %v", err)
	}
	next, err := other.Acquire(ctx, lockReq(key, "next"))
	if err != nil {
		t.Fatalf("Acquire by another client right after the clean-up: %v", err)
	}
	if next.Token <= info.Token {
		t.Fatalf("next holder's token %d not above the lost re-put's %d", next.Token, info.Token)
	}
	if err := other.Release(ctx, next); err != nil {
		t.Fatal(err)
	}
}
