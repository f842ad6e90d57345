package etcd

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// urls holds one URL (so one key prefix) per test.
var urls sync.Map

// open opens a backend on the test's prefix, closed at the end of the test.
func open(t *testing.T) *Backend {
	t.Helper()
	u, _ := urls.LoadOrStore(t.Name(), testURL(t))
	b, err := Open(t.Context(), u.(string))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// client returns a fencelock Client on backend b with a 2s TTL.
func client(t *testing.T, b *Backend) *fencelock.Client {
	t.Helper()
	c, err := fencelock.New(b, &fencelock.Options{TTL: 2 * time.Second, MinBackoff: 2 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawClient returns a plain etcd client on the test server ("an operator").
func rawClient(t *testing.T, b *Backend) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: b.cli.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestEscape(t *testing.T) {
	for _, s := range []string{"", "a", "a/b", "%", "%2F", "/", "a%b/c%", "ключ/значение", "100%/x"} {
		e := escape(s)
		if strings.Contains(e, "/") {
			t.Errorf("escape(%q) = %q contains '/'", s, e)
		}
		if u, ok := unescape(e); !ok || u != s {
			t.Errorf("unescape(escape(%q)) = %q, %v", s, u, ok)
		}
	}
	// Prefix relation is preserved; distinct keys never collide.
	keys := []string{"a", "a/", "a/b", "a%2Fb", "a%", "ab", "a%25", "%"}
	for _, p := range keys {
		for _, k := range keys {
			if strings.HasPrefix(escape(k), escape(p)) != strings.HasPrefix(k, p) {
				t.Errorf("prefix relation of %q, %q not preserved", p, k)
			}
			if p != k && strings.HasPrefix(escape(k)+"/", escape(p)+"/") {
				t.Errorf("queue of %q is inside queue of %q", k, p)
			}
		}
	}
	for _, bad := range []string{"%", "%2", "%zz", "a/b"} {
		if _, ok := unescape(bad); ok {
			t.Errorf("unescape(%q) accepted", bad)
		}
	}
}

func TestOpenRejectsBadURLs(t *testing.T) {
	ctx := t.Context()
	for _, u := range []string{
		"etcd://127.0.0.1:2379/p?bogus=1",
		"etcd://127.0.0.1:2379/p?ca_file=/x", // TLS settings need etcds
		"etcd://127.0.0.1:2379/p?dial_timeout=soon",
		"etcd://127.0.0.1:2379/p?dial_timeout=-1s",
		"etcd://127.0.0.1:99999/p",
		"etcd://a:1,,b:2/p",
		"etcds://127.0.0.1:2379/p?cert_file=/x",
		"etcd://user:secret@127.0.0.1:2379/p?nope=1",
		"etcd:///p",
		"http://127.0.0.1:2379/",
		"etcd://127.0.0.1:2379/p\x01/",
	} {
		b, err := Open(ctx, u)
		if err == nil {
			b.Close()
			t.Errorf("Open(%q) succeeded", u)
			continue
		}
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Open(%q) = %v; want ErrInvalidOption", u, err)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q) error leaks the password: %v", u, err)
		}
	}
	for _, o := range []Options{{Prefix: "no-slash"}, {Prefix: "/tab\t/"}, {Prefix: strings.Repeat("p", 300) + "/"}, {CleanupTimeout: -time.Second}} {
		if err := o.Validate(); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Options%+v.Validate() = %v; want ErrInvalidOption", o, err)
		}
	}
	if _, err := New(ctx, nil, nil); err == nil {
		t.Error("New(nil client) succeeded")
	}
}

// A caller-owned client stays open after the backend is closed.
func TestNewLeavesCallerClientOpen(t *testing.T) {
	b0 := open(t)
	cli := rawClient(t, b0)
	b, err := New(t.Context(), cli, &Options{Prefix: b0.prefix})
	if err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Owner: "o", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Get(t.Context(), "x"); err != nil {
		t.Fatalf("caller's client unusable after Backend.Close: %v", err)
	}
	// Close revoked the backend's lease: the entry is gone.
	if info, err := b0.Inspect(t.Context(), "k"); err != nil || info.Locked() {
		t.Fatalf("after Close Inspect = %+v, %v (token %d); want free", info, err, g.Token)
	}
	if _, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Second}); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Acquire after Close = %v; want ErrClosed", err)
	}
}

// holderLease returns the etcd lease of key's holder entry.
func holderLease(t *testing.T, b *Backend, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := b.cli.Get(t.Context(), b.queuePrefix(key), clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("no holder entry for %q: %v", key, err)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// A lease revoked from outside ends the holder's lease at once (pushed by
// the watch on its entry, not found at the next renewal).
func TestLeaseRevokedNotifiesHolder(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	c := client(t, b)
	l, err := c.Acquire(ctx, "revoked")
	if err != nil {
		t.Fatal(err)
	}
	op := rawClient(t, b)
	if _, err := op.Revoke(ctx, holderLease(t, b, "revoked")); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	select {
	case <-l.Done():
		t.Logf("holder told %v after the revocation", time.Since(at))
	case <-time.After(c.Options().RenewInterval / 2):
		t.Fatalf("holder not told within half a renewal interval (%v)", c.Options().RenewInterval/2)
	}
	if !errors.Is(l.Err(), fencelock.ErrLeaseLost) {
		t.Fatalf("Err() = %v; want ErrLeaseLost", l.Err())
	}
	// The backend recovers: it grants itself a new lease.
	l2, err := c.TryAcquire(ctx, "revoked")
	if err != nil {
		t.Fatalf("TryAcquire after the revocation: %v", err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token %d not above %d", l2.Token(), l.Token())
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// compact advances the revision and compacts the whole history.
func compact(t *testing.T, ctx context.Context, cli *clientv3.Client, prefix string) {
	t.Helper()
	var rev int64
	for i := range 20 {
		resp, err := cli.Put(ctx, fmt.Sprintf("%snoise/%d", prefix, i), "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	if _, err := cli.Delete(ctx, prefix+"noise/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
}

// Compaction while contenders wait does not strand them, and a loss
// watch that starts at a compacted revision falls back correctly.
func TestCompactionDoesNotBreakWaiting(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	holder, waiter := client(t, b), client(t, open(t))
	op := rawClient(t, b)
	l, err := holder.Acquire(ctx, "compact")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *fencelock.Lease, 1)
	go func() {
		wl, err := waiter.Acquire(ctx, "compact")
		if err != nil {
			t.Errorf("waiting Acquire: %v", err)
		}
		got <- wl
	}()
	time.Sleep(200 * time.Millisecond) // let the waiter queue up
	compact(t, ctx, op, "/compact-noise-"+b.prefix)
	time.Sleep(100 * time.Millisecond)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case wl := <-got:
		if wl == nil {
			return
		}
		if wl.Token() <= l.Token() {
			t.Errorf("waiter token %d not above %d", wl.Token(), l.Token())
		}
		if err := wl.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken after compaction and release")
	}

	// A loss watch registered after its grant's revision was compacted.
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "compact2", Owner: "o", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	compact(t, ctx, op, "/compact-noise-"+b.prefix)
	lost := make(chan error, 1)
	stop := b.NotifyLoss(g, func(err error) { lost <- err })
	defer stop()
	select {
	case err := <-lost:
		t.Fatalf("loss reported for a live grant: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := b.ForceRelease(ctx, "compact2"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("loss cause %v; want ErrNotHeld", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("force-release not reported by a loss watch that started after compaction")
	}
}

// queueLen counts the entries in key's queue.
func queueLen(t *testing.T, b *Backend, key string) int64 {
	t.Helper()
	resp, err := b.cli.Get(t.Context(), b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// Waiters get the key in the order they queued.
func TestFIFOOrder(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	c := client(t, b)
	holder, err := c.Acquire(ctx, "fifo")
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := client(t, open(t)).Acquire(ctx, "fifo")
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := l.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		}()
		// Start the next waiter only once this one has queued.
		deadline := time.Now().Add(10 * time.Second)
		for queueLen(t, b, "fifo") < int64(i+2) {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d did not queue", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, w := range order {
		if w != i {
			t.Fatalf("waiters acquired in order %v; want 0..%d", order, n-1)
		}
	}
}

// A waiter whose predecessor gives up waits for the next one in line.
func TestCancelledPredecessor(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	holder, err := client(t, b).Acquire(ctx, "pred")
	if err != nil {
		t.Fatal(err)
	}
	mid, cancelMid := context.WithCancel(ctx)
	midDone := make(chan error, 1)
	go func() { _, err := client(t, open(t)).Acquire(mid, "pred"); midDone <- err }()
	for queueLen(t, b, "pred") < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	last := make(chan *fencelock.Lease, 1)
	go func() {
		l, err := client(t, open(t)).Acquire(ctx, "pred")
		if err != nil {
			t.Error(err)
		}
		last <- l
	}()
	for queueLen(t, b, "pred") < 3 {
		time.Sleep(5 * time.Millisecond)
	}
	cancelMid()
	if err := <-midDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if n := queueLen(t, b, "pred"); n != 2 {
		t.Fatalf("queue has %d entries after the cancelled waiter left; want 2", n)
	}
	select {
	case <-last:
		t.Fatal("last waiter acquired while the holder still holds")
	case <-time.After(200 * time.Millisecond):
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-last:
		if l != nil {
			l.Release(ctx)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("last waiter not woken")
	}
}

// Renewals keep every lease alive, sharing keep-alives: many leases on one
// backend cost one etcd lease.
func TestOneLeasePerBackend(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	c := client(t, b)
	seen := map[clientv3.LeaseID]bool{}
	for i := range 20 {
		key := fmt.Sprintf("shared/%d", i)
		if _, err := c.TryAcquire(ctx, key); err != nil {
			t.Fatal(err)
		}
		seen[holderLease(t, b, key)] = true
	}
	if len(seen) != 1 {
		t.Fatalf("20 locks on one backend used %d leases; want 1", len(seen))
	}
	infos, err := c.List(ctx, "shared/")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Remaining <= 0 || in.Remaining > 2*time.Second {
			t.Errorf("List Remaining %v; want (0, 2s]", in.Remaining)
		}
	}
}

// Close stops every goroutine the backend started (loss watches, waits).
func TestNoGoroutinesLeft(t *testing.T) {
	ctx := ctxT(t)
	url := testURL(t)
	opt := goleak.IgnoreCurrent()
	func() {
		b, err := Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		c, err := fencelock.New(b, &fencelock.Options{TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.Acquire(ctx, "leak")
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err = c.Acquire(wctx, "leak")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiting Acquire = %v", err)
		}
		_ = l
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	goleak.VerifyNone(t, opt)
}

// A URL may list several endpoints; the path is the key prefix.
func TestOpenEndpointList(t *testing.T) {
	u, err := url.Parse(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = u.Host + "," + u.Host
	u.Path = "/multi/prefix" // a trailing '/' is added
	b, err := Open(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := b.Prefix(); got != "/multi/prefix/" {
		t.Errorf("Prefix() = %q; want /multi/prefix/", got)
	}
	if n := len(b.Client().Endpoints()); n != 2 {
		t.Errorf("client has %d endpoints; want 2", n)
	}
}

// An entry whose Release failed does not live on with the backend's shared
// lease: the next keep-alive that gets through deletes it.
func TestFailedReleaseIsSwept(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "swept", Owner: "o", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Release(dead, g); err == nil {
		t.Fatal("Release with a cancelled context succeeded")
	}
	if info, err := b.Inspect(ctx, "swept"); err != nil || info.Token != g.Token {
		t.Fatalf("Inspect = %+v, %v; want still held with token %d", info, err, g.Token)
	}
	time.Sleep(200 * time.Millisecond) // let the lease's last keep-alive age past TTL/20
	g2, err := b.Acquire(ctx, driver.AcquireRequest{Key: "other", Owner: "o", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := b.Inspect(ctx, "swept"); err != nil || info.Locked() {
		t.Fatalf("after a keep-alive Inspect = %+v, %v; want the failed release completed", info, err)
	}
	if err := b.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
}

// A waiter that queued before the holder rotated its token gets a token
// above the rotated one once it holds (its first Renew re-puts its entry).
func TestRotationThenWaiter(t *testing.T) {
	ctx := ctxT(t)
	b1, b2 := open(t), open(t)
	g, err := b1.Acquire(ctx, driver.AcquireRequest{Key: "rot", Owner: "holder", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	waited := make(chan result, 1)
	go func() {
		g, err := b2.AcquireWait(ctx, driver.AcquireRequest{Key: "rot", Owner: "waiter", TTL: 2 * time.Second})
		waited <- result{g, err}
	}()
	for queueLen(t, b1, "rot") < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	g2, err := b1.Renew(ctx, g, driver.RenewRequest{TTL: 2 * time.Second, Rotate: true})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("rotated token %d not above %d", g2.Token, g.Token)
	}
	if info, err := b2.Inspect(ctx, "rot"); err != nil || info.Token != g2.Token {
		t.Fatalf("Inspect after rotation = %+v, %v; want token %d", info, err, g2.Token)
	}
	if err := b1.Release(ctx, g); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release with the pre-rotation token = %v; want ErrNotHeld", err)
	}
	if err := b1.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatal(r.err)
	}
	confirmed, err := b2.Renew(ctx, r.g, driver.RenewRequest{TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if confirmed.Token <= g2.Token {
		t.Fatalf("waiter's confirmed token %d not above the rotated token %d", confirmed.Token, g2.Token)
	}
	// The confirmation is idempotent: a second Renew keeps the token.
	again, err := b2.Renew(ctx, confirmed, driver.RenewRequest{TTL: 2 * time.Second})
	if err != nil || again.Token != confirmed.Token {
		t.Fatalf("second Renew = %d, %v; want token %d kept", again.Token, err, confirmed.Token)
	}
	if err := b2.Release(ctx, again); err != nil {
		t.Fatal(err)
	}
}

// Contenders that rotate their tokens while others wait: exclusion holds
// and a fence sees every holder's tokens in increasing order.
func TestRotationUnderContention(t *testing.T) {
	ctx := ctxT(t)
	const workers, rounds = 4, 3
	var (
		fence  fencelock.Fence
		inside atomic.Int32
		wg     sync.WaitGroup
	)
	for i := range workers {
		c, err := fencelock.New(open(t), &fencelock.Options{TTL: 2 * time.Second, RenewInterval: 500 * time.Millisecond, RotateEvery: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := c.Acquire(ctx, "rotating")
				if err != nil {
					t.Errorf("worker %d: %v", i, err)
					return
				}
				if n := inside.Add(1); n > 1 {
					t.Errorf("%d holders at once", n)
				}
				first := l.Token()
				deadline := time.Now().Add(3 * time.Second)
				for l.Token() == first && time.Now().Before(deadline) {
					if err := fence.Admit("rotating", l); err != nil {
						t.Errorf("fence refused token %d: %v", l.Token(), err)
					}
					time.Sleep(50 * time.Millisecond)
				}
				if err := fence.Admit("rotating", l); err != nil {
					t.Errorf("fence refused rotated token %d: %v", l.Token(), err)
				}
				inside.Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Errorf("release: %v", err)
				}
			}
		}()
	}
	wg.Wait()
}
