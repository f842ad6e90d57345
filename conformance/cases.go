package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

func testBadInput(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	c := s.client(t)
	b := s.backend(t)
	base := s.key(t, "")
	bad := []string{"", strings.Repeat("k", driver.MaxKeyLen+1), base + "\xff\xfe", base + "a\x00b", base + "tab\tkey", base + "nl\n"}
	for _, k := range bad {
		if _, err := c.TryAcquire(ctx, k); !errors.Is(err, fencelock.ErrInvalidKey) {
			t.Errorf("Client.TryAcquire(%q) = %v; want ErrInvalidKey", k, err)
		}
		if _, err := c.Inspect(ctx, k); !errors.Is(err, fencelock.ErrInvalidKey) {
			t.Errorf("Client.Inspect(%q) = %v; want ErrInvalidKey", k, err)
		}
		// The backend must also refuse on its own: it owns validation
		// (see "Validation" in package driver), and callers such as
		// migrate do not go through the engine.
		_, err := b.Acquire(ctx, driver.AcquireRequest{Key: k, Owner: "conformance-bad", TTL: s.h.TTL})
		if !errors.Is(err, driver.ErrInvalidKey) {
			t.Errorf("Backend.Acquire(%q) = %v; want ErrInvalidKey", k, err)
		}
		var ke *driver.InvalidKeyError
		if err != nil && !errors.As(err, &ke) {
			t.Errorf("Backend.Acquire(%q) error %T is not an *InvalidKeyError", k, err)
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second, driver.MaxTTL + time.Second} {
		_, err := b.Acquire(ctx, driver.AcquireRequest{Key: base + "ttl", Owner: "conformance-bad", TTL: ttl})
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Backend.Acquire with TTL %v = %v; want ErrInvalidOption", ttl, err)
		}
	}
	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: base + "owner", TTL: s.h.TTL}); !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("Backend.Acquire with an empty Owner = %v; want ErrInvalidOption", err)
	}
	// Renew checks its request before it looks for the grant.
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: base + "renew", Owner: "conformance-bad", TTL: s.h.TTL})
	if err != nil {
		t.Fatalf("Backend.Acquire: %v", err)
	}
	for _, ttl := range []time.Duration{0, -time.Second, driver.MaxTTL + time.Second} {
		if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: ttl}); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("Backend.Renew with TTL %v = %v; want ErrInvalidOption", ttl, err)
		}
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatalf("Backend.Release: %v", err)
	}
	for _, o := range []fencelock.Options{
		{TTL: time.Nanosecond},
		{TTL: 48 * time.Hour},
		{TTL: time.Second, RenewInterval: 600 * time.Millisecond},
		{TTL: time.Second, Margin: 900 * time.Millisecond},
		{TTL: time.Second, RotateEvery: 900 * time.Millisecond},
	} {
		if _, err := fencelock.New(b, &o); !errors.Is(err, fencelock.ErrInvalidOption) {
			t.Errorf("New(%+v) = %v; want ErrInvalidOption", o, err)
		}
	}
	checkEmpty(t, ctx, c, base)
	checkEmpty(t, ctx, c, s.prefix+"BadInput")
}

func testOddKeys(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	c := s.client(t)
	base := s.key(t, "")
	odd := []string{"a b", "ключ/значение", "../up", "x/../y", "./.", "{tag}", "{", "}{", "%2F", "100%", "*", "?q=1&r", "a:b", "trail/", "//double", "#hash", "\\back", "quote'\"", "emoji-🔒", "a.b", "a_b", "a-b", "A"}
	leases := make(map[string]*fencelock.Lease)
	for _, k := range odd {
		l, err := c.TryAcquire(ctx, base+k)
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", base+k, err)
		}
		leases[base+k] = l
	}
	for k, l := range leases {
		info, err := c.Inspect(ctx, k)
		if err != nil {
			t.Fatalf("Inspect(%q): %v", k, err)
		}
		if info.Key != k || info.Owner != l.Owner() || info.Token != l.Token() {
			t.Errorf("Inspect(%q) = %+v; want key %q owner %q token %d", k, info, k, l.Owner(), l.Token())
		}
	}
	infos, err := c.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, in := range infos {
		got[in.Key] = true
		if _, ok := leases[in.Key]; !ok {
			t.Errorf("List returned unexpected key %q", in.Key)
		}
	}
	for k := range leases {
		if !got[k] {
			t.Errorf("List(%q) is missing %q", base, k)
		}
	}
	for _, l := range leases {
		mustRelease(t, l)
	}
	checkEmpty(t, ctx, c, base)
}

func testMutualExclusion(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "counter")
	const workers, rounds = 8, 25
	var (
		inside, maxInside atomic.Int32
		counter           int // protected only by the lock under test
		fence             fencelock.Fence
		wg                sync.WaitGroup
		errs              = make(chan error, workers*rounds*2) // never blocks a worker
	)
	clients := make([]*fencelock.Client, workers)
	for i := range clients {
		clients[i] = s.client(t)
	}
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[i]
			for range rounds {
				l, err := c.Acquire(ctx, key)
				if err != nil {
					errs <- fmt.Errorf("Acquire: %w", err)
					return
				}
				n := inside.Add(1)
				for {
					m := maxInside.Load()
					if n <= m || maxInside.CompareAndSwap(m, n) {
						break
					}
				}
				if err := fence.Admit(key, l); err != nil {
					errs <- fmt.Errorf("fence refused a live holder's token %d: %w", l.Token(), err)
				}
				v := counter
				time.Sleep(time.Duration(i%3) * 100 * time.Microsecond) // widen the race window
				counter = v + 1
				inside.Add(-1)
				if err := l.Release(ctx); err != nil {
					errs <- fmt.Errorf("Release: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m := maxInside.Load(); m > 1 {
		t.Errorf("%d holders were inside the critical section at once", m)
	}
	if counter != workers*rounds {
		t.Errorf("counter = %d; want %d (increments were lost to overlapping holders)", counter, workers*rounds)
	}
}

func testTokensIncrease(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "tokens")
	a, b := s.client(t), s.client(t)
	var last fencelock.Token
	step := func(what string, tok fencelock.Token) {
		t.Helper()
		if tok <= last {
			t.Fatalf("%s: token %d is not greater than the previous token %d", what, tok, last)
		}
		last = tok
	}
	for i := range 3 {
		for j, c := range []*fencelock.Client{a, b} {
			l, err := c.TryAcquire(ctx, key)
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			step(fmt.Sprintf("round %d, client %d: release then re-acquire", i, j), l.Token())
			mustRelease(t, l)
		}
	}
	// Takeover after a holder died without releasing.
	dead := s.backend(t)
	g := rawAcquire(t, ctx, dead, key, s.h.TTL)
	step("raw acquire", g.Token)
	s.crash(dead)
	// Wait for the TTL the store granted, which may be longer than asked.
	l, _ := s.waitFree(t, ctx, b, key, time.Now().Add(s.expiryBound(g, s.h.TTL)))
	step("takeover after expiry", l.Token())
	if f, ok := s.backend(t).(driver.ForceReleaser); ok {
		if _, err := f.ForceRelease(ctx, key); err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
		l2, err := a.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("TryAcquire after ForceRelease: %v", err)
		}
		step("acquire after force-release", l2.Token())
		mustRelease(t, l2)
		select {
		case <-l.Done():
		case <-time.After(l.TTL() + s.h.Slack):
			t.Fatalf("force-released holder (TTL %v) was not told within its TTL+slack", l.TTL())
		}
	} else {
		t.Log("capability ForceReleaser not implemented: force-release path not checked")
		mustRelease(t, l)
	}
	l3, err := a.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	step("final acquire", l3.Token())
	mustRelease(t, l3)
}

func testRotation(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rotate")
	b := s.backend(t)
	g := rawAcquire(t, ctx, b, key, s.h.TTL)
	g2, err := b.Renew(ctx, g, driver.RenewRequest{TTL: s.h.TTL, Rotate: true})
	if err != nil {
		t.Fatalf("Renew(Rotate): %v", err)
	}
	if g2.Token == g.Token {
		b.Release(ctx, g)
		t.Skip("token rotation not supported by this backend (Renew with Rotate kept the token): case not run")
	}
	if g2.Token < g.Token {
		t.Fatalf("rotation returned token %d, lower than %d", g2.Token, g.Token)
	}
	// The old token no longer renews or releases.
	if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: s.h.TTL}); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Renew with the pre-rotation token = %v; want ErrNotHeld", err)
	}
	if err := b.Release(ctx, g2); err != nil {
		t.Fatalf("Release(rotated): %v", err)
	}
	// And through the engine: the token advances while the lease lives.
	o := s.options()
	o.RenewInterval = s.h.TTL / 4
	o.RotateEvery = s.h.TTL / 4
	c := s.clientWith(t, o)
	l, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= g2.Token {
		t.Fatalf("new holder's token %d not above rotated token %d", l.Token(), g2.Token)
	}
	first := l.Token()
	deadline := time.Now().Add(2*s.h.TTL + s.h.Slack)
	for l.Token() == first && time.Now().Before(deadline) {
		select {
		case <-l.Done():
			t.Fatalf("lease lost while rotating: %v", l.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if l.Token() <= first {
		t.Fatalf("token did not rotate upwards within 2×TTL: still %d", l.Token())
	}
	mustRelease(t, l)
}

func testRestart(t *testing.T, s *suite) {
	if s.h.Restart == nil {
		t.Skip("Harness.Restart not provided: fencing across a store restart not checked")
	}
	ctx := s.ctx(t)
	key := s.key(t, "restart")
	c := s.client(t)
	var last fencelock.Token
	for range 3 {
		l, err := c.TryAcquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		last = l.Token()
		mustRelease(t, l)
	}
	if err := s.h.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	c2 := s.client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := c2.TryAcquire(ctx, key)
		if err == nil {
			if l.Token() <= last {
				t.Fatalf("after a store restart the token went from %d to %d: fencing tokens did not survive the restart", last, l.Token())
			}
			mustRelease(t, l)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("store did not serve TryAcquire within 30s of restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the store is coming back up: nothing to await but time
	}
}

func testCrashRelease(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "crash")
	dead := s.backend(t)
	c := s.client(t)
	sent := time.Now()
	g := rawAcquire(t, ctx, dead, key, s.h.TTL)
	s.crash(dead)
	// Both bounds are the TTL the store granted (Grant.TTL), which may
	// differ from the one asked for: the store keeps the record that long,
	// and no longer than that plus slack.
	ttl := grantedTTL(g, s.h.TTL)
	// Not before the TTL: half-way through, the key must still be held.
	select {
	case <-time.After(ttl / 2):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if l, err := c.TryAcquire(ctx, key); err == nil {
		t.Fatalf("key acquired (token %d) %v after a crashed holder took it with TTL %v (granted %v): expired too early", l.Token(), time.Since(sent), s.h.TTL, ttl)
	} else if !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatal(err)
	}
	l, at := s.waitFree(t, ctx, c, key, sent.Add(s.expiryBound(g, s.h.TTL)))
	if at.Sub(sent) < ttl-ttl/20 {
		t.Errorf("key free %v after acquire with TTL %v (granted %v): freed before its TTL", at.Sub(sent), s.h.TTL, ttl)
	}
	if l.Token() <= g.Token {
		t.Errorf("takeover token %d not above crashed holder's %d", l.Token(), g.Token)
	}
	t.Logf("crashed holder's key freed after %v (TTL %v, granted %v, bound %v)", at.Sub(sent), s.h.TTL, ttl, s.expiryBound(g, s.h.TTL))
	mustRelease(t, l)
}

func testRenewal(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "renew")
	c, other := s.client(t), s.client(t)
	l, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(3 * s.h.TTL)
	for time.Now().Before(end) {
		select {
		case <-l.Done():
			t.Fatalf("lease ended while being renewed: %v", l.Err())
		case <-time.After(s.h.TTL / 4):
		}
		if o, err := other.TryAcquire(ctx, key); err == nil {
			t.Fatalf("another client acquired a renewed lease (token %d vs %d)", o.Token(), l.Token())
		} else if !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatal(err)
		}
	}
	if err := l.Err(); err != nil {
		t.Fatalf("Err() = %v while held", err)
	}
	if l.Remaining() <= 0 {
		t.Fatalf("Remaining() = %v while held", l.Remaining())
	}
	mustRelease(t, l)
	if l.Err() != nil {
		t.Fatalf("Err() after Release = %v; want nil", l.Err())
	}
}

func testLossSignalled(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "loss")
	admin := s.backend(t)
	f := requireForce(t, admin)
	c, thief := s.client(t), s.client(t)
	l, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	removed, err := f.ForceRelease(ctx, key)
	if err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	if removed.Owner != l.Owner() || removed.Token != l.Token() {
		t.Errorf("ForceRelease removed %+v; want owner %q token %d", removed, l.Owner(), l.Token())
	}
	at := time.Now()
	tl, err := thief.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire after ForceRelease: %v", err)
	}
	bound := c.Options().RenewInterval + s.h.Slack
	select {
	case <-l.Done():
		t.Logf("holder noticed the loss after %v (bound %v)", time.Since(at), bound)
	case <-time.After(bound):
		t.Fatalf("holder not told of the loss within RenewInterval+slack (%v)", bound)
	}
	if err := l.Err(); !errors.Is(err, fencelock.ErrLeaseLost) {
		t.Fatalf("Err() = %v; want ErrLeaseLost", err)
	}
	if !errors.Is(context.Cause(l.Context()), fencelock.ErrLeaseLost) {
		t.Fatalf("context cause = %v; want ErrLeaseLost", context.Cause(l.Context()))
	}
	if err := l.Release(ctx); !errors.Is(err, fencelock.ErrNotHeld) {
		t.Fatalf("Release of a lost lease = %v; want ErrNotHeld", err)
	}
	info, err := thief.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Owner != tl.Owner() {
		t.Fatalf("the lost holder's Release disturbed the new holder: Inspect = %+v", info)
	}
	mustRelease(t, tl)
}

func testOwnerChecked(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "owner")
	a, bb := s.backend(t), s.backend(t)
	// a's grant expires; b takes over.
	ga := rawAcquire(t, ctx, a, key, s.h.TTL)
	s.crash(a)
	a2 := s.backend(t) // the stale holder's process comes back with a new connection
	var gb driver.Grant
	deadline := time.Now().Add(s.expiryBound(ga, s.h.TTL)) // the granted TTL, not the requested one
	for {
		g, err := bb.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-b-" + randHex(), TTL: 10 * s.h.TTL})
		if err == nil {
			gb = g
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) || time.Now().After(deadline) {
			t.Fatalf("Acquire after expiry: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling for the TTL to pass
	}
	stale := []struct {
		what string
		g    driver.Grant
	}{
		{"the expired holder's grant", ga},
		{"the right owner with an old token", driver.Grant{Key: key, Owner: gb.Owner, Token: ga.Token, Handle: gb.Handle}},
		{"the right token with another owner", driver.Grant{Key: key, Owner: ga.Owner, Token: gb.Token, Handle: gb.Handle}},
	}
	for _, st := range stale {
		if _, err := a2.Renew(ctx, st.g, driver.RenewRequest{TTL: s.h.TTL}); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Renew with %s = %v; want ErrNotHeld", st.what, err)
		}
		if err := a2.Release(ctx, st.g); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Release with %s = %v; want ErrNotHeld", st.what, err)
		}
	}
	info, err := a2.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Owner != gb.Owner || info.Token != gb.Token {
		t.Fatalf("after stale renew/release attempts Inspect = %+v; want holder %q token %d unchanged", info, gb.Owner, gb.Token)
	}
	if err := bb.Release(ctx, gb); err != nil {
		t.Fatalf("holder's Release: %v", err)
	}
	if err := bb.Release(ctx, gb); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("second Release = %v; want ErrNotHeld", err)
	}
	if _, err := bb.Renew(ctx, gb, driver.RenewRequest{TTL: s.h.TTL}); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Renew after Release = %v; want ErrNotHeld (renew must not resurrect a released lock)", err)
	}
	if info, err := a2.Inspect(ctx, key); err != nil || info.Locked() {
		t.Errorf("after release Inspect = %+v, %v; want free", info, err)
	}
	// Engine level: a released lease's Release reports ErrNotHeld.
	c := s.client(t)
	l, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	mustRelease(t, l)
	if err := l.Release(ctx); !errors.Is(err, fencelock.ErrNotHeld) {
		t.Errorf("Lease.Release twice = %v; want ErrNotHeld", err)
	}
}

func testCancelledWait(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "cancel")
	holder, waiter, next := s.client(t), s.client(t), s.client(t)
	l, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wctx, cancel := context.WithTimeout(ctx, time.Duration(50+50*i)*time.Millisecond)
			defer cancel()
			_, err := waiter.Acquire(wctx, key)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Acquire with an expiring context = %v; want context.DeadlineExceeded", err)
			}
		}()
	}
	wg.Wait()
	// An explicitly cancelled waiter too.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := waiter.Acquire(cctx, key); done <- err }()
	time.Sleep(50 * time.Millisecond) // let it start waiting; nothing observable to await
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Acquire = %v; want context.Canceled", err)
	}
	mustRelease(t, l)
	// Nothing left behind: the next contender gets the key at once.
	nl, err := next.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire after the waiters gave up: %v (a cancelled wait left a record or queue entry behind)", err)
	}
	mustRelease(t, nl)
	if got := waiter.Holding(); len(got) != 0 {
		t.Errorf("waiter's Holding() = %v after its waits were cancelled", got)
	}
	checkEmpty(t, ctx, next, key)
}

func testWaiterWoken(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "wake")
	holder, waiter := s.client(t), s.client(t)
	l, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *fencelock.Lease, 1)
	go func() {
		wl, err := waiter.Acquire(ctx, key)
		if err != nil {
			t.Errorf("waiting Acquire: %v", err)
		}
		got <- wl
	}()
	time.Sleep(100 * time.Millisecond) // let the waiter start waiting
	released := time.Now()
	mustRelease(t, l)
	bound := waiter.Options().MaxBackoff + s.h.Slack
	select {
	case wl := <-got:
		if wl == nil {
			return
		}
		t.Logf("waiter got the key %v after release", time.Since(released))
		if wl.Token() <= l.Token() {
			t.Errorf("waiter's token %d not above the previous holder's %d", wl.Token(), l.Token())
		}
		mustRelease(t, wl)
	case <-time.After(bound):
		t.Fatalf("waiter did not get the key within %v of its release", bound)
	}
}

func testInspectList(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	base := s.key(t, "")
	c, other := s.client(t), s.client(t)
	// Remaining is bounded by the TTL the store grants, which may be longer
	// than asked: learn it from a grant of a key outside base.
	probe := s.backend(t)
	pg := rawAcquire(t, ctx, probe, s.key(t, "probe"), s.h.TTL)
	if err := probe.Release(ctx, pg); err != nil {
		t.Fatal(err)
	}
	maxRemaining := max(s.h.TTL, grantedTTL(pg, s.h.TTL))
	keys := []string{base + "a/1", base + "a/2", base + "b/1"}
	var leases []*fencelock.Lease
	for i, k := range keys {
		cl := c
		if i == 2 {
			cl = other
		}
		l, err := cl.TryAcquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	for _, l := range leases {
		info, err := other.Inspect(ctx, l.Key())
		if err != nil {
			t.Fatal(err)
		}
		if !info.Locked() || info.Key != l.Key() || info.Owner != l.Owner() || info.Token != l.Token() {
			t.Errorf("Inspect(%q) = %+v; want owner %q token %d", l.Key(), info, l.Owner(), l.Token())
		}
		if info.Remaining < 0 || info.Remaining > maxRemaining+s.h.TTL/10 {
			t.Errorf("Inspect(%q).Remaining = %v; want within (0, granted TTL %v] or 0 for session-bound locks", l.Key(), info.Remaining, maxRemaining)
		}
	}
	if info, err := c.Inspect(ctx, base+"free"); err != nil || info.Locked() {
		t.Errorf("Inspect(free key) = %+v, %v; want not locked", info, err)
	}
	infos, err := c.List(ctx, base+"a/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Key != keys[0] || infos[1].Key != keys[1] {
		t.Errorf("List(%q) = %+v; want exactly %q", base+"a/", infos, keys[:2])
	}
	all, err := other.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 {
		t.Errorf("List(%q) = %+v; want 3 keys from both clients", base, all)
	}
	for _, in := range all {
		for _, l := range leases {
			if l.Key() == in.Key && (in.Owner != l.Owner() || in.Token != l.Token()) {
				t.Errorf("List entry %+v disagrees with lease (owner %q token %d)", in, l.Owner(), l.Token())
			}
		}
	}
	if h := c.Holding(); len(h) != 2 || h[0] != keys[0] || h[1] != keys[1] {
		t.Errorf("Holding() = %q; want %q", h, keys[:2])
	}
	for _, l := range leases {
		mustRelease(t, l)
	}
	checkEmpty(t, ctx, c, base)
}

func testClose(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	base := s.key(t, "")
	b, err := s.h.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := fencelock.New(b, s.options())
	if err != nil {
		t.Fatal(err)
	}
	var leases []*fencelock.Lease
	for i := range 5 {
		l, err := c.TryAcquire(ctx, fmt.Sprintf("%s%d", base, i))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	other := s.client(t)
	for _, l := range leases {
		select {
		case <-l.Done():
		default:
			t.Errorf("lease %q not ended by Close", l.Key())
		}
		nl, err := other.TryAcquire(ctx, l.Key())
		if err != nil {
			t.Errorf("TryAcquire(%q) after Close: %v; want free", l.Key(), err)
			continue
		}
		mustRelease(t, nl)
	}
	if _, err := c.TryAcquire(ctx, base+"after"); !errors.Is(err, fencelock.ErrClosed) {
		t.Errorf("TryAcquire on a closed client = %v; want ErrClosed", err)
	}
	checkEmpty(t, ctx, other, base)
}

func testManyLeases(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	base := s.key(t, "")
	// A TTL of at least 3s: the case is about holding many leases through
	// renewals, not about how fast a loaded machine renews a thousand.
	o := s.options()
	o.TTL = max(s.h.TTL, 3*time.Second)
	c := s.clientWith(t, o)
	n := s.h.Leases
	leases := make([]*fencelock.Lease, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			l, err := c.TryAcquire(ctx, fmt.Sprintf("%s%05d", base, i))
			if err != nil {
				t.Errorf("TryAcquire #%d: %v", i, err)
				return
			}
			leases[i] = l
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("acquired %d leases in %v", n, time.Since(start))
	// Hold through three renewal intervals.
	hold := time.NewTimer(o.TTL)
	defer hold.Stop()
	select {
	case <-hold.C:
	case <-leases[0].Done():
	}
	lostN := 0
	var firstErr error
	for _, l := range leases {
		if err := l.Err(); err != nil {
			lostN++
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if lostN > 0 {
		t.Fatalf("%d of %d leases lost while held through three renewals; first: %v", lostN, n, firstErr)
	}
	infos, err := c.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != n {
		t.Fatalf("List = %d keys; want %d", len(infos), n)
	}
	if h := c.Holding(); len(h) != n {
		t.Fatalf("Holding() = %d keys; want %d", len(h), n)
	}
	for _, l := range leases {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release(%q): %v", l.Key(), err)
			}
		}()
	}
	wg.Wait()
	checkEmpty(t, ctx, c, base)
}

type eventLog struct {
	mu     sync.Mutex
	events []fencelock.Event
}

func (r *eventLog) Observe(e fencelock.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// kinds returns the kinds of key's events, runs of one kind squeezed.
func (r *eventLog) kinds(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		k := e.Kind.String()
		if e.Key == key && (len(out) == 0 || out[len(out)-1] != k) {
			out = append(out, k)
		}
	}
	return out
}

// await polls the log (the observer offers nothing to block on) until an
// event of kind for key is recorded, failing the test after bound.
func (r *eventLog) await(t *testing.T, key string, kind fencelock.EventKind, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		if _, ok := r.last(key, kind); ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event for %q within %v; events %v", kind, key, bound, r.kinds(key))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *eventLog) last(key string, kind fencelock.EventKind) (fencelock.Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		if e := r.events[i]; e.Key == key && e.Kind == kind {
			return e, true
		}
	}
	return fencelock.Event{}, false
}

func testObserver(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "observed")
	rec := &eventLog{}
	o := s.options()
	o.Observer = rec
	c := s.clientWith(t, o)
	other := s.clientWith(t, o)
	l, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// Hold through at least one renewal.
	rec.await(t, key, fencelock.EventRenewed, s.h.TTL+s.h.Slack)
	// A contender waits, then gets the key on release.
	got := make(chan *fencelock.Lease, 1)
	go func() {
		wl, err := other.Acquire(ctx, key)
		if err != nil {
			t.Errorf("contended Acquire: %v", err)
		}
		got <- wl
	}()
	// Release only once the contender has found the key held.
	rec.await(t, key, fencelock.EventWaiting, s.h.TTL+s.h.Slack)
	mustRelease(t, l)
	wl := <-got
	if wl == nil {
		return
	}
	ks := rec.kinds(key)
	// The holder reports released after the store answered, by which time
	// the waiter may already have reported acquired: the last two may come
	// in either order.
	n := len(ks)
	if n < 5 || ks[0] != "acquired" || ks[1] != "renewed" || !slices.Contains(ks, "waiting") ||
		!((ks[n-2] == "released" && ks[n-1] == "acquired") || (ks[n-2] == "acquired" && ks[n-1] == "released")) {
		t.Errorf("events %v; want acquired, renewed…, waiting, then released and acquired", ks)
	}
	if e, _ := rec.last(key, fencelock.EventAcquired); !e.Contended || e.Token != wl.Token() || e.Owner != wl.Owner() || e.Backend == "" {
		t.Errorf("contended acquired event %+v; want contended, token %d, owner %q, a backend name", e, wl.Token(), wl.Owner())
	}
	if e, _ := rec.last(key, fencelock.EventReleased); e.Token != l.Token() || e.Held <= 0 {
		t.Errorf("released event %+v", e)
	}
	// Theft, where the backend can be made to drop the record.
	f, ok := s.backend(t).(driver.ForceReleaser)
	if !ok {
		mustRelease(t, wl)
		t.Log("capability ForceReleaser not implemented: the lost event was not checked")
		return
	}
	if _, err := f.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wl.Done():
	case <-time.After(o.TTL + s.h.Slack):
		t.Fatal("holder not told of the theft")
	}
	e, ok := rec.last(key, fencelock.EventLost)
	if !ok || !errors.Is(e.Err, fencelock.ErrNotHeld) || e.Token != wl.Token() {
		t.Errorf("lost event %+v (found %v); want cause ErrNotHeld for token %d; events %v", e, ok, wl.Token(), rec.kinds(key))
	}
}
