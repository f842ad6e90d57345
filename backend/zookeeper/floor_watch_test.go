package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"
)

// Tests of the watched floor cache (floors: live, shouldWatch, stale)
// and of the hand-off's pipelined sync (startSync).

// firedChan returns a watch channel that has fired, as go-zookeeper
// leaves it (one event, then closed).
func firedChan() <-chan zk.Event {
	ch := make(chan zk.Event, 1)
	ch <- zk.Event{Type: zk.EventNodeDataChanged}
	close(ch)
	return ch
}

// The cache's invariant: a watch it trusts was set by a read of the
// snapshot it holds (same mzxid), on the current session count, and has
// not fired; watches it stops trusting before they fire are bounded.
func TestFloorWatchFloorsCache(t *testing.T) {
	snap := func(mzxid int64) floorSnap {
		return floorSnap{h: history{starts: []int64{0}, offs: []int64{0}}, mzxid: mzxid}
	}
	var f floors
	if _, ok := f.live(0); ok {
		t.Fatal("live on an empty cache")
	}
	if !f.shouldWatch(0) {
		t.Fatal("no watch wanted on an empty cache")
	}
	w1 := make(chan zk.Event, 1)
	f.observeWatched(snap(10), 10, w1, 0)
	if s, ok := f.live(0); !ok || s.mzxid != 10 {
		t.Fatalf("live = %v, %v; want the watched snapshot", s.mzxid, ok)
	}
	if f.shouldWatch(0) {
		t.Fatal("another watch wanted beside a current one")
	}
	// An older read's watch is not installed, and the snapshot stays.
	f.observeWatched(snap(5), 20, make(chan zk.Event, 1), 0)
	if s, at, _ := f.get(); s.mzxid != 10 || at != 10 {
		t.Fatalf("after an older read: mzxid %d at %d; want 10 and 10 (nothing learnt)", s.mzxid, at)
	}
	if _, ok := f.live(0); !ok {
		t.Fatal("an older read replaced the live watch")
	}
	// A read without a watch of the same snapshot keeps the watch.
	f.observe(snap(10), 25)
	if _, ok := f.live(0); !ok {
		t.Fatal("an unwatched read of the same snapshot dropped the watch")
	}
	// After a reconnection (the session count moved) it is not trusted.
	if _, ok := f.live(1); ok {
		t.Fatal("live after a reconnection")
	}
	// A read of the same snapshot on the new session count replaces it.
	w2 := make(chan zk.Event, 1)
	f.observeWatched(snap(10), 25, w2, 1)
	if _, ok := f.live(1); !ok {
		t.Fatal("not live with the new watch")
	}
	// A newer snapshot without a watch drops it.
	f.observe(snap(30), 30)
	if _, ok := f.live(1); ok {
		t.Fatal("live after a newer unwatched snapshot")
	}
	// A fired watch is not trusted, and is forgotten.
	f.observeWatched(snap(40), 40, firedChan(), 1)
	if _, ok := f.live(1); ok {
		t.Fatal("live with a fired watch")
	}
	if f.watch != nil {
		t.Fatal("a fired watch kept after live saw it")
	}
	// Untrusted, unfired watches (w1, w2, and one per reconnection
	// below) are bounded: at maxStaleWatches no new watch is wanted, until
	// they fire.
	var open []chan zk.Event
	for gen := uint64(2); f.shouldWatch(gen); gen++ {
		w := make(chan zk.Event, 1)
		open = append(open, w)
		f.observeWatched(snap(40), 40, w, gen)
		if _, ok := f.live(gen); !ok {
			t.Fatalf("not live on session count %d", gen)
		}
		if gen > 100 {
			t.Fatal("untrusted watches grow without bound")
		}
	}
	if n := len(f.stale); n != maxStaleWatches {
		t.Fatalf("%d untrusted watches kept; want %d", n, maxStaleWatches)
	}
	w1 <- zk.Event{Type: zk.EventNodeDataChanged}
	close(w1)
	if !f.shouldWatch(1000) {
		t.Fatal("no watch wanted after an untrusted one fired")
	}
	_ = open
}

// reconnect cuts b's connection for a while (within its session) and
// waits until go-zookeeper has a session again, running during while the
// connection is down.
func reconnect(t *testing.T, b *Backend, during func()) {
	t.Helper()
	before := b.sessions.Load()
	b.d.cut(true)
	deadline := time.Now().Add(5 * time.Second)
	for b.conn.State() == zk.StateHasSession {
		if time.Now().After(deadline) {
			t.Fatal("go-zookeeper did not notice the cut connection")
		}
		time.Sleep(5 * time.Millisecond) // waiting for go-zookeeper to notice
	}
	if during != nil {
		during()
	}
	b.d.cut(false)
	for b.sessions.Load() == before || b.conn.State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			t.Fatal("no new connection within 5s")
		}
		time.Sleep(5 * time.Millisecond) // waiting for go-zookeeper to reconnect
	}
}

// A reconnection within the session makes the watched cache count for
// nothing until the floor is read again (the server that sets the watch
// again may answer other requests first), and a raise made while the
// waiter's backend was disconnected is applied in its hand-off.
func TestFloorWatchReconnect(t *testing.T) {
	if raceEnabled {
		t.Skip("reconnecting with watches trips a data race inside go-zookeeper (zk PR #35)")
	}
	ctx := ctxT(t)
	const key, seen = "rev-reconnect", "rev-reconnect-seen"
	bs := openFresh(t, 3)
	hb, wb, rb := bs[0], bs[1], bs[2]
	gw, err := wb.Acquire(ctx, driver.AcquireRequest{Key: seen, Owner: "seen", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := wb.fl.live(wb.sessions.Load()); !ok {
		t.Fatal("no watched cache after an Acquire")
	}
	// Nothing changes the floor: the watch cannot have fired, and still
	// the cache is not trusted after the reconnection.
	reconnect(t, wb, nil)
	if _, ok := wb.fl.live(wb.sessions.Load()); ok {
		t.Fatal("watched cache trusted after a reconnection")
	}
	g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := wb.Inspect(ctx, key); err != nil || info.Token != g1.Token {
		t.Fatalf("Inspect = %+v, %v; want %d", info, err, g1.Token)
	}
	if _, ok := wb.fl.live(wb.sessions.Load()); !ok {
		t.Fatal("no watched cache after a read on the new connection")
	}
	// A waiter queued, its backend disconnected while the floor is raised.
	wg, _ := handOffAbove(ctx, t, hb, wb, g1, func(floor driver.Token) {
		reconnect(t, wb, func() {
			if err := rb.RaiseFloor(ctx, key, floor); err != nil {
				t.Error(err)
			}
		})
	})
	if info, err := rb.Inspect(ctx, key); err != nil || info.Token != wg.Token {
		t.Fatalf("Inspect elsewhere = %+v, %v; want %d", info, err, wg.Token)
	}
	for _, g := range []driver.Grant{wg, gw} {
		if err := wb.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
}

// Session expiry of the backend holding a watched cache: the watch is
// dropped (and the session count moves), so the new session maps zxids
// and hands off with the floor raised meanwhile.
func TestFloorWatchExpiry(t *testing.T) {
	ctx := ctxT(t)
	const key = "rev-expiry"
	bs := openFresh(t, 3)
	hb, wb, rb := bs[0], bs[1], bs[2]
	gw, err := wb.Acquire(ctx, driver.AcquireRequest{Key: key + "-seen", Owner: "seen", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	gen := wb.sessions.Load()
	if _, ok := wb.fl.live(gen); !ok {
		t.Fatal("no watched cache after an Acquire")
	}
	killSession(t, wb)
	deadline := time.Now().Add(10 * time.Second)
	for wb.sessions.Load() == gen || wb.conn.State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			t.Fatal("no new session within 10s")
		}
		time.Sleep(10 * time.Millisecond) // waiting for go-zookeeper's new session
	}
	if _, ok := wb.fl.live(wb.sessions.Load()); ok {
		t.Fatal("watched cache trusted after the session expired")
	}
	if _, err := wb.Renew(ctx, gw, driver.RenewRequest{TTL: testTTL}); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Renew after expiry = %v; want ErrNotHeld", err)
	}
	g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wb.Inspect(ctx, key); err != nil { // a watched read on the new session
		t.Fatal(err)
	}
	wg, _ := handOffAbove(ctx, t, hb, wb, g1, func(floor driver.Token) {
		if err := rb.RaiseFloor(ctx, "", floor); err != nil {
			t.Fatal(err)
		}
	})
	if err := wb.Release(ctx, wg); err != nil {
		t.Fatal(err)
	}
}

// A connection the caller owns sets no watch: the cache is never trusted
// without a read, and the hand-off still sees a raise.
func TestFloorWatchCallerOwnedConn(t *testing.T) {
	ctx := ctxT(t)
	const key = "rev-owned"
	bs := openFresh(t, 2)
	hb, rb := bs[0], bs[1]
	conn, _, err := zk.Connect([]string{hb.conn.Server()}, testTTL, zk.WithLogInfo(false), zk.WithLogger(zkLogger{hb.log}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wb, err := New(ctx, conn, &Options{Prefix: hb.root, SessionTimeout: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	defer wb.Close()
	g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := wb.Inspect(ctx, key); err != nil || info.Token != g1.Token {
		t.Fatalf("Inspect = %+v, %v; want %d", info, err, g1.Token)
	}
	if _, ok := wb.fl.live(wb.sessions.Load()); ok || wb.fl.watch != nil {
		t.Fatal("a watched cache on a connection the caller owns")
	}
	wg, _ := handOffAbove(ctx, t, hb, wb, g1, func(floor driver.Token) {
		if err := rb.RaiseFloor(ctx, "", floor); err != nil {
			t.Fatal(err)
		}
	})
	if err := wb.Release(ctx, wg); err != nil {
		t.Fatal(err)
	}
}

// Raises from two other sessions race hand-offs, acquisitions and token
// mappings on backends whose watched caches are read, replaced and
// consumed concurrently (Inspect, List, HighWater, Acquire of other keys).
// Every token from a call that started after RaiseFloor(F) returned is
// above F; a key's holders get strictly increasing tokens; every backend
// maps a holder's zxid to the holder's token.
func TestFloorWatchConcurrentRaises(t *testing.T) {
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	const key = "rev-churn"
	bs := openFresh(t, 6)
	contenders, raisers, churners := bs[:3], bs[3:5], bs[:4]
	observer := bs[5]
	var (
		raised   atomic.Int64 // max F whose RaiseFloor returned
		hint     atomic.Int64 // max token seen
		stop     = make(chan struct{})
		stopOnce sync.Once
		failed   atomic.Bool
		mu       sync.Mutex // the key's holder
		last     driver.Token
		rounds   atomic.Int64
		nraises  atomic.Int64
	)
	fail := func(format string, args ...any) {
		if failed.CompareAndSwap(false, true) {
			t.Errorf(format, args...)
			stopOnce.Do(func() { close(stop) })
			cancel() // a waiter behind a holder that gave up
		}
	}
	seenToken := func(tok driver.Token) {
		for {
			h := hint.Load()
			if int64(tok) <= h || hint.CompareAndSwap(h, int64(tok)) {
				return
			}
		}
	}
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	// Raisers: floors above the tokens issued so far, so that each raise
	// adds a segment with a larger offset (at most ~40 in all: the history
	// stays exact).
	for i, rb := range raisers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for !stopped() && nraises.Add(1) <= 40 {
				f := hint.Load() + 1 + rng.Int64N(1_000_000)
				if err := rb.RaiseFloor(ctx, "", driver.Token(f)); err != nil {
					fail("RaiseFloor(%d): %v", f, err)
					return
				}
				for {
					r := raised.Load()
					if f <= r || raised.CompareAndSwap(r, f) {
						break
					}
				}
				time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
			}
		}()
	}
	// Churners: reads that refill, replace and consume the watched cache.
	for i, b := range churners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			other := fmt.Sprintf("rev-churn-other-%d", i)
			for n := 0; !stopped(); n++ {
				f0 := raised.Load()
				switch n % 4 {
				case 0:
					if _, err := b.Inspect(ctx, key); err != nil {
						fail("Inspect: %v", err)
						return
					}
				case 1:
					if _, err := b.List(ctx, "rev-churn"); err != nil {
						fail("List: %v", err)
						return
					}
				case 2:
					g, err := b.Acquire(ctx, driver.AcquireRequest{Key: other, Owner: "o", TTL: testTTL})
					if err != nil {
						fail("Acquire %s: %v", other, err)
						return
					}
					if int64(g.Token) <= f0 {
						fail("Acquire after RaiseFloor(%d) returned got token %d", f0, g.Token)
						return
					}
					seenToken(g.Token)
					if err := b.Release(ctx, g); err != nil {
						fail("Release: %v", err)
						return
					}
				case 3:
					if i == 0 && n%16 == 3 {
						if _, err := b.HighWater(ctx, ""); err != nil {
							fail("HighWater: %v", err)
							return
						}
					}
				}
			}
		}()
	}
	// Contenders: wait for the key, check the token, let every other
	// backend map it, rotate once, release.
	deadline := time.Now().Add(6 * time.Second)
	for i, b := range contenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("c%d", i)
			for !stopped() && time.Now().Before(deadline) {
				f0 := raised.Load()
				g, err := b.AcquireWait(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: testTTL})
				if err == nil {
					g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: testTTL}) // the engine's confirmation
				}
				if err != nil {
					fail("%s: hand-off: %v", owner, err)
					return
				}
				rounds.Add(1)
				mu.Lock()
				prev := last
				last = g.Token
				mu.Unlock()
				if int64(g.Token) <= f0 || g.Token <= prev {
					fail("%s: token %d; floor returned before the wait %d, previous holder %d", owner, g.Token, f0, prev)
					return
				}
				seenToken(g.Token)
				for _, o := range append([]*Backend{observer}, contenders...) {
					if info, err := o.Inspect(ctx, key); err != nil || info.Token != g.Token || info.Owner != owner {
						fail("Inspect of %s's grant = %+v, %v; want token %d", owner, info, err, g.Token)
						return
					}
				}
				f1 := raised.Load()
				rg, err := b.Renew(ctx, g, driver.RenewRequest{TTL: testTTL, Rotate: true})
				if err != nil || rg.Token <= g.Token || int64(rg.Token) <= f1 {
					fail("%s: rotation = %+v, %v; want above %d and floor %d", owner, rg, err, g.Token, f1)
					return
				}
				mu.Lock()
				last = rg.Token
				mu.Unlock()
				seenToken(rg.Token)
				if info, err := observer.Inspect(ctx, key); err != nil || info.Token != rg.Token {
					fail("Inspect of %s's rotated grant = %+v, %v; want token %d", owner, info, err, rg.Token)
					return
				}
				if err := b.Release(ctx, rg); err != nil {
					fail("%s: Release: %v", owner, err)
					return
				}
			}
		}()
	}
	for time.Now().Before(deadline) && !stopped() {
		time.Sleep(50 * time.Millisecond) // the run's length
	}
	stopOnce.Do(func() { close(stop) })
	wg.Wait()
	t.Logf("%d hand-offs, %d raises", rounds.Load(), min(nraises.Load(), 40))
	if !failed.Load() && rounds.Load() < 10 {
		t.Errorf("only %d hand-offs", rounds.Load())
	}
}

// Close racing a waiter's hand-off (its sync in flight beside confirm's
// read) leaves no goroutine behind.
func TestFloorWatchCloseDuringHandOff(t *testing.T) {
	u := testURL(t)
	ctx := ctxT(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	hb, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	for i := range 12 {
		key := fmt.Sprintf("rev-close-%d", i)
		wb, err := Open(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		g1, err := hb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "holder", TTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan driver.Grant, 1)
		go func() {
			g, err := wb.AcquireWait(ctx, driver.AcquireRequest{Key: key, Owner: "waiter", TTL: testTTL})
			if err != nil {
				got <- driver.Grant{}
				return
			}
			got <- g
		}()
		queued(t, hb, key, 2)
		if err := hb.Release(ctx, g1); err != nil {
			t.Fatal(err)
		}
		g := <-got
		if g.Handle == "" {
			t.Fatal("AcquireWait failed")
		}
		done := make(chan error, 1)
		go func() {
			_, err := wb.Renew(ctx, g, driver.RenewRequest{TTL: testTTL})
			done <- err
		}()
		time.Sleep(time.Duration(i) * 100 * time.Microsecond)
		wb.Close()
		select {
		case err := <-done:
			t.Logf("round %d: Renew during Close: %v", i, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Renew did not return within 10s of Close")
		}
	}
}

// floorWatchers counts the watch channels go-zookeeper keeps for the
// floor znode (its unexported watcher map, read without its lock: no
// request may be in flight).
func floorWatchers(b *Backend) int {
	v := reflect.ValueOf(b.conn).Elem().FieldByName("watchers")
	v = reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem()
	n := 0
	for _, k := range v.MapKeys() {
		if k.FieldByName("path").String() == b.floorPath() {
			n += v.MapIndex(k).Len()
		}
	}
	return n
}

// Each reconnection makes the next floor read set another data watch
// (the session count moved), while go-zookeeper keeps the previous,
// unfired one (it sets it again on the new connection) until the floor
// znode changes, which only RaiseFloor and HighWater do: with a flapping
// connection the channels would pile up without bound. They stop at
// 1 + maxStaleWatches, and tokens stay right beyond that.
func TestFloorWatchWatchersPerReconnect(t *testing.T) {
	if raceEnabled {
		t.Skip("reconnecting with watches trips a data race inside go-zookeeper (zk PR #35); the count reads go-zookeeper's map unlocked")
	}
	ctx := ctxT(t)
	bs := openFresh(t, 2)
	hb, wb := bs[0], bs[1]
	reconnections := maxStaleWatches + 4
	var counts []int
	for i := range reconnections + 1 {
		if i > 0 {
			reconnect(t, wb, nil)
		}
		g, err := hb.Acquire(ctx, driver.AcquireRequest{Key: "rev-watchers", Owner: "h", TTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		// Maps a new zxid: reads the floor unless the cache is live.
		if info, err := wb.Inspect(ctx, "rev-watchers"); err != nil || info.Token != g.Token {
			t.Fatalf("Inspect = %+v, %v; want token %d", info, err, g.Token)
		}
		counts = append(counts, floorWatchers(wb))
		if err := hb.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range counts {
		if n > 1+maxStaleWatches {
			t.Fatalf("go-zookeeper watch channels on the floor znode after 0..%d reconnections: %v; want at most %d (after %d: %d)", reconnections, counts, 1+maxStaleWatches, i, n)
		}
	}
	// A raise (one that writes the floor znode) fires them all; the next
	// read sets one watch again.
	g0, err := hb.Acquire(ctx, driver.AcquireRequest{Key: "rev-watchers", Owner: "h", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if err := hb.Release(ctx, g0); err != nil {
		t.Fatal(err)
	}
	floor := g0.Token + 1_000_000
	if err := hb.RaiseFloor(ctx, "", floor); err != nil {
		t.Fatal(err)
	}
	g, err := hb.Acquire(ctx, driver.AcquireRequest{Key: "rev-watchers", Owner: "h", TTL: testTTL})
	if err != nil || g.Token <= floor {
		t.Fatalf("Acquire after RaiseFloor(%d) = %+v, %v", floor, g, err)
	}
	if info, err := wb.Inspect(ctx, "rev-watchers"); err != nil || info.Token != g.Token {
		t.Fatalf("Inspect after the raise = %+v, %v; want token %d", info, err, g.Token)
	}
	if _, ok := wb.fl.live(wb.sessions.Load()); !ok {
		t.Fatal("no watched cache after the stale watches fired")
	}
	if err := hb.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
}
