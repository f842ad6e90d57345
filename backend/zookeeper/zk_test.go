package zookeeper

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"
)

func TestEscapeKey(t *testing.T) {
	keys := []string{"a", "a/b", ".", "..", "./.", "%2F", "100%", "zookeeper", "Zookeeper", "%7Aookeeper", "a b", "ключ", "emoji-🔒", "a.b", "a_b", "a-b", strings.Repeat("/", driver.MaxKeyLen)}
	var all []byte
	for c := 1; c < 256; c++ {
		all = append(all, byte(c))
	}
	keys = append(keys, string(all))
	seen := map[string]string{}
	for _, k := range keys {
		e := escapeKey(k)
		if strings.ContainsAny(e, "/.") || e == "zookeeper" || e == "" {
			t.Errorf("escapeKey(%q) = %q: not a safe single znode name", k, e)
		}
		if err := zkValid("/" + e); err != nil {
			t.Errorf("escapeKey(%q) = %q: not a valid znode name: %v", k, e, err)
		}
		back, ok := unescapeKey(e)
		if !ok || back != k {
			t.Errorf("unescapeKey(escapeKey(%q)) = %q, %v", k, back, ok)
		}
		if prev, dup := seen[e]; dup {
			t.Errorf("keys %q and %q both escape to %q", prev, k, e)
		}
		seen[e] = k
	}
	for _, bad := range []string{"", "a/b", "%2", "%zz", "%2f", "%41", "a.b"} {
		if k, ok := unescapeKey(bad); ok {
			t.Errorf("unescapeKey(%q) = %q, true; want false (not a name escapeKey makes)", bad, k)
		}
	}
}

// zkValid checks what ZooKeeper requires of a path segment that escapeKey
// must guarantee: only printable ASCII, no '/', not "." or "..".
func zkValid(p string) error {
	for i := 1; i < len(p); i++ {
		if c := p[i]; c <= 0x20 || c >= 0x7f || c == '/' {
			return fmt.Errorf("byte %#x at %d", c, i)
		}
	}
	if p == "/." || p == "/.." {
		return errors.New("dot segment")
	}
	return nil
}

func TestOpenRejectsBadURLs(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"zk://127.0.0.1:1/x?sesion_timeout=1s",
		"zk://127.0.0.1:1/x?session_timeout=abc",
		"zk://127.0.0.1:1/x?session_timeout=1ns",
		"zk://127.0.0.1:1/x?connect_timeout=-1s",
		"zk://user:secret@127.0.0.1:1/x",
		"zk:///x",
		"zk://127.0.0.1:1,,127.0.0.1:2/x",
		"zk://127.0.0.1:1/zookeeper",
		"zk://127.0.0.1:1/a/../b",
		"redis://127.0.0.1:1/",
	} {
		_, err := Open(ctx, u)
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Open(%q) = %v; want ErrInvalidOption", u, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q) error shows the password: %v", u, err)
		}
	}
	for _, o := range []Options{{Prefix: "rel"}, {Prefix: "/a/"}, {Prefix: "/a//b"}, {Prefix: "/a/./b"}, {Prefix: "/zookeeper/x"}, {SessionTimeout: -1}} {
		if err := o.Validate(); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Options%+v.Validate() = %v; want ErrInvalidOption", o, err)
		}
	}
	if err := (*Options)(nil).Validate(); err != nil {
		t.Errorf("nil Options: %v", err)
	}
}

func TestOpenGivesUpWithoutServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	start := time.Now()
	_, err = Open(context.Background(), "zk://"+addr+"/x?connect_timeout=300ms")
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Open without a server = %v after %v; want an error after connect_timeout", err, time.Since(start))
	}
}

// open opens a backend for a test with the given session timeout.
func open(t *testing.T, sessTO time.Duration) (*Backend, string) {
	t.Helper()
	u := testURL(t)
	u = strings.Replace(u, "session_timeout="+testTTL.String(), "session_timeout="+sessTO.String(), 1)
	b, err := Open(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, u
}

func client(t *testing.T, b *Backend, ttl time.Duration) *fencelock.Client {
	t.Helper()
	c, err := fencelock.New(b, &fencelock.Options{TTL: ttl, MinBackoff: 2 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// killSession ends b's session from outside, as the server does when it
// expires a session: it attaches a second connection to the session (with
// the password the handshake sniffer saw) and sends closeSession.
func killSession(t *testing.T, b *Backend) {
	t.Helper()
	pw := b.d.passwd.Load()
	if pw == nil {
		t.Fatal("session password not captured")
	}
	conn, err := net.DialTimeout("tcp", b.conn.Server(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := binary.BigEndian.AppendUint32(nil, 0)   // protocolVersion
	req = binary.BigEndian.AppendUint64(req, 0)    // lastZxidSeen
	req = binary.BigEndian.AppendUint32(req, 2000) // timeOut
	req = binary.BigEndian.AppendUint64(req, uint64(b.d.session.Load()))
	req = binary.BigEndian.AppendUint32(req, uint32(len(*pw))) // passwd
	req = append(req, *pw...)
	frame := func(p []byte) []byte { return append(binary.BigEndian.AppendUint32(nil, uint32(len(p))), p...) }
	if _, err := conn.Write(frame(req)); err != nil {
		t.Fatal(err)
	}
	readFrame := func() []byte {
		var n [4]byte
		if _, err := io.ReadFull(conn, n[:]); err != nil {
			t.Fatalf("reading from ZooKeeper: %v", err)
		}
		buf := make([]byte, binary.BigEndian.Uint32(n[:]))
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatalf("reading from ZooKeeper: %v", err)
		}
		return buf
	}
	resp := readFrame()
	if len(resp) < 16 || binary.BigEndian.Uint64(resp[8:16]) != uint64(b.d.session.Load()) {
		t.Fatalf("could not attach to the session: %x", resp)
	}
	closeReq := binary.BigEndian.AppendUint32(nil, 1)              // xid
	closeReq = binary.BigEndian.AppendUint32(closeReq, 0xfffffff5) // opcode closeSession (-11)
	if _, err := conn.Write(frame(closeReq)); err != nil {
		t.Fatal(err)
	}
	readFrame()
}

// TestSessionExpiryEndsLease: when the session ends, the lease ends at once
// (long before its TTL would run out) with a cause that says so, and the
// key is free for the next holder.
func TestSessionExpiryEndsLease(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, 8*time.Second)
	other, _ := open(t, 8*time.Second)
	c, c2 := client(t, b, 8*time.Second), client(t, other, 8*time.Second)
	key := "expiry/" + t.Name()
	l, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * lossWatchDelay) // let the loss watch arm
	killed := time.Now()
	killSession(t, b)
	select {
	case <-l.Done():
		t.Logf("holder told %v after its session ended (TTL 8s)", time.Since(killed))
	case <-time.After(4 * time.Second):
		t.Fatal("holder not told within 4s that its session ended")
	}
	if err := l.Err(); !errors.Is(err, fencelock.ErrLeaseLost) || !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Err() = %v; want ErrLeaseLost caused by ErrNotHeld", err)
	}
	l2, err := c2.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire after the holder's session ended: %v", err)
	}
	if l2.Token() <= l.Token() {
		t.Errorf("token %d after expiry not above %d", l2.Token(), l.Token())
	}
	l2.Release(ctx)
	// The backend carries on with a new session.
	l3, err := c.TryAcquire(ctx, key+"/again")
	if err != nil {
		t.Fatalf("TryAcquire on the backend with a new session: %v", err)
	}
	l3.Release(ctx)
}

// TestExpiryAfterPartition: a holder cut off for longer than its session
// timeout learns, on reconnecting, that the session expired: NotifyLoss
// reports zk.ErrSessionExpired (a disconnection alone reports nothing).
//
// The test asks for a 1.2 s session; a server whose minSessionTimeout is
// longer (a stock one: tickTime 2000, so 4 s) negotiates its own, which
// the grant reports. The holder reconnects only once the server has
// expired the session, as a second client sees (the holder's ephemeral
// znode deleted): the server expires a session between its timeout and
// its timeout plus a tickTime after it last heard from the client (its
// session tracker expires sessions in tickTime buckets), so a reconnect
// after a fixed "session timeout plus a second" (5 s of a 4 s session,
// tickTime 2000) often came before the expiry, the session lived on, and
// rightly no loss was reported.
func TestExpiryAfterPartition(t *testing.T) {
	ctx := t.Context()
	const asked = 1200 * time.Millisecond
	b, _ := open(t, asked)
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "partition/" + t.Name(), Owner: "p", TTL: asked})
	if err != nil {
		t.Fatal(err)
	}
	sess := b.SessionTimeout()
	if sess < asked {
		t.Errorf("Grant.TTL = %v; want the negotiated session timeout, at least the %v asked for", sess, asked)
	}
	t.Logf("session timeout %v (asked %v)", sess, asked)
	h, _ := parseHandle(g.Handle)
	obs, _ := open(t, testTTL)
	ok, _, gone, err := obs.conn.ExistsW(ctx, h.path)
	if err != nil || !ok {
		t.Fatalf("the holder's znode %s as another client sees it: exists %v, %v", h.path, ok, err)
	}
	lost := make(chan error, 1)
	stop := b.NotifyLoss(g, func(cause error) { lost <- cause })
	defer stop()
	time.Sleep(2 * lossWatchDelay)
	b.d.cut(true)
	// The server expires the session at most a tickTime after its timeout,
	// and tickTime is at most half the session timeout (sessions are
	// negotiated within 2..20 tickTimes unless the server says otherwise).
	select {
	case err := <-lost:
		t.Fatalf("lost reported while merely disconnected: %v", err)
	case ev := <-gone:
		if ev.Type != zk.EventNodeDeleted {
			t.Fatalf("watch on the holder's znode: %+v; want its deletion on session expiry", ev)
		}
	case <-time.After(2*sess + 5*time.Second):
		t.Fatalf("the server did not expire the %v session within %v of the cut", sess, 2*sess+5*time.Second)
	}
	select {
	case err := <-lost:
		t.Fatalf("lost reported while merely disconnected: %v", err)
	default:
	}
	b.d.cut(false)
	select {
	case err := <-lost:
		if !errors.Is(err, zk.ErrSessionExpired) || !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("cause = %v; want ErrNotHeld and zk.ErrSessionExpired", err)
		}
	case <-time.After(sess + 10*time.Second):
		t.Fatalf("expiry not reported within %v of reconnecting", sess+10*time.Second)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, err := b.Renew(ctx, g, driver.RenewRequest{TTL: sess})
		if errors.Is(err, driver.ErrNotHeld) {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("Renew after expiry = %v; want ErrNotHeld", err)
		}
		time.Sleep(50 * time.Millisecond) // go-zookeeper is still getting its new session
	}
}

// TestDisconnectWithinSessionKeepsLockNoRace: a short disconnection (well within
// the session timeout) keeps the lock and the token.
func TestDisconnectWithinSessionKeepsLockNoRace(t *testing.T) {
	if raceEnabled {
		// go-zookeeper v1.0.4 reads Conn.lastZxid in sendSetWatches while
		// recvLoop writes it, when it reconnects with watches set
		// (go-zookeeper/zk PR #35, unmerged). Not ours to fix; the test
		// runs without -race.
		t.Skip("reconnecting with watches trips a data race inside go-zookeeper (zk PR #35)")
	}
	ctx := t.Context()
	b, _ := open(t, 4*time.Second)
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "blip/" + t.Name(), Owner: "p", TTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	defer b.NotifyLoss(g, func(cause error) { lost <- cause })()
	time.Sleep(2 * lossWatchDelay)
	b.d.cut(true)
	time.Sleep(500 * time.Millisecond)
	b.d.cut(false)
	deadline := time.Now().Add(5 * time.Second)
	for {
		g2, err := b.Renew(ctx, g, driver.RenewRequest{TTL: 4 * time.Second})
		if err == nil {
			if g2.Token != g.Token {
				t.Fatalf("token changed across a reconnect: %d -> %d", g.Token, g2.Token)
			}
			break
		}
		if errors.Is(err, driver.ErrNotHeld) || time.Now().After(deadline) {
			t.Fatalf("Renew after a short disconnection: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // waiting for go-zookeeper to reconnect
	}
	select {
	case err := <-lost:
		t.Fatalf("loss reported after a short disconnection: %v", err)
	default:
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
}

// queued waits until the key's parent has n contender znodes.
func queued(t *testing.T, b *Backend, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		names, _, err := b.conn.Children(t.Context(), b.parent(key))
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			t.Fatal(err)
		}
		if len(sortChildren(names)) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %q has %d znodes; want %d", key, len(names), n)
		}
		time.Sleep(10 * time.Millisecond) // polling the server's view
	}
}

// TestNoHerdEffect: releasing the holder wakes exactly one waiter (its
// successor, with one watch event); the others' watches (each on its own
// predecessor) stay quiet, and nobody re-lists the queue. (The new holder's
// confirmation only reads, so the waiter behind it is not woken either;
// only a rotation would wake it, to re-arm its watch.)
func TestNoHerdEffect(t *testing.T) {
	ctx := t.Context()
	const waiters = 5
	hb, _ := open(t, testTTL)
	holder := client(t, hb, testTTL)
	key := "herd/" + t.Name()
	l, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	bs := make([]*Backend, waiters)
	got := make(chan int, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		bs[i], _ = open(t, testTTL)
		c := client(t, bs[i], testTTL)
		wg.Add(1)
		go func() {
			defer wg.Done()
			wl, err := c.Acquire(ctx, key)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("waiter %d: %v", i, err)
				}
				return
			}
			got <- i
			<-ctx.Done()
			wl.Release(context.Background())
		}()
	}
	queued(t, hb, key, waiters+1)
	time.Sleep(100 * time.Millisecond) // every waiter is parked on its watch
	var wake0, list0 [waiters]int64
	for i, b := range bs {
		wake0[i], list0[i] = b.wakeups.Load(), b.lists.Load()-b.rechecks.Load()
	}
	mustRelease(t, l)
	first := <-got
	time.Sleep(500 * time.Millisecond) // give any herd time to show
	relisted, woken := 0, 0
	for i, b := range bs {
		d := b.wakeups.Load() - wake0[i]
		t.Logf("waiter %d: %d watch events", i, d)
		if d > 0 {
			woken++
		}
		if i == first && d != 1 {
			t.Errorf("the new holder (waiter %d) saw %d watch events; want 1 (its predecessor's deletion)", i, d)
		}
		// The periodic safety-net re-read is not a herd: count only the
		// listings a release caused.
		relisted += int(b.lists.Load() - b.rechecks.Load() - list0[i])
	}
	if woken != 1 {
		t.Errorf("%d waiters were woken by one release; want exactly 1 (no herd effect)", woken)
	}
	if relisted != 0 {
		t.Errorf("waiters listed the queue %d times after the release; want 0 (the predecessor's deletion alone hands over)", relisted)
	}
	select {
	case i := <-got:
		t.Errorf("waiter %d also acquired the key", i)
	default:
	}
}

func mustRelease(t *testing.T, l *fencelock.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestFIFO: waiters get the key in the order they joined the queue, and
// each hand-off issues a higher token.
func TestFIFO(t *testing.T) {
	ctx := t.Context()
	const waiters = 6
	hb, _ := open(t, testTTL)
	holder := client(t, hb, testTTL)
	key := "fifo/" + t.Name()
	l, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	type turn struct {
		i   int
		tok fencelock.Token
	}
	order := make(chan turn, waiters)
	for i := range waiters {
		b, _ := open(t, testTTL)
		c := client(t, b, testTTL)
		go func() {
			wl, err := c.Acquire(ctx, key)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				order <- turn{i: -1}
				return
			}
			order <- turn{i, wl.Token()}
			time.Sleep(20 * time.Millisecond)
			wl.Release(context.Background())
		}()
		queued(t, hb, key, i+2) // joined before the next one starts
	}
	last := l.Token()
	mustRelease(t, l)
	for want := range waiters {
		select {
		case got := <-order:
			if got.i != want {
				t.Fatalf("waiter %d got the key as number %d; want FIFO order", got.i, want)
			}
			if got.tok <= last {
				t.Fatalf("hand-off token %d not above %d", got.tok, last)
			}
			last = got.tok
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d did not get the key", want)
		}
	}
}

// TestRotatedTokenThenHandOff: a waiter that takes over from a holder whose
// token was rotated above the waiter's creation still gets a higher token.
func TestRotatedTokenThenHandOff(t *testing.T) {
	ctx := t.Context()
	a, _ := open(t, testTTL)
	w, _ := open(t, testTTL)
	key := "rotate-handoff/" + t.Name()
	g, err := a.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "a", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan driver.Grant, 1)
	go func() {
		wg, err := w.AcquireWait(ctx, driver.AcquireRequest{Key: key, Owner: "w", TTL: testTTL})
		if err != nil {
			t.Error(err)
		}
		res <- wg
	}()
	queued(t, a, key, 2)
	g2, err := a.Renew(ctx, g, driver.RenewRequest{TTL: testTTL, Rotate: true})
	if err != nil || g2.Token <= g.Token {
		t.Fatalf("rotate: %v, token %d -> %d", err, g.Token, g2.Token)
	}
	if err := a.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
	wg := <-res
	cg, err := w.Renew(ctx, wg, driver.RenewRequest{TTL: testTTL}) // the engine's confirmation
	if err != nil {
		t.Fatal(err)
	}
	if cg.Token <= g2.Token {
		t.Fatalf("waiter's confirmed token %d not above the rotated token %d", cg.Token, g2.Token)
	}
	info, err := w.Inspect(ctx, key)
	if err != nil || info.Token != cg.Token || info.Owner != "w" {
		t.Fatalf("Inspect = %+v, %v; want owner w token %d", info, err, cg.Token)
	}
	if err := w.Release(ctx, cg); err != nil {
		t.Fatal(err)
	}
}

// TestLostCreateReplyLeavesNoOrphan: when the reply to the create is lost
// (the connection dies right after the request is sent), the contender
// znode that the server may have created is found by its nonce and
// deleted, so it never blocks the queue. The backend has no goroutine of
// its own for this: the engine's clean-up after the ambiguous acquire
// (Inspect, retried with backoff while Inspect reports the clean-up
// pending) drives it.
func TestLostCreateReplyLeavesNoOrphan(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, 4*time.Second)
	c := client(t, b, 4*time.Second)
	other, _ := open(t, testTTL)
	key := "orphan/" + t.Name()
	// The parent must exist so the multi is the first request that goes out.
	g, err := other.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "o", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	const opMulti = 14
	b.d.dropAfter.Store(opMulti)
	if l, err := c.TryAcquire(ctx, key); err == nil {
		t.Fatalf("TryAcquire with its reply lost = %v; want a transport error", l)
	}
	// The key becomes free once the engine's clean-up has run.
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err = other.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "o", TTL: testTTL})
		if err == nil {
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("the key is blocked after a lost create reply: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // polling the other backend: no event says when
	}
	if err := other.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	// While the nonce may still appear, Inspect on b reports the clean-up
	// pending; once the search is over it answers, and nothing reappeared.
	for {
		_, err := b.Inspect(ctx, key)
		if err == nil {
			break
		}
		if !errors.Is(err, errCleanupPending) || time.Now().After(deadline.Add(20*time.Second)) {
			t.Fatalf("Inspect after the clean-up: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the nonce search lasts a session timeout, at least 10s
	}
	queued(t, other, key, 0)
}

// TestOrphanDeletedByNextCall: a znode whose deletion failed is deleted by
// the next engine-driven call (here Inspect), which then answers.
func TestOrphanDeletedByNextCall(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, testTTL)
	key := "orphan/" + t.Name()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "x", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	h, _ := parseHandle(g.Handle)
	b.addOrphan(orphan{path: h.path}, nil) // as if a delete of this znode had failed
	if b.orphans.Len() != 1 {
		t.Fatal("orphan not recorded")
	}
	if info, err := b.Inspect(ctx, key); err != nil || info.Locked() {
		t.Fatalf("Inspect = %+v, %v; want the orphan deleted and the key free", info, err)
	}
	queued(t, b, key, 0)
	if b.orphans.Len() != 0 {
		t.Fatalf("orphans left: %d", b.orphans.Len())
	}
}

// TestPendingCleanupNamesWhyItFailed: while a clean-up is pending after a
// failed attempt, Inspect of its key says why (on a stopped server, the
// refused connection), and once a sweep has gone through without a
// failure (a nonce search still running) it no longer reports that stale
// cause.
func TestPendingCleanupNamesWhyItFailed(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, testTTL)
	key := "orphan/" + t.Name()
	cause := errors.New("dial tcp: connect: connection refused")
	b.addOrphan(b.nonceOrphan(b.parent(key), "nonce"+runID), cause) // a create whose reply was lost
	b.mu.Lock()
	b.nextSweep = time.Now().Add(time.Hour) // as after a sweep that failed: paced
	b.mu.Unlock()
	_, err := b.Inspect(ctx, key)
	if !errors.Is(err, errCleanupPending) || !errors.Is(err, cause) {
		t.Fatalf("Inspect with a clean-up pending after a failure = %v; want errCleanupPending naming %q", err, cause)
	}
	b.mu.Lock()
	b.nextSweep = time.Time{}
	b.mu.Unlock()
	_, err = b.Inspect(ctx, key) // sweeps: the search goes through, and goes on for a session timeout
	if !errors.Is(err, errCleanupPending) || errors.Is(err, cause) {
		t.Fatalf("Inspect after a sweep without failure = %v; want errCleanupPending without the old cause", err)
	}
}

// TestSameOwnerRetrySucceeds: an Acquire retried by the same owner (after
// an ambiguous reply) returns the grant it already holds.
func TestSameOwnerRetrySucceeds(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, testTTL)
	req := driver.AcquireRequest{Key: "retry/" + t.Name(), Owner: "same", TTL: testTTL}
	g, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("retry by the same owner: %v", err)
	}
	if g2.Token < g.Token {
		t.Fatalf("retry token %d below %d", g2.Token, g.Token)
	}
	queued(t, b, req.Key, 1)
	if err := b.Release(ctx, g2); err != nil {
		t.Fatal(err)
	}
	queued(t, b, req.Key, 0)
}

// TestCallerOwnedConn: New uses a connection it does not own and never
// closes it.
func TestCallerOwnedConn(t *testing.T) {
	ctx := t.Context()
	ob, _ := open(t, testTTL)
	conn, _, err := zk.Connect([]string{ob.conn.Server()}, 4*time.Second, zk.WithLogInfo(false), zk.WithLogger(zkLogger{ob.log}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b, err := New(ctx, conn, &Options{Prefix: ob.root + "-owned", SessionTimeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c, err := fencelock.New(b, &fencelock.Options{TTL: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.TryAcquire(ctx, "owned")
	if err != nil {
		t.Fatal(err)
	}
	if l.Remaining() > 4*time.Second {
		t.Errorf("Remaining %v above the session timeout", l.Remaining())
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := conn.Exists("/"); err != nil {
		t.Fatalf("the caller's connection no longer works after Close: %v", err)
	}
}

// TestGoroutinesEndOnClose: every goroutine the backend (and the
// connection Open made) started ends with Close.
func TestGoroutinesEndOnClose(t *testing.T) {
	u := testURL(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	b, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	c, err := fencelock.New(b, &fencelock.Options{TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "leak"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = c.Acquire(wctx, "leak")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting Acquire = %v", err)
	}
	time.Sleep(2 * lossWatchDelay) // the held lease's loss watch is armed
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
