package etcd

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// heldReadKV is an etcd client's KV whose next read-only transaction,
// once armed, is held (see hold). Writing transactions pass.
type heldReadKV struct {
	clientv3.KV
	*hold
}

func (k *heldReadKV) Txn(ctx context.Context) clientv3.Txn {
	return &hookTxn{Txn: k.KV.Txn(ctx), commit: k.commit}
}

func (k *heldReadKV) commit(writes bool, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	resp, err := commit()
	if !writes {
		k.answered()
	}
	return resp, err
}

// keptAfterCrash is an etcd client's Lease that records every keep-alive
// the server accepted once crashed is set.
type keptAfterCrash struct {
	clientv3.Lease
	crashed atomic.Bool
	mu      sync.Mutex
	kept    []string
}

func (l *keptAfterCrash) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	after := l.crashed.Load()
	resp, err := l.Lease.KeepAliveOnce(ctx, id)
	if after && err == nil {
		l.mu.Lock()
		l.kept = append(l.kept, fmt.Sprintf("lease %x: TTL reset to %ds", int64(id), resp.TTL))
		l.mu.Unlock()
	}
	return resp, err
}

func (l *keptAfterCrash) after() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.kept...)
}

// TestInFlightAcquireRetryKeepsNoLeaseAlive: a call in flight
// at the crash sends no keep-alive after it. keepLease keeps a lease that
// is none of the backend's sessions' (a grant made by another Backend of
// the same process) alive with a direct KeepAliveOnce, which until
// d2b39ab never looked at closed: it reset the lease's TTL after the
// death, and the call even answered with a grant. (Until e0b1012 the
// crash hook also zeroed the sessions' ids, which sent the backend's own
// leases down that path too.)
//
// The call here is an Acquire, on the crashing backend, by the owner of a
// grant that another Backend made: its put fails (the queue holds the
// owner's entry), its read of the queue's head is on the wire at the
// crash and answered after it, and the path then calls keepLease for the
// entry's lease (etcd.go, acquire: "mine := head"). RenewBatch and Renew
// take the same path for such a grant.
func TestInFlightAcquireRetryKeepsNoLeaseAlive(t *testing.T) {
	ctx := ctxT(t)
	base := open(t)
	key := "crash-retry-keepalive-" + newBackendID() // fresh under -count: open reuses the test's prefix
	h := newHold()
	var ll *keptAfterCrash
	b := onClient(t, base, func(cli *clientv3.Client) {
		cli.KV = &heldReadKV{cli.KV, h}
		ll = &keptAfterCrash{Lease: cli.Lease}
		cli.Lease = ll
	})
	g, err := base.Acquire(ctx, lockReq(key, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	id, ok := parseHandle(g.Handle)
	if !ok {
		t.Fatalf("grant handle %q names no lease", g.Handle)
	}
	// The retry on b: its put fails (the queue holds the owner's entry),
	// and its read of the head is held across the crash.
	var retried driver.Grant
	err = acrossCrash(t, ctx, b, h, func() { ll.crashed.Store(true) }, func() (err error) {
		retried, err = b.Acquire(ctx, lockReq(key, "h1"))
		return err
	})
	if kept := ll.after(); len(kept) > 0 {
		t.Fatalf("an Acquire in flight at the crash kept lease %x alive after it (%q; the retry returned token %d, err %v); a dead process keeps nothing alive",
			int64(id), kept, retried.Token, err)
	}
}

// heldGetKV is an etcd client's KV whose next Get of key, once armed, is
// held (see hold).
type heldGetKV struct {
	clientv3.KV
	key string
	*hold
}

func (k *heldGetKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if key == k.key {
		k.answered()
	}
	return resp, err
}

// TestInFlightReleaseDeletesNothing: a Release under way at
// the crash does not delete the entry after it. Until d2b39ab release
// checked closed once, at the start: a grant without a Handle (the
// engine's clean-up by owner, built from Inspect: abandonOnce,
// holdRenew's and keepUntil's fallbacks) is first looked up by its token
// with a Get, and the guarded delete followed whatever closed said by
// then, so the crashed holder's key was free at once, not after its TTL,
// and a case that waits for a crashed holder's record to expire was
// satisfied by the release instead.
func TestInFlightReleaseDeletesNothing(t *testing.T) {
	ctx := ctxT(t)
	base := open(t)
	key := "crash-release-" + newBackendID() // fresh under -count: open reuses the test's prefix
	h := newHold()
	b := onClient(t, base, func(cli *clientv3.Client) { cli.KV = &heldGetKV{cli.KV, base.queuePrefix(key), h} })
	g, entry := acquireEntry(t, ctx, b, lockReq(key, "h1"))
	// The engine's clean-up by owner: the grant as Inspect reports it.
	byOwner := driver.Grant{Key: g.Key, Owner: g.Owner, Token: g.Token}
	rerr := acrossCrash(t, ctx, b, h, nil, func() error { return b.Release(ctx, byOwner) })
	resp, err := base.cli.Get(ctx, entry)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("the crashed holder's entry %q was deleted after the crash by a Release under way (it returned %v): want it left to expire with its lease, as a dead process leaves it", entry, rerr)
	}
}
