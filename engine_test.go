package fencelock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Timing tests run in a testing/synctest bubble: time is fake and advances
// only when every goroutine is blocked, so the engine's schedule can be
// asserted exactly, without sleeps or tolerances.

func newClient(t *testing.T, b driver.Backend, o *fencelock.Options) *fencelock.Client {
	t.Helper()
	c, err := fencelock.New(b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// hidden returns b showing none of its optional capabilities: waits
// poll, renewals go one at a time.
func hidden(b driver.Backend) driver.Backend { return fakebackend.New(b, fakebackend.Plain).Backend() }

func TestLocalValidityEndsLeaseWhenBackendUnreachable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := store.Backend()
		var (
			mu                   sync.Mutex
			dangerAt, dangerLeft time.Duration
		)
		start := time.Now()
		c := newClient(t, b, &fencelock.Options{TTL: 3 * time.Second, OnDanger: func(l *fencelock.Lease, left time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			dangerAt, dangerLeft = time.Since(start), left
		}})
		l, err := c.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		b.SetUnreachable(true) // every renewal now fails transiently
		<-l.Done()
		// TTL 3s − Margin 300ms: the holder stops believing at 2.7s.
		if got := time.Since(start); got != 2700*time.Millisecond {
			t.Errorf("lease lost after %v; want exactly TTL−Margin = 2.7s", got)
		}
		if err := l.Err(); !errors.Is(err, fencelock.ErrLeaseLost) || !errors.Is(err, fencelock.ErrLocalExpiry) {
			t.Errorf("Err() = %v; want ErrLeaseLost caused by ErrLocalExpiry", err)
		}
		if !errors.Is(context.Cause(l.Context()), fencelock.ErrLeaseLost) {
			t.Errorf("Context cause = %v", context.Cause(l.Context()))
		}
		// Danger zone: less than one RenewInterval (1s) of validity left.
		mu.Lock()
		defer mu.Unlock()
		if dangerAt != 1700*time.Millisecond || dangerLeft != time.Second {
			t.Errorf("OnDanger at %v with %v left; want at 1.7s with 1s left", dangerAt, dangerLeft)
		}
		// The store still has the record until 3s: nobody else can take the
		// key before the holder has stopped believing it holds it.
		other := newClient(t, store.Backend(), &fencelock.Options{TTL: 3 * time.Second})
		l2, err := other.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got < 3*time.Second {
			t.Errorf("another client acquired at %v, before the record's TTL", got)
		}
		if l2.Token() <= l.Token() {
			t.Errorf("takeover token %d not above %d", l2.Token(), l.Token())
		}
	})
}

func TestDefiniteLossEndsLeaseAtNextRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		c := newClient(t, hidden(store.Backend()), &fencelock.Options{TTL: 3 * time.Second})
		start := time.Now()
		l, err := c.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		store.Expire("k") // the record is gone; the holder is not told
		<-l.Done()
		if got := time.Since(start); got != time.Second {
			t.Errorf("loss noticed after %v; want at the first renewal, 1s", got)
		}
		if !errors.Is(l.Err(), fencelock.ErrNotHeld) {
			t.Errorf("Err() = %v; want cause ErrNotHeld", l.Err())
		}
	})
}

func TestPushedLossEndsLeaseAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		c := newClient(t, store.Backend(), &fencelock.Options{TTL: 3 * time.Second})
		l, err := c.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		at := time.Now()
		if _, err := store.Backend().ForceRelease(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		<-l.Done()
		if d := time.Since(at); d != 0 {
			t.Errorf("pushed loss took %v", d)
		}
	})
}

// renewLog records when renewals reach the store; with regress set, a
// renewal's answer carries a token one below the store's.
type renewLog struct {
	mu      sync.Mutex
	renews  []time.Duration
	regress atomic.Bool
}

// counting returns b, its optional capabilities hidden, logging its
// renewals in log (times since now).
func counting(b driver.Backend, log *renewLog) driver.Backend {
	start := time.Now()
	f := fakebackend.New(b, fakebackend.Plain)
	f.OnRenew(func(ctx context.Context, g driver.Grant, r driver.RenewRequest, next fakebackend.RenewFunc) (driver.Grant, error) {
		log.mu.Lock()
		log.renews = append(log.renews, time.Since(start))
		log.mu.Unlock()
		ng, err := next(ctx, g, r)
		if err == nil && log.regress.Load() {
			ng.Token--
		}
		return ng, err
	})
	return f.Backend()
}

func TestRenewalScheduleAndTransientRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		mb := store.Backend()
		var cb renewLog
		c := newClient(t, counting(mb, &cb), &fencelock.Options{TTL: 3 * time.Second, MinBackoff: 100 * time.Millisecond})
		l, err := c.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3500 * time.Millisecond)
		cb.mu.Lock()
		got := append([]time.Duration(nil), cb.renews...)
		cb.mu.Unlock()
		want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Fatalf("renewals at %v; want every RenewInterval: %v", got, want)
		}
		// An outage shorter than the remaining validity is ridden out.
		mb.SetUnreachable(true)
		time.Sleep(1500 * time.Millisecond) // renewal at 4s fails, retries back off
		mb.SetUnreachable(false)
		time.Sleep(time.Second)
		if err := l.Err(); err != nil {
			t.Fatalf("lease lost during a short outage: %v", err)
		}
		cb.mu.Lock()
		n := len(cb.renews)
		cb.mu.Unlock()
		if n < 6 {
			t.Errorf("only %d renewal attempts; failed renewals were not retried", n)
		}
		// Renewed within the last interval: more than TTL−Margin−interval.
		if l.Remaining() <= 1700*time.Millisecond {
			t.Errorf("Remaining() = %v after recovery; want a fresh validity", l.Remaining())
		}
	})
}

func TestTokenRegressionEndsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cb renewLog
		cb.regress.Store(true)
		c := newClient(t, counting(memory.New(), &cb), &fencelock.Options{TTL: 3 * time.Second})
		l, err := c.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		tok := l.Token()
		<-l.Done()
		if !errors.Is(l.Err(), fencelock.ErrTokenRegressed) {
			t.Fatalf("Err() = %v; want ErrTokenRegressed", l.Err())
		}
		if l.Token() != tok {
			t.Fatalf("lease token changed from %d to %d: a lower token was handed out", tok, l.Token())
		}
	})
}

func TestRotationAdvancesToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, memory.New(), &fencelock.Options{TTL: 4 * time.Second, RenewInterval: time.Second, RotateEvery: 2 * time.Second})
		l, err := c.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		var seen []fencelock.Token
		time.Sleep(500 * time.Millisecond) // sample between renewals
		for range 6 {
			seen = append(seen, l.Token())
			time.Sleep(time.Second)
		}
		// Renewals every 1s; a rotation whenever waiting for the next
		// renewal would stretch the gap past 2s: at 2s and 4s.
		want := []fencelock.Token{1, 1, 2, 2, 3, 3}
		for i := range want {
			if seen[i] != want[i] {
				t.Fatalf("tokens over time %v; want %v", seen, want)
			}
		}
	})
}

func TestBatchRenewalCostsAboutTwoRoundTripsPerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := fakebackend.New(memory.New(), fakebackend.Memory)
		c := newClient(t, b.Backend(), &fencelock.Options{TTL: 3 * time.Second})
		var leases []*fencelock.Lease
		for i := range 100 {
			l, err := c.Acquire(t.Context(), "k"+string(rune('A'+i%26))+string(rune('a'+i/26)))
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, l)
			time.Sleep(10 * time.Millisecond) // spread acquisitions over a whole second
		}
		before := b.Calls(fakebackend.RenewBatch)
		time.Sleep(10 * time.Second) // ten renewal intervals
		if n := b.Calls(fakebackend.RenewBatch) - before; n > 20 {
			t.Errorf("%d batch renewals in 10 intervals for 100 leases; want at most 2 per interval", n)
		}
		for _, l := range leases {
			if l.Err() != nil {
				t.Fatalf("lease lost: %v", l.Err())
			}
		}
	})
}

func TestPollingWaitEndsWhenHolderExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		start := time.Now()
		if _, err := store.Backend().Acquire(t.Context(), driver.AcquireRequest{Key: "k", Owner: "dead", TTL: 2 * time.Second}); err != nil {
			t.Fatal(err)
		}
		c := newClient(t, hidden(store.Backend()), &fencelock.Options{TTL: time.Second, MinBackoff: 10 * time.Second, MaxBackoff: 10 * time.Second})
		if _, err := c.Acquire(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		// Backoff is 5-10s, but the wait is cut to the holder's remaining TTL.
		if got := time.Since(start); got < 2*time.Second || got > 2*time.Second+2*time.Millisecond {
			t.Errorf("waiter acquired after %v; want just after the holder's 2s TTL", got)
		}
	})
}

func TestWatcherWakesWaiterOnRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		h := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Minute})
		w := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Minute, MinBackoff: 30 * time.Second, MaxBackoff: 30 * time.Second})
		l, err := h.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			if _, err := w.Acquire(t.Context(), "k"); err != nil {
				t.Error(err)
			}
			got <- time.Now()
		}()
		time.Sleep(5 * time.Second)
		released := time.Now()
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if at := <-got; at != released {
			t.Errorf("waiter acquired %v after release; want at once (notified, not polling)", at.Sub(released))
		}
	})
}

var errReplyLost = errors.New("connection reset after request was sent")

// loseReply makes f perform the next op but lose its reply.
func loseReply(f *fakebackend.Fake, op fakebackend.Op) {
	f.SetLate(op, fakebackend.FailOnce(errReplyLost))
}

func TestAmbiguousTryAcquireLeavesNothing(t *testing.T) {
	store := memory.NewStore()
	lb := fakebackend.New(store.Backend(), fakebackend.Plain)
	loseReply(lb, fakebackend.Acquire)
	c := newClient(t, lb.Backend(), nil)
	_, err := c.TryAcquire(t.Context(), "k")
	var be *fencelock.BackendError
	if !errors.As(err, &be) || !errors.Is(err, errReplyLost) || be.Op != "acquire" {
		t.Fatalf("TryAcquire = %v; want a *BackendError wrapping the lost reply", err)
	}
	info, err := c.Inspect(t.Context(), "k")
	if err != nil || info.Locked() {
		t.Fatalf("after an ambiguous TryAcquire Inspect = %+v, %v; want free", info, err)
	}
}

func TestAmbiguousAcquireRetriedAsSameOwner(t *testing.T) {
	store := memory.NewStore()
	lb := fakebackend.New(store.Backend(), fakebackend.Plain)
	loseReply(lb, fakebackend.Acquire)
	c := newClient(t, lb.Backend(), nil)
	l, err := c.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != 1 {
		t.Errorf("token %d; the retry should have found its own record (token 1)", l.Token())
	}
}

func TestReleaseRetryAfterAmbiguousFailure(t *testing.T) {
	store := memory.NewStore()
	lb := fakebackend.New(store.Backend(), fakebackend.Plain)
	c := newClient(t, lb.Backend(), nil)
	l, err := c.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	loseReply(lb, fakebackend.Release)
	if err := l.Release(t.Context()); !errors.Is(err, errReplyLost) {
		t.Fatalf("first Release = %v; want the transport error", err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("lease still live after Release was attempted")
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatalf("retried Release = %v; want nil (the record is gone)", err)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatalf("third Release = %v; want nil: retries after a failure are idempotent", err)
	}
}

func TestDoCancelsCallbackWhenLeaseLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		c := newClient(t, store.Backend(), &fencelock.Options{TTL: 3 * time.Second})
		go func() {
			time.Sleep(time.Second)
			store.Backend().ForceRelease(context.Background(), "leader")
		}()
		ran := false
		err := c.Do(t.Context(), "leader", func(ctx context.Context, l *fencelock.Lease) error {
			ran = true
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), fencelock.ErrLeaseLost) {
				t.Errorf("callback context cause = %v", context.Cause(ctx))
			}
			return nil
		})
		if !ran || !errors.Is(err, fencelock.ErrLeaseLost) {
			t.Fatalf("Do = %v (ran %v); want ErrLeaseLost", err, ran)
		}
	})
}

func TestDoReleasesWhenCallbackReturns(t *testing.T) {
	c := newClient(t, memory.New(), nil)
	want := errors.New("job failed")
	err := c.Do(t.Context(), "job", func(ctx context.Context, l *fencelock.Lease) error { return want })
	if !errors.Is(err, want) || errors.Is(err, fencelock.ErrLeaseLost) {
		t.Fatalf("Do = %v; want the callback's error only", err)
	}
	if h := c.Holding(); len(h) != 0 {
		t.Fatalf("Holding() = %v after Do", h)
	}
}

type skewed struct{ d time.Duration }

func (s skewed) Now() time.Time { return time.Now().Add(s.d) }

func TestSkewedClientClockChangesNothing(t *testing.T) {
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		synctest.Test(t, func(t *testing.T) {
			b := memory.New()
			c := newClient(t, b, &fencelock.Options{TTL: 3 * time.Second, Clock: skewed{skew}})
			start := time.Now()
			l, err := c.Acquire(t.Context(), "k")
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(9500 * time.Millisecond) // between renewals at 9s and 10s
			if l.Err() != nil {
				t.Fatalf("skew %v: lease lost while the backend was reachable: %v", skew, l.Err())
			}
			b.SetUnreachable(true)
			<-l.Done()
			if got := time.Since(start); got != 11700*time.Millisecond {
				t.Errorf("skew %v: lost at %v; want 9s + TTL − Margin = 11.7s", skew, got)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		o      fencelock.Options
		option string
	}{
		{fencelock.Options{TTL: time.Millisecond}, "TTL"},
		{fencelock.Options{TTL: 25 * time.Hour}, "TTL"},
		{fencelock.Options{TTL: 10 * time.Second, RenewInterval: 6 * time.Second}, "RenewInterval"},
		{fencelock.Options{TTL: 10 * time.Second, RenewInterval: -time.Second}, "RenewInterval"},
		{fencelock.Options{TTL: 10 * time.Second, Margin: 7 * time.Second}, "Margin"},
		{fencelock.Options{TTL: 10 * time.Second, RotateEvery: time.Second}, "RotateEvery"},
		{fencelock.Options{TTL: 10 * time.Second, RotateEvery: 6 * time.Second}, "RotateEvery"},
		{fencelock.Options{MinBackoff: time.Second, MaxBackoff: time.Millisecond}, "MaxBackoff"},
		{fencelock.Options{Owner: "bad\x00owner"}, "Owner"},
	} {
		err := tc.o.Validate()
		var oe *fencelock.InvalidOptionError
		if !errors.As(err, &oe) || oe.Option != tc.option || !errors.Is(err, fencelock.ErrInvalidOption) {
			t.Errorf("Validate(%+v) = %v; want an *InvalidOptionError for %s", tc.o, err, tc.option)
		}
	}
	var nilOpts *fencelock.Options
	if err := nilOpts.Validate(); err != nil {
		t.Errorf("nil Options: %v", err)
	}
	if err := (&fencelock.Options{TTL: 10 * time.Second, RenewInterval: 5 * time.Second, RotateEvery: 5 * time.Second}).Validate(); err != nil {
		t.Errorf("boundary TTL = 2×interval = 2×rotation rejected: %v", err)
	}
}

func TestClosedClient(t *testing.T) {
	c, err := fencelock.New(memory.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if !errors.Is(context.Cause(l.Context()), fencelock.ErrReleased) || l.Err() != nil {
		t.Errorf("lease after Close: cause %v, Err %v", context.Cause(l.Context()), l.Err())
	}
	if _, err := c.Acquire(t.Context(), "k"); !errors.Is(err, fencelock.ErrClosed) {
		t.Errorf("Acquire after Close = %v; want ErrClosed", err)
	}
	goleak.VerifyNone(t)
}

func TestCloseEndsWaitingAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		h := newClient(t, store.Backend(), nil)
		if _, err := h.Acquire(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		w, err := fencelock.New(store.Backend(), nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := w.Acquire(t.Context(), "k")
			done <- err
		}()
		time.Sleep(time.Second)
		w.Close()
		if err := <-done; !errors.Is(err, fencelock.ErrClosed) {
			t.Fatalf("waiting Acquire after Close = %v; want ErrClosed", err)
		}
	})
}

// TestSchedulerStaysArmedAcrossAcquireReleaseLoop: a loop of acquire and
// release forgets each lease before the scheduler wakes for it; the
// scheduler then stays armed, so the next leases (due no earlier) are
// scheduled without waking it again. Each wake costs the caller a futex
// call and the other core a goroutine switch (1 goroutine on Redis: 0.88×
// raw before, 0.90× after, bench/redis ScriptCost). A lease due earlier
// than the armed time (a shorter TTL) still wakes it and is renewed on
// time, and a client left idle disarms.
func TestSchedulerStaysArmedAcrossAcquireReleaseLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		c := newClient(t, store.Backend(), &fencelock.Options{TTL: 30 * time.Second}) // renews every 10s
		for i := range 20 {
			l, err := c.TryAcquire(t.Context(), "k")
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait() // the scheduler has handled any wake and waits
			if got := fencelock.SchedulerPokes(c); got != 1 {
				t.Fatalf("after %d acquire+release cycles the scheduler was woken %d times; want once", i+1, got)
			}
			time.Sleep(100 * time.Millisecond)
		}

		// Due before the armed time: wakes the scheduler and is renewed
		// on time (validity would end at 2.7s without a renewal).
		short, err := c.TryAcquire(t.Context(), "short", fencelock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := fencelock.SchedulerPokes(c); got != 2 {
			t.Fatalf("a lease due before the armed time woke the scheduler %d times in all; want 2", got)
		}
		time.Sleep(5 * time.Second)
		select {
		case <-short.Done():
			t.Fatalf("the 3s lease ended after 5s (%v): its renewals waited for the armed time", short.Err())
		default:
		}
		if err := short.Release(t.Context()); err != nil {
			t.Fatal(err)
		}

		// Idle past the armed time: the timer fires on an empty queue and
		// disarms; the next lease wakes the scheduler once more.
		time.Sleep(30 * time.Second)
		synctest.Wait()
		before := fencelock.SchedulerPokes(c)
		l, err := c.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := fencelock.SchedulerPokes(c) - before; got != 1 {
			t.Fatalf("after an idle minute the next lease woke the scheduler %d times; want 1", got)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}
