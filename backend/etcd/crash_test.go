package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// heldKeepAlive is an etcd client's Lease whose next KeepAliveOnce, once
// armed, reaches the server and then holds its answer back: it reports on
// sent and answers when release is closed.
type heldKeepAlive struct {
	clientv3.Lease
	armed   chan struct{} // closed by arm: the next keep-alive is held
	sent    chan struct{} // closed once the held keep-alive got through
	release chan struct{}
}

func (l *heldKeepAlive) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	resp, err := l.Lease.KeepAliveOnce(ctx, id)
	select {
	case <-l.armed:
	default:
		return resp, err
	}
	select {
	case <-l.sent:
		return resp, err // only the first armed one is held
	default:
	}
	close(l.sent)
	<-l.release
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
	cli := rawClient(t, base)
	hl := &heldKeepAlive{Lease: cli.Lease, armed: make(chan struct{}), sent: make(chan struct{}), release: make(chan struct{})}
	cli.Lease = hl
	b, err := New(ctx, cli, &Options{Prefix: base.prefix})
	if err != nil {
		t.Fatal(err)
	}
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
	close(hl.armed)
	renewed := make(chan error, 1)
	go func() {
		_, err := b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL})
		renewed <- err
	}()
	select {
	case <-hl.sent:
	case err := <-renewed:
		t.Fatalf("Renew returned (%v) without sending a keep-alive", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	b.crash()
	close(hl.release)
	<-renewed // whatever it says: the process is dead
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
func TestCrashOfAWaiterDeletesNothing(t *testing.T) {
	ctx := ctxT(t)
	const key = "crash-waiter"
	holder, waiter := open(t), open(t)
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
		_, err := waiter.AcquireWait(ctx, lockReq(key, "w1"))
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
	cli := rawClient(t, base)
	kv := &heldReadKV{KV: cli.KV, sent: make(chan struct{}), release: make(chan struct{})}
	cli.KV = kv
	b, err := New(ctx, cli, &Options{Prefix: base.prefix})
	if err != nil {
		t.Fatal(err)
	}
	b.own = true // as Open's: the crash cuts its connection
	// A TTL that outlasts the failing write's retries (clientv3 retries a
	// request that was never sent for about 2.5s): the entry must still be
	// there, as it was, when Renew gives up.
	const key, ttl = "crash-rotation", 30 * time.Second
	req := lockReq(key, "h1")
	req.TTL = ttl
	g, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	name, ok := handleName(g.Handle)
	if !ok {
		t.Fatalf("grant handle %q names no entry", g.Handle)
	}
	entry := base.queuePrefix(key) + name
	before, err := base.cli.Get(ctx, entry)
	if err != nil || len(before.Kvs) != 1 {
		t.Fatalf("entry %q before the rotation: %v, %v", entry, before, err)
	}
	kv.armed.Store(true)
	rotated := make(chan error, 1)
	go func() {
		_, err := b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, Rotate: true})
		rotated <- err
	}()
	select {
	case <-kv.sent:
	case err := <-rotated:
		t.Fatalf("Renew returned (%v) without reading the entry", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	b.crash()
	close(kv.release)
	rerr := <-rotated
	after, err := base.cli.Get(ctx, entry)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Kvs) != 1 || after.Kvs[0].ModRevision != before.Kvs[0].ModRevision {
		t.Fatalf("the crashed holder's entry changed after the crash (Renew returned %v): mod revision %d before, %v after; want it untouched", rerr, before.Kvs[0].ModRevision, after.Kvs)
	}
}
