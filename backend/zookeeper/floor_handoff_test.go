package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"
)

// Tests of the token floor around a waiter's hand-off, whose sync goes
// out pipelined beside the confirming read (startSync).

// Session expiry of a backend with a cached floor: the new session maps
// zxids and hands off with the floor raised meanwhile.
func TestFloorHandOffExpiry(t *testing.T) {
	ctx := ctxT(t)
	const key = "rev-expiry"
	bs := openFresh(t, 3)
	hb, wb, rb := bs[0], bs[1], bs[2]
	gw, err := wb.Acquire(ctx, driver.AcquireRequest{Key: key + "-seen", Owner: "seen", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	sid := wb.conn.SessionID()
	killSession(t, wb)
	deadline := time.Now().Add(10 * time.Second)
	for wb.conn.SessionID() == sid || wb.conn.State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			t.Fatal("no new session within 10s")
		}
		time.Sleep(10 * time.Millisecond) // waiting for go-zookeeper's new session
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

// A backend on a connection the caller owns: the hand-off sees a raise.
func TestFloorHandOffCallerOwnedConn(t *testing.T) {
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
// mappings on backends whose cached floors are read and replaced
// concurrently (Inspect, List, HighWater, Acquire of other keys).
// Every token from a call that started after RaiseFloor(F) returned is
// above F; a key's holders get strictly increasing tokens; every backend
// maps a holder's zxid to the holder's token.
func TestFloorHandOffConcurrentRaises(t *testing.T) {
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
func TestFloorHandOffCloseDuringHandOff(t *testing.T) {
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
