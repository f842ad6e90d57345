package etcd

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// heldReadKV is an etcd client's KV whose next read-only transaction, once
// armed, reaches the server and then holds its answer back: it reports on
// sent and answers when release is closed. (Writing transactions pass.)
type heldReadKV struct {
	clientv3.KV
	armed   atomic.Bool
	sent    chan struct{}
	release chan struct{}
}

func (k *heldReadKV) Txn(ctx context.Context) clientv3.Txn {
	return &hookTxn{Txn: k.KV.Txn(ctx), commit: k.commit}
}

func (k *heldReadKV) commit(writes bool, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	resp, err := commit()
	if !writes && k.armed.CompareAndSwap(true, false) {
		close(k.sent)
		<-k.release
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

// TestReviewCrashInFlightAcquireRetryKeepsNoLeaseAlive: a call in flight
// at the crash sends no keep-alive of the dead backend's lease after it.
// Until d2b39ab the crash hook zeroed every session's lease id, and
// keepLease, finding the lease in no session (sessionOf), kept it alive
// with a direct KeepAliveOnce that never looked at closed and was not
// limited to a stale lease: it reset the lease's TTL after the death, and
// the call even answered with a grant. (The hook no longer zeroes the ids;
// session.fresh and keepLease refuse once closed.)
//
// The call here is an Acquire retry by the holder's own owner (the engine's
// retry after a lost reply): its read of the queue's head is on the wire
// at the crash, and its answer arrives after it; the path then calls
// keepLease for the entry's lease (etcd.go, acquire: "mine := head").
// RenewBatch (keepLease per lease, and per handle-less grant after the
// reads) and Renew (a grant whose lease was no session's when it started)
// take the same path.
func TestReviewCrashInFlightAcquireRetryKeepsNoLeaseAlive(t *testing.T) {
	ctx := ctxT(t)
	base := open(t)
	key := "crash-retry-keepalive-" + newBackendID() // fresh under -count: open reuses the test's prefix
	cli := rawClient(t, base)
	kv := &heldReadKV{KV: cli.KV, sent: make(chan struct{}), release: make(chan struct{})}
	cli.KV = kv
	ll := &keptAfterCrash{Lease: cli.Lease}
	cli.Lease = ll
	b, err := New(ctx, cli, &Options{Prefix: base.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	g, err := b.Acquire(ctx, lockReq(key, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	id, ok := parseHandle(g.Handle)
	if !ok {
		t.Fatalf("grant handle %q names no lease", g.Handle)
	}
	// The retry: its put fails (the queue holds our entry), and its read
	// of the head is held across the crash.
	kv.armed.Store(true)
	type result struct {
		token uint64
		err   error
	}
	retried := make(chan result, 1)
	go func() {
		g, err := b.Acquire(ctx, lockReq(key, "h1"))
		retried <- result{uint64(g.Token), err}
	}()
	select {
	case <-kv.sent:
	case r := <-retried:
		t.Fatalf("the Acquire retry returned (token %d, %v) without reading the queue's head", r.token, r.err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	b.crash()
	ll.crashed.Store(true)
	// The session's last keep-alive is recent, as it would be a moment
	// after a grant: no uncrashed backend sends a keep-alive now, so any
	// keep-alive below is the crash's doing. (Without this, a slow run
	// could make the session stale, and a keep-alive of an in-flight call
	// through the session would be no different from dying a moment
	// later.)
	s := b.session(fenceTTL)
	s.mu.Lock()
	s.expiry = time.Now().Add(s.granted)
	s.mu.Unlock()
	close(kv.release)
	var r result
	select {
	case r = <-retried:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if kept := ll.after(); len(kept) > 0 {
		t.Fatalf("an Acquire in flight at the crash kept lease %x alive after it (%q; the retry returned token %d, err %v): the crash zeroed the sessions' lease ids, so keepLease took its direct KeepAliveOnce, which ignores closed; a dead process keeps nothing alive",
			int64(id), kept, r.token, r.err)
	}
}

// heldGetKV is an etcd client's KV whose next Get of key, once armed,
// reaches the server and then holds its answer back (as heldReadKV).
type heldGetKV struct {
	clientv3.KV
	key     string
	armed   atomic.Bool
	sent    chan struct{}
	release chan struct{}
}

func (k *heldGetKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if key == k.key && k.armed.CompareAndSwap(true, false) {
		close(k.sent)
		<-k.release
	}
	return resp, err
}

// TestReviewCrashInFlightReleaseDeletesNothing: a Release under way at
// the crash deletes the entry after it. release checks closed once, at the
// start; a grant without a Handle (the engine's clean-up by owner, built
// from Inspect: abandonOnce, holdRenew's and keepUntil's fallbacks) is
// first looked up by its token with a Get, and the guarded delete follows
// whatever closed says by then. The crash lets that delete through, and
// the crashed holder's key is free at once, not after its TTL: the rule
// of docs/writing-a-backend.md ("nothing revoked, released or deleted,
// including by calls and goroutines already under way") is broken, and a
// case that waits for a crashed holder's record to expire would be
// satisfied by the release instead (cutting the connection, as the
// ZooKeeper hook does, stops it).
func TestReviewCrashInFlightReleaseDeletesNothing(t *testing.T) {
	ctx := ctxT(t)
	base := open(t)
	key := "crash-release-" + newBackendID() // fresh under -count: open reuses the test's prefix
	cli := rawClient(t, base)
	kv := &heldGetKV{KV: cli.KV, key: base.queuePrefix(key), sent: make(chan struct{}), release: make(chan struct{})}
	cli.KV = kv
	b, err := New(ctx, cli, &Options{Prefix: base.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	g, err := b.Acquire(ctx, lockReq(key, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	name, ok := handleName(g.Handle)
	if !ok {
		t.Fatalf("grant handle %q names no entry", g.Handle)
	}
	entry := base.queuePrefix(key) + name
	// The engine's clean-up by owner: the grant as Inspect reports it.
	byOwner := driver.Grant{Key: g.Key, Owner: g.Owner, Token: g.Token}
	kv.armed.Store(true)
	released := make(chan error, 1)
	go func() { released <- b.Release(ctx, byOwner) }()
	select {
	case <-kv.sent:
	case err := <-released:
		t.Fatalf("Release returned (%v) without looking the entry up", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	b.crash()
	close(kv.release)
	var rerr error
	select {
	case rerr = <-released:
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	resp, err := base.cli.Get(ctx, entry)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("the crashed holder's entry %q was deleted after the crash by a Release under way (it returned %v): want it left to expire with its lease, as a dead process leaves it", entry, rerr)
	}
}
