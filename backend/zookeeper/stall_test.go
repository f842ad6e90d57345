package zookeeper

import (
	"context"
	"errors"
	"net"
	"net/url"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/deadstore"
	"github.com/fencelock/fencelock/internal/testenv"
)

// ownServer starts a standalone ZooKeeper of the test's own
// (deadstore.OwnServer), so that the test may kill and restart it without
// disturbing the servers other tests share. It returns the Env and the
// server's URL with the given session timeout.
func ownServer(t *testing.T, sess time.Duration) (*testenv.Env, string) {
	t.Helper()
	e, raw := deadstore.OwnServer(t, "zookeeper", "ZooKeeper")
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("session_timeout", sess.String())
	q.Set("prefix", "fencelock-stall-"+runID)
	u.RawQuery = q.Encode()
	return e, u.String()
}

// dumpGoroutines logs the stacks of the goroutines in a fencelock call:
// where a stalled waiter blocks.
func dumpGoroutines(t *testing.T) {
	t.Helper()
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "fencelock/backend/zookeeper.(*Backend)") {
			t.Log(g)
		}
	}
}

// queue is a holder of one key and waiters queued behind it, each on a
// backend (session) of its own, for the stall tests.
type queue struct {
	holderB *Backend
	holder  *fencelock.Lease
	waiterB []*Backend
	results chan waited
}

// waited is how a waiter's blocking Acquire ended: when, and with what
// error (nil: it acquired and released at once, handing the key on).
type waited struct {
	i   int
	at  time.Time
	err error
}

// newQueue opens a holder and n waiters on the server of u, the holder
// acquires key and the waiters call Acquire, joining the queue in order.
func newQueue(ctx context.Context, t *testing.T, u string, sess time.Duration, key string, n int) *queue {
	t.Helper()
	hb, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hb.Close() })
	l, err := client(t, hb, sess).Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	q := newQueueBehind(ctx, t, u, sess, key, n, hb)
	q.holder = l
	return q
}

// newQueueBehind queues n waiters behind the holder of key, whose backend
// is hb.
func newQueueBehind(ctx context.Context, t *testing.T, u string, sess time.Duration, key string, n int, hb *Backend) *queue {
	t.Helper()
	q := &queue{holderB: hb, results: make(chan waited, n)}
	for i := range n {
		b, err := Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		q.waiterB = append(q.waiterB, b)
		c := client(t, b, sess)
		go func() {
			l, err := c.Acquire(ctx, key)
			at := time.Now()
			if err == nil {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*sess)
				err = l.Release(rctx)
				cancel()
				if errors.Is(err, fencelock.ErrLeaseLost) {
					err = nil // it did acquire; what came after is not this test's matter
				}
			}
			q.results <- waited{i, at, err}
		}()
		queued(t, q.holderB, key, i+2)
	}
	return q
}

// expectProgress checks that every waiter acquired the key within bound
// after back (the time the server served again). On a stall it logs where
// the waiters block.
func (q *queue) expectProgress(t *testing.T, back time.Time, bound time.Duration) {
	t.Helper()
	deadline := time.NewTimer(time.Until(back.Add(bound)))
	defer deadline.Stop()
	for range q.waiterB {
		select {
		case r := <-q.results:
			d := r.at.Sub(back).Round(time.Millisecond)
			switch {
			case r.err != nil:
				t.Errorf("waiter %d: %v", r.i, r.err)
			case d > bound:
				t.Errorf("waiter %d acquired %v after the server was back; want within %v", r.i, d, bound)
			default:
				t.Logf("waiter %d acquired %v after the server was back", r.i, d)
			}
		case <-deadline.C:
			dumpGoroutines(t)
			t.Fatalf("a waiter neither acquired nor failed within %v after the server was back", bound)
		}
	}
}

// progressBound is the safety suite's progress bound (P6) for a TTL of
// sess: 3 TTLs and its slack for ZooKeeper.
func progressBound(sess time.Duration) time.Duration { return 3*sess + 500*time.Millisecond }

// TestWaitersProgressAfterServerRestart: waiters queued behind a holder
// (blocking Acquire: the engine's AcquireWait) while the server their
// clients are connected to is killed (-9) and restarted with its data, or
// stopped for 3 session timeouts: each acquires the key, in turn, within
// the safety suite's progress bound after the server serves again. The
// server restores the sessions, so they survive unless their clients stay
// away: variants where the holder's process died during the outage (its
// session expires once the server is back), and where a waiter is cut
// off for 3 session timeouts once the server is back (its session
// expires; it must join the queue again).
//
// A client that resumes its session with watches set (every waiter has
// one, and a restarted server restores the sessions) trips a data race
// inside go-zookeeper v1.0.4: Conn.lastZxid written by recvLoop while the
// reconnecting loop reads it in sendSetWatches (go-zookeeper/zk PR #35,
// unmerged). It failed a CI run once, in the holder-crashed case; so
// under -race the test skips, and scripts/test runs it without -race, as
// every test named *NoRace.
func TestWaitersProgressAfterServerRestartNoRace(t *testing.T) {
	if raceEnabled {
		t.Skip("resuming a session with watches set trips a data race inside go-zookeeper (zk PR #35); runs without -race")
	}
	const sess = time.Second
	e, u := ownServer(t, sess)
	for _, tc := range []struct {
		name          string
		down          bool // stopped for 3 session timeouts, rather than kill -9 and restart
		holderCrashes bool
		waiterExpires bool
	}{
		{name: "kill-restart"},
		{name: "long-outage", down: true},
		{name: "holder-crashed", holderCrashes: true},
		{name: "waiter-session-expires", waiterExpires: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			q := newQueue(ctx, t, u, sess, "stall/"+t.Name(), 3)
			if tc.holderCrashes {
				q.holderB.crash()
			}
			if tc.down {
				if err := e.Stop(ctx, "zookeeper"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * sess) // the fault: an outage outlasting the session timeout
				if err := e.Start(ctx, "zookeeper"); err != nil {
					t.Fatal(err)
				}
			} else if err := e.Restart(ctx, "zookeeper"); err != nil {
				t.Fatal(err)
			}
			back := time.Now()
			bound := progressBound(sess)
			if !tc.holderCrashes {
				// The holder lets go: its lease was lost during the outage
				// (the engine then deletes its znode), or it releases now.
				go func() {
					rctx, rcancel := context.WithTimeout(ctx, 10*sess)
					defer rcancel()
					_ = q.holder.Release(rctx)
				}()
			}
			if tc.waiterExpires {
				q.waiterB[0].d.cut(true)
				time.Sleep(3 * sess) // the fault: cut off for longer than its session
				q.waiterB[0].d.cut(false)
				bound += 3 * sess
			}
			q.expectProgress(t, back, bound)
		})
	}
}

// silentListener listens on addr and accepts connections without ever
// answering them, nor closing them until the test ends: a server that
// accepts a TCP connection but does not answer the session handshake (a
// process frozen or starting up, a proxy whose upstream is gone). Each
// accepted connection is sent on the returned channel.
func silentListener(t *testing.T, addr string) (accepted <-chan net.Conn, stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan net.Conn, 64)
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case ch <- c:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ch, func() { l.Close(); <-done }
}

// TestWaitersProgressAfterSilentHandshake: the server stops while waiters
// are queued behind a holder whose process died; while it is down, its
// port accepts the clients' reconnections but never answers their session
// handshakes (silentListener); then the server starts again with its
// data. The waiters must each acquire the key within the safety suite's
// progress bound after the server serves again (the holder's session
// expires one session timeout after that). go-zookeeper alone waits
// 6⅔ session timeouts for a handshake's answer, and every request queued
// meanwhile, a waiter's re-read of its queue included, waits with it: the
// dialer bounds the handshake (dialer.handshakeTimeout).
func TestWaitersProgressAfterSilentHandshake(t *testing.T) {
	const sess = 2 * time.Second
	e, u := ownServer(t, sess)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const waiters = 3
	q := newQueue(ctx, t, u, sess, "stall/"+t.Name(), waiters)
	q.holderB.crash() // its session expires once the server is back
	if err := e.Stop(ctx, "zookeeper"); err != nil {
		t.Fatal(err)
	}
	accepted, stop := silentListener(t, pu.Host)
	for range waiters { // every waiter's client is in a handshake nobody answers
		select {
		case <-accepted:
		case <-time.After(10 * sess):
			stop()
			t.Fatal("the waiters' clients did not reconnect to the silent server")
		}
	}
	stop()
	if err := e.Start(ctx, "zookeeper"); err != nil {
		t.Fatal(err)
	}
	q.expectProgress(t, time.Now(), progressBound(sess))
}

// TestWaitersProgressAfterHolderReleaseFailed: the holder releases while
// the server is down, and the release fails (as the engine's one attempt
// to free a lease it took for lost while the server was down does). The
// server then starts again with its data, and the holder's session,
// restored by the server, survives its reconnection, so the znode would
// live as long as the holder's client; the holder makes no further call.
// The waiters queued behind it must each acquire the key within the safety
// suite's progress bound after the server serves again.
func TestWaitersProgressAfterHolderReleaseFailed(t *testing.T) {
	const sess = 4 * time.Second
	e, u := ownServer(t, sess)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	hb, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hb.Close() })
	key := "stall/" + t.Name()
	g, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: sess})
	if err != nil {
		t.Fatal(err)
	}
	q := newQueueBehind(ctx, t, u, sess, key, 3, hb)
	sid := hb.conn.SessionID()
	if err := e.Stop(ctx, "zookeeper"); err != nil {
		t.Fatal(err)
	}
	if err := hb.Release(ctx, g); err == nil || errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release while the server is down = %v; want a transport error", err)
	}
	if err := e.Start(ctx, "zookeeper"); err != nil {
		t.Fatal(err)
	}
	q.expectProgress(t, time.Now(), progressBound(sess))
	if got := hb.conn.SessionID(); got != sid {
		t.Errorf("the holder's session changed (%x -> %x): it expired, which deletes the znode anyway; the test needs it to survive", sid, got)
	}
}
