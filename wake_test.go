package fencelock_test

// Adversarial review of d51ec7d ("engine: a late notification no longer
// silences a waiter until its backoff"): interleavings of notifications,
// pauses, timers, closed watches and cancellations around acquirePolling.
// Every test runs in a synctest bubble (fake time).

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// wakeHub is a notification source shared by the wakeLab backends of one
// test: every Watch gets its own channel (buffer 1; a send that finds it
// full is dropped, as the real backends do), which ends (closes) with the
// Watch's context. A 1-buffered channel is its lock, so that nothing in a
// bubble blocks on a sync.Mutex.
// Not a fakebackend: it simulates notification delivery across clients, not a store.
type wakeHub struct {
	lock   chan struct{}
	subs   map[chan struct{}]struct{}
	closed bool
	sent   atomic.Int64
}

func newWakeHub() *wakeHub {
	return &wakeHub{lock: make(chan struct{}, 1), subs: make(map[chan struct{}]struct{})}
}

// notify wakes every current watcher.
func (h *wakeHub) notify() {
	h.lock <- struct{}{}
	for ch := range h.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	<-h.lock
	h.sent.Add(1)
}

// closeAll ends every watch (the subscription dropped), and every later one.
func (h *wakeHub) closeAll() {
	h.lock <- struct{}{}
	for ch := range h.subs {
		close(ch)
		delete(h.subs, ch)
	}
	h.closed = true
	<-h.lock
}

func (h *wakeHub) watchers() int {
	h.lock <- struct{}{}
	defer func() { <-h.lock }()
	return len(h.subs)
}

func (h *wakeHub) watch(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	h.lock <- struct{}{}
	if h.closed {
		close(ch)
	} else {
		h.subs[ch] = struct{}{}
	}
	<-h.lock
	context.AfterFunc(ctx, func() {
		h.lock <- struct{}{}
		if _, ok := h.subs[ch]; ok {
			delete(h.subs, ch)
			close(ch)
		}
		<-h.lock
	})
	return ch
}

// wakeLab is one client's backend: a memory backend whose Watch is the
// hub's, which counts acquire attempts and can make its own calls notify
// the hub.
// Not a fakebackend: it is a wake-up scheduling simulation sharing one wakeHub.
type wakeLab struct {
	driver.Backend
	hub           *wakeHub
	selfNotify    bool // a failed Acquire notifies (migrate.Dual giving back one side)
	renewNotify   bool // a Renew notifies (the file backend's inotify watch)
	releaseNotify bool // a Release notifies
	// held, if set, rewrites the HeldError of attempt n.
	held func(n int64, h *driver.HeldError)
	// acquire, if set, replaces the backend's Acquire.
	acquire  func(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error)
	spin     func() // called when attempts reach 10,000
	attempts atomic.Int64
	last     atomic.Int64 // fake-time UnixNano of the last attempt's answer
	watchCtx atomic.Pointer[context.Context]
}

func (w *wakeLab) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	n := w.attempts.Add(1)
	if n == 10_000 && w.spin != nil {
		w.spin()
	}
	var (
		g   driver.Grant
		err error
	)
	if w.acquire != nil {
		g, err = w.acquire(ctx, r)
	} else {
		g, err = w.Backend.Acquire(ctx, r)
	}
	var he *driver.HeldError
	if w.held != nil && errors.As(err, &he) {
		w.held(n, he)
	}
	w.last.Store(time.Now().UnixNano())
	if err != nil && w.selfNotify {
		w.hub.notify()
	}
	return g, err
}

func (w *wakeLab) Renew(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error) {
	g, err := w.Backend.Renew(ctx, g, r)
	if err == nil && w.renewNotify {
		w.hub.notify()
	}
	return g, err
}

func (w *wakeLab) Release(ctx context.Context, g driver.Grant) error {
	err := w.Backend.Release(ctx, g)
	if err == nil && w.releaseNotify {
		w.hub.notify()
	}
	return err
}

func (w *wakeLab) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	w.watchCtx.Store(&ctx)
	return w.hub.watch(ctx), nil
}

func (w *wakeLab) lastAttempt() time.Time { return time.Unix(0, w.last.Load()) }

// holdRaw takes key in store for owner "holder", outside any client.
func holdRaw(t *testing.T, store *memory.Store, key string, ttl time.Duration) driver.Grant {
	t.Helper()
	g, err := store.Backend().Acquire(t.Context(), driver.AcquireRequest{Key: key, Owner: "holder", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func releaseRaw(t *testing.T, store *memory.Store, g driver.Grant) {
	t.Helper()
	if err := store.Backend().Release(t.Context(), g); err != nil {
		t.Fatal(err)
	}
}

// waitBehind holds "k" in a fresh store (for an hour, outside any client)
// and starts an Acquire of it by a client over a plain wakeLab with
// options o.
func waitBehind(t *testing.T, o *fencelock.Options) (*memory.Store, driver.Grant, *wakeHub, *wakeLab, <-chan acquired) {
	t.Helper()
	store := memory.NewStore()
	h := holdRaw(t, store, "k", time.Hour)
	hub := newWakeHub()
	lab := &wakeLab{Backend: store.Backend(), hub: hub}
	return store, h, hub, lab, acquireAsync(t.Context(), newClient(t, lab, o), "k", false)
}

// notifyAndWaitAttempt sends one notification and lets fake time run until
// the waiter has made an attempt after it (for at most two minutes of fake
// time: a waiter that ignores the notification attempts when its backoff
// timer fires, and one that has returned never does).
func notifyAndWaitAttempt(hub *wakeHub, lab *wakeLab) {
	n := lab.attempts.Load()
	hub.notify()
	synctest.Wait()
	for start := time.Now(); lab.attempts.Load() == n && time.Since(start) < 2*time.Minute; {
		step := time.Millisecond
		if time.Since(start) > time.Second {
			step = 100 * time.Millisecond
		}
		time.Sleep(step)
		synctest.Wait()
	}
}

// releaseNotified releases h outside any client, notifies the release,
// and waits (takeWithin) for the waiter to take the key within bound.
func releaseNotified(t *testing.T, store *memory.Store, h driver.Grant, hub *wakeHub, got <-chan acquired, bound time.Duration, what string) time.Duration {
	t.Helper()
	releaseRaw(t, store, h)
	released := time.Now()
	hub.notify()
	return takeWithin(t, got, released, bound, what)
}

// takeWithin waits for the waiter's result and fails unless it holds the
// key within bound of since.
func takeWithin(t *testing.T, got <-chan acquired, since time.Time, bound time.Duration, what string) time.Duration {
	t.Helper()
	r := <-got
	if r.err != nil {
		t.Fatalf("%s: Acquire = %v", what, r.err)
	}
	d := time.Since(since)
	if err := r.l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d > bound {
		t.Errorf("%s: the waiter took the key %v after its release was notified; want at most %v", what, d, bound)
	}
	return d
}

// Scenario: one late notification, then a second change that did not free
// the key (the waiter pauses), and the key is released and notified
// during that pause. The waiter must take it within its pause (MinBackoff).
func TestReleaseDuringPauseIsPrompt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &fencelock.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: time.Minute}
		store, h, hub, lab, got := waitBehind(t, o)
		time.Sleep(20 * time.Second) // timed attempts: the backoff grows
		synctest.Wait()
		notifyAndWaitAttempt(hub, lab) // late: same holder, the waiter is quiet
		hub.notify()                   // not freeing the key either: a pause starts
		synctest.Wait()
		time.Sleep(time.Millisecond) // inside the pause (at least MinBackoff/2)
		releaseNotified(t, store, h, hub, got, o.MinBackoff, "release during the pause")
	})
}

// Scenario: a burst of notifications in one instant (coalesced by the
// channel's buffer), then the release. The burst must cost few attempts
// (at most 3: the waiter may take the burst's notifications in up to
// three rounds, as goroutines interleave), and must not delay the
// release's attempt beyond the pause that many wake-ups leave (it doubles
// at each quiet one: 4 x MinBackoff after three).
func TestBurstInOneInstantThenRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &fencelock.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: time.Minute}
		store, h, hub, lab, got := waitBehind(t, o)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		n := lab.attempts.Load()
		for range 100 {
			hub.notify()
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if d := lab.attempts.Load() - n; d > 3 {
			t.Errorf("a burst of 100 notifications in one instant led to %d attempts; want at most 3", d)
		}
		releaseNotified(t, store, h, hub, got, 4*o.MinBackoff, "release after a burst")
	})
}

// Scenario: several notifications in a row that do not free the key, each
// arriving after the waiter acted on the one before (late notifications,
// or changes such as a holder's renewal on a backend that notifies them),
// then the release and its notification. Property (1), as the engine
// bounds it: after k wake-ups that did not free the key, the pause before
// the attempt is at most MinBackoff x 2^(k-1) (it doubles at each, so that
// waiters woken by their own attempts do not spin); the old code waited
// for its backoff timer (31-40s here).
func TestStaleRunThenReleaseIsPrompt(t *testing.T) {
	for _, k := range []int{2, 3, 6} {
		t.Run(fmt.Sprintf("stale=%d", k), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &fencelock.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: time.Minute}
				store, h, hub, lab, got := waitBehind(t, o)
				time.Sleep(20 * time.Second)
				synctest.Wait()
				for range k {
					notifyAndWaitAttempt(hub, lab)
				}
				d := releaseNotified(t, store, h, hub, got, o.MinBackoff<<(k-1), fmt.Sprintf("after %d stale notifications", k))
				t.Logf("after %d notifications that did not free the key, the release was taken after %v", k, d)
			})
		})
	}
}

// Scenario: waiters whose own failed attempts notify every waiter
// (migrate.Dual taking and giving back the free side), sharing one
// source. Property (2): no waiter hammers the store; the existing spin
// test's bound is 200 attempts in 2s with the defaults, per waiter.
func TestSelfNotifyingWaitersDoNotSpin(t *testing.T) {
	for _, n := range []int{1, 8} {
		t.Run(fmt.Sprintf("waiters=%d", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				holdRaw(t, store, "k", time.Hour)
				hub := newWakeHub()
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				defer cancel()
				labs := make([]*wakeLab, n)
				gots := make([]<-chan acquired, n)
				for i := range n {
					labs[i] = &wakeLab{Backend: store.Backend(), hub: hub, selfNotify: true, spin: cancel}
					gots[i] = acquireAsync(ctx, newClient(t, labs[i], nil), "k", false)
				}
				for i := range n {
					if r := <-gots[i]; r.err == nil {
						t.Fatal("a waiter took a key nobody released")
					}
				}
				for i, l := range labs {
					if a := l.attempts.Load(); a > 200 {
						t.Errorf("waiter %d of %d made %d attempts in 2s on a key nobody released", i, n, a)
					} else {
						t.Logf("waiter %d of %d: %d attempts in 2s", i, n, a)
					}
				}
			})
		})
	}
}

// Scenario: MinBackoff == MaxBackoff and a self-notifying waiter: it must
// not try more often than a polling waiter could (every MinBackoff/2 at
// the fastest).
func TestMinEqualsMaxSelfNotifyingPollsNoFaster(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		holdRaw(t, store, "k", time.Hour)
		hub := newWakeHub()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		lab := &wakeLab{Backend: store.Backend(), hub: hub, selfNotify: true, spin: cancel}
		o := &fencelock.Options{MinBackoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
		if r := <-acquireAsync(ctx, newClient(t, lab, o), "k", false); r.err == nil {
			t.Fatal("took a key nobody released")
		}
		bound := int64(2*time.Second/(o.MinBackoff/2)) + 3
		t.Logf("%d attempts in 2s (bound %d)", lab.attempts.Load(), bound)
		if a := lab.attempts.Load(); a > bound {
			t.Errorf("MinBackoff == MaxBackoff: %d attempts in 2s; a polling waiter makes at most %d", a, bound)
		}
	})
}

// Scenario: MinBackoff == MaxBackoff, a run of stale notifications, then
// the release: the pause cannot grow, the release is taken within
// MinBackoff.
func TestMinEqualsMaxStaleRunThenRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &fencelock.Options{MinBackoff: 50 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
		store, h, hub, lab, got := waitBehind(t, o)
		time.Sleep(time.Second)
		synctest.Wait()
		for range 5 {
			notifyAndWaitAttempt(hub, lab)
		}
		releaseNotified(t, store, h, hub, got, o.MinBackoff, "MinBackoff == MaxBackoff")
	})
}

// Scenario: a very small MinBackoff (1ns) and a self-notifying waiter:
// the pause doubles from 1ns; it must still not spin.
func TestTinyMinBackoffSelfNotifyingDoesNotSpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		holdRaw(t, store, "k", time.Hour)
		hub := newWakeHub()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		lab := &wakeLab{Backend: store.Backend(), hub: hub, selfNotify: true, spin: cancel}
		o := &fencelock.Options{MinBackoff: time.Nanosecond}
		if r := <-acquireAsync(ctx, newClient(t, lab, o), "k", false); r.err == nil {
			t.Fatal("took a key nobody released")
		}
		t.Logf("%d attempts in 2s", lab.attempts.Load())
		if a := lab.attempts.Load(); a > 200 {
			t.Errorf("MinBackoff 1ns: %d attempts in 2s on a key nobody released", a)
		}
	})
}

// Scenario: a very small MinBackoff (1µs), a late notification, then the
// release: taken within 2 x MinBackoff.
func TestTinyMinBackoffStaleThenRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &fencelock.Options{MinBackoff: time.Microsecond, MaxBackoff: time.Minute}
		store, h, hub, lab, got := waitBehind(t, o)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		notifyAndWaitAttempt(hub, lab)
		releaseNotified(t, store, h, hub, got, 2*o.MinBackoff, "MinBackoff 1µs")
	})
}

// Scenario: the watch ends (channel closed) while the waiter pauses.
// Property (3): the waiter falls back to polling, without spinning on the
// closed channel, and takes a key released without notification within
// MaxBackoff.
func TestClosedWhilePausedFallsBackToPolling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		h := holdRaw(t, store, "k", time.Hour)
		hub := newWakeHub()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		lab := &wakeLab{Backend: store.Backend(), hub: hub, spin: cancel}
		o := &fencelock.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
		got := acquireAsync(ctx, newClient(t, lab, o), "k", false)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		notifyAndWaitAttempt(hub, lab) // quiet
		hub.notify()                   // paused
		synctest.Wait()
		n := lab.attempts.Load()
		hub.closeAll()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		bound := int64(3*time.Second/(o.MaxBackoff/2)) + 4
		if a := lab.attempts.Load() - n; a > bound {
			t.Errorf("after the watch closed during a pause: %d attempts in 3s; polling at MaxBackoff makes at most %d", a, bound)
		}
		releaseRaw(t, store, h) // no notification: the watch is gone
		released := time.Now()
		takeWithin(t, got, released, o.MaxBackoff+time.Millisecond, "closed watch")
	})
}

// Scenario: a run of late notifications (the pause grows), then the watch
// goes silent (delivers nothing, stays open). Property (3): the backoff
// still finds a release made without notification within MaxBackoff.
func TestSilentWatchAfterStaleRunStillPolls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &fencelock.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
		store, h, hub, lab, got := waitBehind(t, o)
		time.Sleep(time.Second)
		synctest.Wait()
		for range 6 {
			notifyAndWaitAttempt(hub, lab)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		releaseRaw(t, store, h)
		released := time.Now()
		takeWithin(t, got, released, o.MaxBackoff+time.Millisecond, "silent watch")
	})
}

// Scenario: the holder's record expires (3s TTL, never renewed, no
// notification) while the waiter is quiet, its pause grown by a run of
// stale notifications and more notifications keep coming. Property (3):
// the waiter takes the key no later than the holder's remaining TTL plus
// a little (1ms in the engine; here MinBackoff).
func TestQuietWaiterHonoursHolderExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		start := time.Now()
		holdRaw(t, store, "k", 3*time.Second)
		expires := start.Add(3 * time.Second)
		hub := newWakeHub()
		lab := &wakeLab{Backend: store.Backend(), hub: hub}
		o := &fencelock.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: time.Minute}
		got := acquireAsync(t.Context(), newClient(t, lab, o), "k", false)
		got2 := make(chan acquired, 1)
		took := make(chan time.Time, 1)
		go func() { r := <-got; took <- time.Now(); got2 <- r }()
		time.Sleep(time.Second)
		synctest.Wait()
		for range 7 { // pauses 5ms .. 320ms: well before the expiry
			notifyAndWaitAttempt(hub, lab)
		}
		stop := make(chan struct{})
		go func() { // stale notifications every 30ms until the waiter returns
			for {
				select {
				case <-stop:
					return
				case <-time.After(30 * time.Millisecond):
					hub.notify()
				}
			}
		}()
		at := <-took
		close(stop)
		r := <-got2
		if r.err != nil {
			t.Fatal(r.err)
		}
		defer r.l.Release(context.Background())
		if late := at.Sub(expires); late > o.MinBackoff {
			t.Errorf("the waiter took the key %v after the holder's record expired; want at most %v", late, o.MinBackoff)
		}
	})
}

// Scenario: the holder's Remaining is shorter than the waiter's pause
// (100ms, reported by every attempt), with a notification that leads to a
// pause: the attempt comes at the holder's expiry, not at the pause's end.
func TestRemainingShorterThanPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		holdRaw(t, store, "k", time.Hour)
		hub := newWakeHub()
		lab := &wakeLab{Backend: store.Backend(), hub: hub,
			held: func(_ int64, h *driver.HeldError) { h.Holder.Remaining = 100 * time.Millisecond }}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		o := &fencelock.Options{MinBackoff: 400 * time.Millisecond, MaxBackoff: time.Minute}
		got := acquireAsync(ctx, newClient(t, lab, o), "k", false)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		notifyAndWaitAttempt(hub, lab) // quiet
		at := lab.lastAttempt()
		hub.notify() // a pause of 200-400ms: longer than the 100ms left
		synctest.Wait()
		n := lab.attempts.Load()
		time.Sleep(time.Until(at.Add(101 * time.Millisecond)))
		synctest.Wait()
		if lab.attempts.Load() == n {
			t.Errorf("no attempt at the holder's expiry (100ms + 1ms after the last attempt): the pause postponed it")
		}
		cancel()
		<-got
	})
}

// Scenario: ctx ends while the waiter pauses (quiet, pause grown).
// Properties (4) and (5): Acquire returns at once (no fake time passes),
// with the context's error, and its watch ends.
func TestCancelWhilePausedEndsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		holdRaw(t, store, "k", time.Hour)
		hub := newWakeHub()
		lab := &wakeLab{Backend: store.Backend(), hub: hub}
		o := &fencelock.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: time.Minute}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		got := acquireAsync(ctx, newClient(t, lab, o), "k", false)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		for range 5 {
			notifyAndWaitAttempt(hub, lab)
		}
		hub.notify() // paused (40ms .. 80ms)
		synctest.Wait()
		n := lab.attempts.Load()
		cancelled := time.Now()
		cancel()
		r := <-got
		if d := time.Since(cancelled); d != 0 {
			t.Errorf("Acquire returned %v after its context ended; want at once", d)
		}
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("Acquire = %v; want context.Canceled", r.err)
		}
		if lab.attempts.Load() != n {
			t.Errorf("%d attempts after the context ended", lab.attempts.Load()-n)
		}
		synctest.Wait()
		if w := lab.watchCtx.Load(); w == nil || (*w).Err() == nil {
			t.Error("the waiter's watch is still on after Acquire returned")
		}
		if k := hub.watchers(); k != 0 {
			t.Errorf("%d watches left after Acquire returned", k)
		}
	})
}

// Scenario: an attempt woken by a notification has an ambiguous outcome
// (the store granted the key, the reply was lost), and ctx ends while the
// waiter waits. Property (4): the record is abandoned (removed).
func TestAmbiguousAttemptAbandonedOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		h := holdRaw(t, store, "k", time.Hour)
		hub := newWakeHub()
		var lose atomic.Bool
		lab := &wakeLab{Backend: store.Backend(), hub: hub}
		lab.acquire = func(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
			g, err := store.Backend().Acquire(ctx, r)
			if err == nil && lose.Load() {
				return driver.Grant{}, errors.New("reply lost")
			}
			return g, err
		}
		o := &fencelock.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: time.Minute}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		got := acquireAsync(ctx, newClient(t, lab, o), "k", false)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		lose.Store(true)
		releaseRaw(t, store, h)
		notifyAndWaitAttempt(hub, lab) // takes the key; the reply is lost
		if info, _ := store.Backend().Inspect(t.Context(), "k"); !info.Locked() || info.Owner == "holder" {
			t.Fatalf("the notified attempt did not take the key: %+v", info)
		}
		notifyAndWaitAttempt(hub, lab) // a late one: the retry, by owner, is granted again, and lost again
		time.Sleep(time.Second)
		synctest.Wait()
		cancel()
		r := <-got
		if r.err == nil {
			t.Fatal("Acquire succeeded; want the context's error")
		}
		mustFree(t, store, "k")
	})
}

// Scenario: a notification (with the release) arrives in exactly the
// instant the waiter's timer fires; both select cases are ready and
// either may win; or the timer's attempt runs first in that instant and
// the notification follows it. The waiter is made to attempt at known instants: every
// attempt reports 100ms left, so each wait is 100ms + 1ms. Quiet and not
// quiet; 25 runs each, to cover both orders.
func TestNotificationAtTimerInstant(t *testing.T) {
	for _, quiet := range []bool{false, true} {
		t.Run(fmt.Sprintf("quiet=%v", quiet), func(t *testing.T) {
			var worst time.Duration
			var orders [3]int // attempts from the instant to the grant: 1 or 2
			for i := range 25 {
				synctest.Test(t, func(t *testing.T) {
					store := memory.NewStore()
					h := holdRaw(t, store, "k", time.Hour)
					hub := newWakeHub()
					lab := &wakeLab{Backend: store.Backend(), hub: hub,
						held: func(_ int64, h *driver.HeldError) { h.Holder.Remaining = 100 * time.Millisecond }}
					o := &fencelock.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: time.Minute}
					got := acquireAsync(t.Context(), newClient(t, lab, o), "k", false)
					time.Sleep(3 * time.Second) // backoff > 200ms: every wait is 101ms
					synctest.Wait()
					if quiet {
						notifyAndWaitAttempt(hub, lab)
					}
					time.Sleep(time.Until(lab.lastAttempt().Add(101 * time.Millisecond)))
					n := lab.attempts.Load()
					if i%2 == 1 {
						// The waiter's timer attempt runs first in this
						// instant (and finds the holder); otherwise the
						// release and its notification come first, and
						// the waiter's select finds both cases ready.
						synctest.Wait()
					}
					worst = max(worst, releaseNotified(t, store, h, hub, got, 2*o.MinBackoff, "notification at the timer's instant"))
					orders[min(lab.attempts.Load()-n, 2)]++
				})
			}
			t.Logf("worst: %v; runs where the grant came at the first attempt from the instant: %d, at the second (the timer's attempt ran before the release): %d", worst, orders[1], orders[2])
		})
	}
}

// Scenario: a self-notifying waiter whose attempts find the key held, the
// holder reported alternating between identities (migrate.Dual: an
// attempt may find another waiter's transient grant on the old side; a
// store answering sometimes with an anonymous HeldError, as PostgreSQL
// and ZooKeeper do in races). Nobody releases the key. Property (2): no
// spin (at most 200 attempts in 2s). AABB: d51ec7d, which reset the
// pause whenever an attempt found another holder, made 1,071 attempts;
// the code before it 21. ABAB and named-anonymous were never "the same
// holder" twice in a row: both spun (10,000 attempts in no fake time)
// until a wake-up counted as news only when it found a holder the call
// had not seen before.
func TestAlternatingHoldersDoNotSpin(t *testing.T) {
	for _, c := range []struct {
		name string
		who  func(n int64) string
	}{
		{"ABAB", func(n int64) string { return []string{"a", "b"}[n%2] }},
		{"AABB", func(n int64) string { return []string{"a", "b"}[(n/2)%2] }},
		{"named-anonymous", func(n int64) string { return []string{"a", ""}[n%2] }},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				holdRaw(t, store, "k", time.Hour)
				hub := newWakeHub()
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				defer cancel()
				lab := &wakeLab{Backend: store.Backend(), hub: hub, selfNotify: true, spin: cancel,
					held: func(n int64, h *driver.HeldError) {
						h.Holder.Owner = c.who(n)
						if h.Holder.Owner == "" {
							h.Holder = driver.Info{Key: h.Holder.Key}
						}
					}}
				start := time.Now()
				r := <-acquireAsync(ctx, newClient(t, lab, nil), "k", false)
				if r.err == nil {
					t.Fatal("took a key nobody released")
				}
				t.Logf("%d attempts in %v of fake time", lab.attempts.Load(), time.Since(start))
				if a := lab.attempts.Load(); a > 200 {
					t.Errorf("%s: %d attempts in 2s on a key nobody released: the waiter spins", c.name, a)
				}
			})
		})
	}
}

// dualSim is a migrate.Dual-like composite backend over two memory stores
// (old, new), whose calls each take a round trip (rtt, fake time): an
// Acquire takes the old side, then tries the new side and, finding it
// held, gives the old side back, which notifies every waiter of the key
// (the old side's watch fires). While one waiter holds the old side for
// that round trip, another's attempt finds it held by that waiter: a
// different holder than the key's real one.
// Not a fakebackend: it simulates migrate.Dual's two-sided round trips in fake time.
type dualSim struct {
	driver.Backend // the new side: Inspect, List, Close
	old, new       *memory.Backend
	hub            *wakeHub
	rtt            time.Duration
	spin           func()
	attempts       atomic.Int64
}

func (d *dualSim) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	if d.attempts.Add(1) == 10_000 {
		d.spin()
	}
	time.Sleep(d.rtt)
	o, err := d.old.Acquire(ctx, r)
	if err != nil {
		return driver.Grant{}, err
	}
	time.Sleep(d.rtt)
	g, err := d.new.Acquire(ctx, r)
	if err != nil {
		time.Sleep(d.rtt)
		if d.old.Release(context.Background(), o) == nil {
			d.hub.notify()
		}
		return driver.Grant{}, err
	}
	return g, nil
}

func (d *dualSim) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	return d.hub.watch(ctx), nil
}

// Scenario: several waiters on a migrate.Dual-like backend, the key held
// on the new side only (a client already moved to the new backend),
// store round trips of 1ms. Every attempt takes and gives back the old
// side (a notification to all), and attempts that overlap find each
// other's transient old-side grant (a different holder). Property (2):
// no waiter hammers the store (at most 200 attempts in 2s, the existing
// spin test's bound), with the default backoff.
func TestDualLikeWaitersDoNotHammer(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("waiters=%d", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				oldS, newS := memory.NewStore(), memory.NewStore()
				holdRaw(t, newS, "k", time.Hour)
				hub := newWakeHub()
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				defer cancel()
				sims := make([]*dualSim, n)
				gots := make([]<-chan acquired, n)
				for i := range n {
					sims[i] = &dualSim{Backend: newS.Backend(), old: oldS.Backend(), new: newS.Backend(), hub: hub, rtt: time.Millisecond, spin: cancel}
					gots[i] = acquireAsync(ctx, newClient(t, sims[i], nil), "k", false)
				}
				for i := range n {
					if r := <-gots[i]; r.err == nil {
						t.Fatal("a waiter took a key held on the new side")
					}
				}
				for i, d := range sims {
					a := d.attempts.Load()
					t.Logf("waiter %d of %d: %d attempts in 2s", i, n, a)
					if a > 200 {
						t.Errorf("waiter %d of %d made %d attempts in 2s on a key nobody released", i, n, a)
					}
				}
			})
		})
	}
}
