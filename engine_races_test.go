package fencelock_test

// An adversarial review of 5a29699 (an acquire attempt cut short waits for
// the store's answer) and 3e37232 (a hold renewal waits for the renewal in
// flight, up to the validity). Tests that failed on the code under review
// are marked "Defect" in their comment; the commit after them fixed both.

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
)

// closeWatched programs f's Close to close closed, and counts in late
// the Releases and Inspects that begin after it.
func closeWatched(f *fakebackend.Fake) (closed chan struct{}, late *atomic.Int32) {
	closed, late = make(chan struct{}), new(atomic.Int32)
	var once sync.Once
	f.OnClose(func(next func() error) error {
		once.Do(func() { close(closed) })
		return next()
	})
	f.OnRelease(func(ctx context.Context, g driver.Grant, next fakebackend.ReleaseFunc) error {
		if isClosed(closed) {
			late.Add(1)
		}
		return next(ctx, g)
	})
	f.OnInspect(func(ctx context.Context, key string, next fakebackend.InspectFunc) (driver.Info, error) {
		if isClosed(closed) {
			late.Add(1)
		}
		return next(ctx, key)
	})
	return closed, late
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// revStoreEmpty fails the test if the store holds any record.
func revStoreEmpty(t *testing.T, store *memory.Store) {
	t.Helper()
	infos, err := store.Backend().List(context.Background(), "")
	if err != nil || len(infos) != 0 {
		t.Fatalf("List = %+v, %v; want an empty store", infos, err)
	}
}

// Defect (3e37232): a holder releases its lease into the minimum hold
// while a regular renewal is in flight, and Client.Close follows. The
// holder's Release now waits for that renewal's answer (up to the lease's
// validity) while holding the lease's release semaphore; Close's release
// of the same (pending) lease waits for that semaphore only
// Options.ReleaseTimeout and gives up with context.DeadlineExceeded, which
// Close returns although nothing failed. Close then goes on: it waits for
// the renewal goroutine, and closes the backend the moment the renewal
// has its answer; the holder, woken by the same answer, sends its hold
// renewal to a backend Close is closing (nothing tracks the holder's
// Release). The renewal in flight has cut the record's life to the
// lease's TTL, keepUntil is never started (the client has stopped), so
// the key is free long before the minimum hold ends.
//
// Interleaving (TTL 15s, MinHold 30s, ReleaseTimeout 5s): 5s the renewal
// is sent (it reaches the store at 12s); 6s Release waits for it; 6s
// Close blocks on the release semaphore; 11s Close's release times out
// (Close's error); Close stops the scheduler and waits for the renewal;
// 12s the renewal lands (the record now expires at 27s) and answers;
// Close closes the backend while the holder's hold renewal is on its
// way: the hold renewal fails with ErrClosed; at 27s the key is free, 3s
// before the minimum hold ends. Before 3e37232 the holder's Release sent
// its hold renewal at once and left keepUntil to renew again after the
// renewal's answer, which Close waited for: all three checks passed. Now
// the wait also ends when Close begins, and keepUntil renews again.
func TestCloseDuringHoldWaitForRenewalInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		store := memory.NewStore()
		const ttl = 15 * time.Second
		sent, land := make(chan struct{}), make(chan struct{})
		var first atomic.Bool
		f := fakebackend.New(store.Backend(), fakebackend.Plain)
		closedCh, late := closeWatched(f)
		f.OnRenew(func(rctx context.Context, g driver.Grant, r driver.RenewRequest, next fakebackend.RenewFunc) (driver.Grant, error) {
			if r.TTL == ttl && first.CompareAndSwap(false, true) {
				close(sent)
				<-land // on the wire until the test lets it reach the store
				return next(context.WithoutCancel(rctx), g, r)
			}
			if r.TTL != ttl {
				// A hold renewal: a short trip to the store, during
				// which a Close that does not wait for it closes the
				// backend under it.
				select {
				case <-closedCh:
					late.Add(1)
				case <-time.After(100 * time.Millisecond):
				}
			}
			return next(rctx, g, r)
		})
		c, err := fencelock.New(f.Backend(), &fencelock.Options{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		l, err := c.Acquire(ctx, "k", fencelock.WithMinHold(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		<-sent // 5s: the first renewal is in flight
		time.Sleep(time.Second)
		released := make(chan error, 1)
		go func() { released <- l.Release(ctx) }()
		synctest.Wait() // Release waits for the renewal's answer
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		synctest.Wait()
		time.Sleep(6 * time.Second) // 12s
		close(land)
		if err := <-closed; err != nil {
			t.Errorf("Close = %v; want nil (nothing failed)", err)
		}
		rerr := <-released
		t.Logf("Release = %v", rerr)
		synctest.Wait()
		if n := late.Load(); n > 0 {
			t.Errorf("%d backend request(s) sent after Close closed the backend (the holder's hold renewal)", n)
		}
		other := newClient(t, store.Backend(), nil)
		for time.Since(start) < 29500*time.Millisecond {
			if ol, err := other.TryAcquire(ctx, "k"); !errors.Is(err, fencelock.ErrNotAcquired) {
				t.Errorf("at %v of a 30s minimum hold, another client's TryAcquire = %v; want ErrNotAcquired", time.Since(start), err)
				if ol != nil {
					_ = ol.Release(ctx)
				}
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
}

// Defect (5a29699 claims a lease is never handed out to a caller whose
// context ended before the grant came back; acquireQueued does not keep
// it): on a queueing store, the grant of AcquireWait is confirmed by a
// Renew on the call's bound context, and the Renew's answer is used as is.
// When the caller's context ends while that confirmation is in flight and
// its (successful) answer comes back after, Acquire returns a held lease
// and nil to a caller that had given up; attempt() checked ctx after the
// store's answer, acquireQueued did not. Now the confirmation runs on the
// call's attempt context and is checked the same way.
func TestQueuedConfirmationAnsweredAfterCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		other, err := store.Backend().Acquire(t.Context(), driver.AcquireRequest{Key: "k", Owner: "other", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		// A Waiter whose AcquireWait polls the store until the key is
		// free (a queue that moves when the holder leaves).
		f := fakebackend.New(store.Backend(), fakebackend.Waiter)
		f.SetPoll(10 * time.Millisecond)
		var confirms atomic.Int32
		f.OnRenew(func(rctx context.Context, g driver.Grant, r driver.RenewRequest, next fakebackend.RenewFunc) (driver.Grant, error) {
			if confirms.Add(1) == 1 {
				// The confirmation reaches the store; the caller
				// gives up before its answer is back.
				ng, err := next(rctx, g, r)
				cancel()
				return ng, err
			}
			return next(rctx, g, r)
		})
		c := newClient(t, f.Backend(), nil)
		got := acquireAsync(ctx, c, "k", false)
		synctest.Wait() // queued behind "other"
		if err := store.Backend().Release(t.Context(), other); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.l != nil || !errors.Is(r.err, context.Canceled) {
			t.Errorf("Acquire whose ctx ended while the confirmation was in flight = (lease %v), %v; want no lease and context.Canceled", r.l != nil, r.err)
			if r.l != nil {
				_ = r.l.Release(t.Context())
			}
			return
		}
		synctest.Wait()
		mustFree(t, store, "k")
	})
}

// A caller whose context ends as the grant comes back (the store granted,
// the caller cancelled before the answer arrived) never gets the lease,
// and the grant is released: TryAcquire, Acquire's first attempt, a
// polling attempt (and one woken by the memory store's notifications),
// and a WithWait bound that passes while the attempt is in flight.
func TestGrantRacingTheCallersEndIsReleased(t *testing.T) {
	for _, tc := range []struct {
		name   string
		try    bool
		n      int  // the attempt that races
		watch  bool // the memory store's notifications wake the waiter
		bound  bool // a WithWait bound, not the caller's cancel, ends the call
		wantIs error
	}{
		{name: "TryAcquire", try: true, n: 1, wantIs: context.Canceled},
		{name: "Acquire/first", n: 1, wantIs: context.Canceled},
		{name: "Acquire/polling", n: 2, wantIs: context.Canceled},
		{name: "Acquire/watching", n: 2, watch: true, wantIs: context.Canceled},
		{name: "Acquire/first/WithWait", n: 1, bound: true, wantIs: fencelock.ErrNotAcquired},
		{name: "Acquire/polling/WithWait", n: 2, bound: true, wantIs: fencelock.ErrNotAcquired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				var other driver.Grant
				if tc.n > 1 {
					var err error
					other, err = store.Backend().Acquire(t.Context(), driver.AcquireRequest{Key: "k", Owner: "other", TTL: time.Hour})
					if err != nil {
						t.Fatal(err)
					}
				}
				caps := fakebackend.Plain
				if tc.watch {
					caps = fakebackend.Watcher
				}
				f := fakebackend.New(store.Backend(), caps)
				var calls atomic.Int32
				f.OnAcquire(func(actx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
					k := calls.Add(1)
					if k == 1 && tc.n > 1 {
						// The first attempt finds "other", which
						// leaves as the answer comes back.
						g, err := next(actx, r)
						if rerr := store.Backend().Release(context.Background(), other); rerr != nil {
							t.Errorf("releasing other: %v", rerr)
						}
						return g, err
					}
					if int(k) != tc.n {
						return next(actx, r)
					}
					g, err := next(context.WithoutCancel(actx), r)
					if tc.bound {
						// The bound passes while the answer is on its way.
						time.Sleep(5 * time.Second)
					} else {
						cancel()
					}
					return g, err
				})
				c := newClient(t, f.Backend(), nil)
				var opts []fencelock.AcquireOption
				if tc.bound {
					opts = append(opts, fencelock.WithWait(3*time.Second))
				}
				var l *fencelock.Lease
				var err error
				if tc.try {
					l, err = c.TryAcquire(ctx, "k", opts...)
				} else {
					l, err = c.Acquire(ctx, "k", opts...)
				}
				if l != nil || !errors.Is(err, tc.wantIs) {
					t.Fatalf("= (lease %v), %v; want no lease and %v", l != nil, err, tc.wantIs)
				}
				if tc.bound && errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("err %v matches DeadlineExceeded; the caller's ctx did not end", err)
				}
				if int(calls.Load()) != tc.n {
					t.Fatalf("%d attempts; the test wanted attempt %d to race", calls.Load(), tc.n)
				}
				synctest.Wait()
				mustFree(t, store, "k")
			})
		})
	}
}

// Close begins while an attempt is in flight; the store's grant comes back
// during the grace period (before ReleaseTimeout): the call returns
// ErrClosed, the grant is released, the backend is closed only after the
// attempt and its clean-up returned, and Close returns nil within the
// grace period.
func TestCloseDuringGraceReleasesTheGrant(t *testing.T) {
	for _, tc := range []struct {
		name string
		try  bool
		n    int
	}{
		{name: "TryAcquire", try: true, n: 1},
		{name: "Acquire/first", n: 1},
		{name: "Acquire/polling", n: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				gate, sent := make(chan struct{}), make(chan struct{})
				f := fakebackend.New(store.Backend(), fakebackend.Plain)
				closedCh, late := closeWatched(f)
				var calls atomic.Int32
				var answeredAfterClose atomic.Bool
				f.OnAcquire(func(actx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
					if int(calls.Add(1)) != tc.n {
						return next(actx, r)
					}
					close(sent)
					select {
					case <-gate:
					case <-actx.Done():
						t.Errorf("the attempt's context ended (%v) before the grace period did", context.Cause(actx))
					}
					g, err := next(context.WithoutCancel(actx), r)
					answeredAfterClose.Store(isClosed(closedCh))
					return g, err
				})
				var other driver.Grant
				if tc.n > 1 {
					var err error
					other, err = store.Backend().Acquire(t.Context(), driver.AcquireRequest{Key: "k", Owner: "other", TTL: time.Hour})
					if err != nil {
						t.Fatal(err)
					}
				}
				c, err := fencelock.New(f.Backend(), &fencelock.Options{ReleaseTimeout: 2 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				got := acquireAsync(t.Context(), c, "k", tc.try)
				if tc.n > 1 {
					synctest.Wait()
					if err := store.Backend().Release(t.Context(), other); err != nil {
						t.Fatal(err)
					}
				}
				<-sent
				start := time.Now()
				closed := make(chan error, 1)
				go func() { closed <- c.Close() }()
				time.Sleep(time.Second) // within the 2s grace
				synctest.Wait()
				select {
				case err := <-closed:
					t.Fatalf("Close returned (%v) while an attempt was in flight", err)
				default:
				}
				if isClosed(closedCh) {
					t.Fatal("the backend was closed while an attempt was in flight")
				}
				close(gate)
				r := <-got
				if r.l != nil || !errors.Is(r.err, fencelock.ErrClosed) {
					t.Errorf("= (lease %v), %v; want no lease and ErrClosed", r.l != nil, r.err)
				}
				if err := <-closed; err != nil {
					t.Errorf("Close = %v", err)
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("Close took %v; want at most the 2s grace", d)
				}
				if answeredAfterClose.Load() {
					t.Error("the attempt was answered after the backend was closed")
				}
				if n := late.Load(); n > 0 {
					t.Errorf("%d clean-up request(s) after the backend was closed", n)
				}
				mustFree(t, store, "k")
			})
		})
	}
}

// revClock calls hit (once, armed) on the first Now after arm: the
// moment between an attempt's answer and newLease's clock reading.
type revClock struct {
	armed atomic.Bool
	hit   func()
}

func (c *revClock) Now() time.Time {
	if c.armed.CompareAndSwap(true, false) {
		c.hit()
	}
	return time.Now()
}

// Close begins after attempt() saw the caller's context alive, before
// newLease registers the lease: newLease sees the closed client, releases
// the grant, and the call returns ErrClosed with nothing left.
func TestCloseBetweenAnswerAndNewLease(t *testing.T) {
	for _, try := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			store := memory.NewStore()
			f := fakebackend.New(store.Backend(), fakebackend.Plain)
			clk := &revClock{}
			var c *fencelock.Client
			closed := make(chan error, 1)
			clk.hit = func() {
				go func() { closed <- c.Close() }()
				synctest.Wait() // Close waits for this call
			}
			f.OnAcquire(func(actx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
				g, err := next(actx, r)
				clk.armed.Store(true)
				return g, err
			})
			var err error
			c, err = fencelock.New(f.Backend(), &fencelock.Options{Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			synctest.Wait() // the scheduler is parked: the armed reading is the call's
			var l *fencelock.Lease
			if try {
				l, err = c.TryAcquire(t.Context(), "k")
			} else {
				l, err = c.Acquire(t.Context(), "k")
			}
			if l != nil || !errors.Is(err, fencelock.ErrClosed) {
				t.Errorf("try %v: = (lease %v), %v; want no lease and ErrClosed", try, l != nil, err)
			}
			if err := <-closed; err != nil {
				t.Errorf("try %v: Close = %v", try, err)
			}
			mustFree(t, store, "k")
		})
	}
}

// Close releases a held lease during its minimum hold while a renewal is
// in flight (single and batched): Close's own hold renewal waits for the
// renewal's answer (bounded by ReleaseTimeout), Close returns nil, and the
// record stays until the hold ends, then goes.
func TestCloseIntoHoldDuringRenewal(t *testing.T) {
	for _, batch := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			ctx := t.Context()
			store := memory.NewStore()
			f, inFlight, reply := slowRotation(store.Backend())
			b := f.As(fakebackend.Plain) // renewals one at a time
			if batch {
				b = f.Backend()
			}
			c, err := fencelock.New(b, &fencelock.Options{TTL: 3 * time.Second, RotateEvery: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			l, err := c.Acquire(ctx, "k", fencelock.WithMinHold(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			<-inFlight
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			synctest.Wait()
			close(reply)
			if err := <-closed; err != nil {
				t.Errorf("batch %v: Close = %v", batch, err)
			}
			if err := l.Release(ctx); !errors.Is(err, fencelock.ErrClosed) {
				t.Errorf("batch %v: Release after Close = %v; want ErrClosed", batch, err)
			}
			time.Sleep(9*time.Second - time.Since(start))
			if info, _ := store.Backend().Inspect(ctx, "k"); info.Owner != l.Owner() {
				t.Errorf("batch %v: 9s into a 10s minimum hold, Inspect = %+v; want the lease's record", batch, info)
			}
			time.Sleep(10*time.Second + 100*time.Millisecond - time.Since(start))
			mustFree(t, store, "k")
		})
	}
}

// A release into the minimum hold whose caller's context ends while it
// waits for a renewal in flight: the hold renewal goes on with a budget
// of its own, Release answers nil, and the record stays for the window.
func TestHoldWaitCutByCallersContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		f, inFlight, reply := slowRotation(store.Backend())
		c := newClient(t, f.As(fakebackend.Plain), &fencelock.Options{TTL: 3 * time.Second, RotateEvery: time.Second})
		start := time.Now()
		l, err := c.Acquire(t.Context(), "k", fencelock.WithMinHold(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		<-inFlight
		rctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- l.Release(rctx) }()
		time.Sleep(time.Second)
		synctest.Wait()
		close(reply)
		if err := <-done; err != nil {
			t.Fatalf("Release whose ctx ended during the wait = %v; want nil", err)
		}
		time.Sleep(9*time.Second - time.Since(start))
		if info, _ := store.Backend().Inspect(t.Context(), "k"); info.Owner != l.Owner() {
			t.Errorf("9s into a 10s minimum hold, Inspect = %+v; want the lease's record", info)
		}
		time.Sleep(10*time.Second + 100*time.Millisecond - time.Since(start))
		mustFree(t, store, "k")
	})
}
