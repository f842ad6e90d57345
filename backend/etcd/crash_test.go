package etcd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// hold holds back the answer of one request, once armed: the request
// reaches the server, then hold reports on sent and answers when release
// is closed. The fault-injecting clients of the crash tests share it.
type hold struct {
	armed   atomic.Bool
	sent    chan struct{}
	release chan struct{}
}

func newHold() *hold { return &hold{sent: make(chan struct{}), release: make(chan struct{})} }

// answered runs once a request was answered: the first answer after the
// hold was armed waits for release.
func (h *hold) answered() {
	if h.armed.CompareAndSwap(true, false) {
		close(h.sent)
		<-h.release
	}
}

// acrossCrash runs op with its held request across b's crash: op starts,
// the held request gets through, b crashes, atCrash (if not nil) runs,
// and then the answer arrives. It returns op's error.
func acrossCrash(t *testing.T, ctx context.Context, b *Backend, h *hold, atCrash func(), op func() error) error {
	t.Helper()
	h.armed.Store(true)
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case <-h.sent:
	case err := <-done:
		t.Fatalf("the call returned (%v) before its held request got through", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	b.crash()
	if atCrash != nil {
		atCrash()
	}
	close(h.release)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		t.Fatal(ctx.Err())
		return nil
	}
}

// onClient returns a Backend on base's prefix, on a client of its own
// that wrap fits with faults; it is closed at the end of the test.
func onClient(t *testing.T, base *Backend, wrap func(*clientv3.Client)) *Backend {
	t.Helper()
	cli := rawClient(t, base)
	wrap(cli)
	b, err := New(t.Context(), cli, &Options{Prefix: base.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// acquireEntry acquires on b and returns the grant and its entry's etcd
// key.
func acquireEntry(t *testing.T, ctx context.Context, b *Backend, req driver.AcquireRequest) (driver.Grant, string) {
	t.Helper()
	g, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	name, ok := handleName(g.Handle)
	if !ok {
		t.Fatalf("grant handle %q names no entry", g.Handle)
	}
	return g, b.queuePrefix(req.Key) + name
}

// heldKeepAlive is an etcd client's Lease whose next KeepAliveOnce, once
// armed, is held (see hold).
type heldKeepAlive struct {
	clientv3.Lease
	*hold
}

func (l *heldKeepAlive) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	resp, err := l.Lease.KeepAliveOnce(ctx, id)
	l.answered()
	return resp, err
}

// A Backend that dies while a keep-alive of its lease is on the wire
// leaves the lease to expire, as a dead process does: the crash used by
// the conformance suite must not revoke it when the answer arrives. (Close
// does revoke such a lease; a crash is not a Close.) In CI the suite's
// PerCallTTLHonoured failed this way: a keep-alive of the long lease in
// flight at the crash revoked it, and the long key was free 2.5s after the
// crash instead of after its 8s TTL.
func TestCrashWithKeepAliveInFlightRevokesNothing(t *testing.T) {
	ctx := ctxT(t)
	base := open(t)
	h := newHold()
	b := onClient(t, base, func(cli *clientv3.Client) { cli.Lease = &heldKeepAlive{cli.Lease, h} })
	g, err := b.Acquire(ctx, lockReq("crash-in-flight", "h1"))
	if err != nil {
		t.Fatal(err)
	}
	id, ok := parseHandle(g.Handle)
	if !ok {
		t.Fatalf("grant handle %q names no lease", g.Handle)
	}
	// Make the session's keep-alive stale, so the next Renew sends one.
	s := b.session(fenceTTL)
	s.mu.Lock()
	s.expiry = time.Now()
	s.mu.Unlock()
	// Whatever Renew says: the process is dead.
	_ = acrossCrash(t, ctx, b, h, nil, func() error {
		_, err := b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL})
		return err
	})
	ttl, err := base.cli.TimeToLive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL <= 0 {
		t.Fatalf("lease %x of a crashed backend: TimeToLive %d; want it left to expire (a dead process revokes nothing)", int64(id), ttl.TTL)
	}
	other := open(t)
	if _, err := other.Acquire(ctx, lockReq("crash-in-flight", "h2")); !errors.As(err, new(*driver.HeldError)) {
		t.Fatalf("Acquire by another backend after the crash = %v; want the crashed holder's entry still there", err)
	}
}

// A Backend that dies while one of its calls waits in a queue leaves its
// queue entry to expire with its lease, as a dead process does: the
// crash ends the wait (it cancels the backend's context, as Close does)
// but must not delete the entry the way a Close or a cancelled wait does.
// Otherwise every conformance case that crashes a waiter would see the
// queue freed at once and could not tell a backend that copes with a
// dead waiter from one that does not.
//
// The waiter's client is one the crash does not cut (onClient's), so that
// nothing but the backend's own check stands between the ended wait and
// the deletion; and its TTL outlasts anything the test waits for, so
// that the entry is not gone by expiry instead.
func TestCrashOfAWaiterDeletesNothing(t *testing.T) {
	ctx := ctxT(t)
	key := "crash-waiter-" + newBackendID() // fresh under -count: open reuses the test's prefix
	holder := open(t)
	waiter := onClient(t, holder, func(*clientv3.Client) {})
	if _, err := holder.Acquire(ctx, lockReq(key, "h1")); err != nil {
		t.Fatal(err)
	}
	qp := holder.queuePrefix(key)
	// Watch the queue from the holder's revision on: the waiter's entry
	// put is the event awaited.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := holder.cli.Watch(wctx, qp, clientv3.WithPrefix(), clientv3.WithFilterDelete())
	waited := make(chan error, 1)
	go func() {
		req := lockReq(key, "w1")
		req.TTL = 30 * time.Second
		_, err := waiter.AcquireWait(ctx, req)
		waited <- err
	}()
	var entry string
	for entry == "" {
		select {
		case resp, ok := <-wch:
			if !ok {
				t.Fatal("watch on the queue ended")
			}
			for _, ev := range resp.Events {
				if ownerOf(ev.Kv) == "w1" {
					entry = string(ev.Kv.Key)
				}
			}
		case err := <-waited:
			t.Fatalf("AcquireWait returned (%v) before queueing", err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	waiter.crash()
	if err := <-waited; err == nil {
		t.Fatal("AcquireWait of a crashed backend returned a grant")
	}
	resp, err := holder.cli.Get(ctx, entry)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Fatalf("the crashed waiter's entry %q was deleted; want it left to expire with its lease", entry)
	}
}

// A Renew with rotation whose read is on the wire at the crash does not
// re-put the entry after it: the crash cuts the connection of the client
// the backend owns, so the rotation's write, sent after its read came
// back, fails. (No flag check stands between that read and that write;
// the cut is what a dead process's is.)
func TestCrashCutsARotationInFlight(t *testing.T) {
	ctx := ctxT(t)
	base := open(t)
	h := newHold()
	b := onClient(t, base, func(cli *clientv3.Client) { cli.KV = &heldReadKV{cli.KV, h} })
	b.own = true // as Open's: the crash cuts its connection
	// A TTL that outlasts the failing write's retries (clientv3 retries a
	// request that was never sent for about 2.5s): the entry must still be
	// there, as it was, when Renew gives up.
	const ttl = 30 * time.Second
	key := "crash-rotation-" + newBackendID() // fresh under -count
	req := lockReq(key, "h1")
	req.TTL = ttl
	g, entry := acquireEntry(t, ctx, b, req)
	before, err := base.cli.Get(ctx, entry)
	if err != nil || len(before.Kvs) != 1 {
		t.Fatalf("entry %q before the rotation: %v, %v", entry, before, err)
	}
	rerr := acrossCrash(t, ctx, b, h, nil, func() error {
		_, err := b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, Rotate: true})
		return err
	})
	after, err := base.cli.Get(ctx, entry)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Kvs) != 1 || after.Kvs[0].ModRevision != before.Kvs[0].ModRevision {
		t.Fatalf("the crashed holder's entry changed after the crash (Renew returned %v): mod revision %d before, %v after; want it untouched", rerr, before.Kvs[0].ModRevision, after.Kvs)
	}
}
