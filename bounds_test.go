package fencelock_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// The call-bound contract (docs/design.md, "Bounds"), checked in
// testing/synctest bubbles against a memory store whose requests a test
// programs to hang, fail or answer late. The bounds are liveness
// properties; each assertion allows a generous slack, and a call that
// has not returned by its bound plus the slack fails the test (after
// the store's hanging requests are let go and the client is closed).

const boundSlack = fakebackend.BoundSlack

// refused is the error of a store with nothing listening on its port.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// silent makes a request hang until its context ends, as a store that
// stopped answering (SIGSTOPped, or behind a proxy that stopped
// forwarding) does.
func silent(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// refusing makes a request fail at once, as a store that refuses
// connections does.
func refusing(context.Context) error { return refused }

// slow makes a request answer after d (or fail when its context ends
// first).
func slow(d time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// newFaulty returns the bound tests' fake store: a fakebackend.Fake over
// store's memory backend whose Backend shows no optional capability
// (waits poll, every 50ms as a queue's AcquireWait). Its faults are the
// Fake's (Set, SetAll, SetLate; LetGo ends their waits, so that a test
// whose call hung can end); queued is the same store with a queue.
func newFaulty(store *memory.Store) *fakebackend.Fake {
	f := fakebackend.New(store.Backend(), fakebackend.Plain)
	f.SetPoll(50 * time.Millisecond)
	return f
}

// queued is f with a queue (a driver.Waiter, as etcd and ZooKeeper are):
// AcquireWait runs the "wait" fault, then takes the key as soon as it is
// free, until its context ends.
func queued(f *fakebackend.Fake) driver.Backend { return f.As(fakebackend.Waiter) }

// boundOpts are the options of the bound tests: a TTL long enough that
// one TTL, two overrun budgets and the slack are told apart.
func boundOpts() *fencelock.Options {
	return &fencelock.Options{TTL: 15 * time.Second, ReleaseTimeout: 2 * time.Second}
}

// within is fakebackend.Within for a client under test.
func within(t *testing.T, b *fakebackend.Fake, c *fencelock.Client, bound time.Duration, what string, call func()) time.Duration {
	t.Helper()
	return fakebackend.Within(t, b, c, bound, what, call)
}

// heldBy returns the owner of key in store ("" if free).
func heldBy(t *testing.T, store *memory.Store, key string) string {
	t.Helper()
	info, err := store.Backend().Inspect(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return info.Owner
}

func TestTryAcquireWithoutDeadlineReturnsWithinTTLFromSilentStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), boundOpts())
		// The store applies the request, and its reply never comes:
		// the attempt's outcome is unknown, and its record is ours.
		b.SetLate(fakebackend.Acquire, silent)
		var err error
		within(t, b, c, 15*time.Second+2*time.Second, "TryAcquire(Background) on a silent store", func() {
			_, err = c.TryAcquire(context.Background(), "k")
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("TryAcquire = %v; want an error matching DeadlineExceeded (no answer within the TTL)", err)
		}
		var be *fencelock.BackendError
		if !errors.As(err, &be) || !strings.Contains(err.Error(), "no answer") {
			t.Errorf("TryAcquire = %v; want a *BackendError saying the store did not answer", err)
		}
		// The clean-up ran within the call's budget: nothing is left.
		if owner := heldBy(t, store, "k"); owner != "" {
			t.Errorf("TryAcquire left a record of %q behind", owner)
		}
		// A store that hangs on every request: the same bound.
		b.SetLate(fakebackend.Acquire, nil)
		b.SetAll(silent)
		within(t, b, c, 15*time.Second+2*time.Second, "TryAcquire(Background) on a store that hangs on every request", func() {
			_, err = c.TryAcquire(context.Background(), "k")
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("TryAcquire = %v; want an error matching DeadlineExceeded", err)
		}
		// Close waits for the clean-up that goes on in the background,
		// itself bounded by ReleaseTimeout.
		within(t, b, c, 2*time.Second, "Close", func() { c.Close() })
	})
}

func TestAcquireWithDeadlineReturnsWithinOneOverrunBudget(t *testing.T) {
	for name, wrap := range map[string]func(*fakebackend.Fake) driver.Backend{
		"polling": func(f *fakebackend.Fake) driver.Backend { return f.Backend() },
		"queue":   queued,
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				b := newFaulty(store)
				c := newClient(t, wrap(b), boundOpts())
				// Every request hangs: the attempt in flight at the
				// deadline gets the overrun budget (2s), and the
				// clean-up after it shares that budget instead of
				// taking another.
				b.SetAll(silent)
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				var err error
				took := within(t, b, c, 3*time.Second+2*time.Second, "Acquire(3s deadline) on a silent store", func() {
					_, err = c.Acquire(ctx, "k")
				})
				if took > 5*time.Second+boundSlack {
					t.Errorf("Acquire returned after %v; want by the deadline plus ReleaseTimeout (5s)", took)
				}
				if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer") {
					t.Errorf("Acquire = %v; want DeadlineExceeded joined with the store's cause (no answer)", err)
				}
				within(t, b, c, 2*time.Second, "Close", func() { c.Close() })
			})
		})
	}
}

func TestCleanupAfterOverrunGoesOnInBackgroundAndCloseWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c, err := fencelock.New(b.Backend(), boundOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The store applies the acquire but its reply never comes, and
		// looking the key up takes a second: the overrun budget ends
		// before the clean-up does.
		b.SetLate(fakebackend.Acquire, silent)
		b.Set(fakebackend.Inspect, slow(time.Second))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var tryErr error
		took := within(t, b, c, time.Second+2*time.Second, "TryAcquire(1s deadline)", func() {
			_, tryErr = c.TryAcquire(ctx, "k")
		})
		if took > 3*time.Second+boundSlack {
			t.Errorf("TryAcquire returned after %v; want by the deadline plus ReleaseTimeout (3s)", took)
		}
		if !errors.Is(tryErr, context.DeadlineExceeded) || !strings.Contains(tryErr.Error(), "no answer") {
			t.Errorf("TryAcquire = %v; want DeadlineExceeded joined with the store's cause", tryErr)
		}
		within(t, b, c, 2*time.Second, "Close", func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close = %v", err)
			}
		})
		// Close waited for the clean-up: the record is gone.
		if owner := heldBy(t, store, "k"); owner != "" {
			t.Errorf("the record of %q is still there after Close", owner)
		}
	})
}

func TestTryAcquireReleasesGrantAnsweredAfterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), boundOpts())
		// The answer comes 1.5s after the 1s deadline: within the
		// overrun budget, so TryAcquire waits for it and releases the
		// grant.
		b.SetLate(fakebackend.Acquire, slow(2500*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var err error
		within(t, b, c, 3*time.Second, "TryAcquire(1s deadline)", func() {
			_, err = c.TryAcquire(ctx, "k")
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("TryAcquire = %v; want DeadlineExceeded", err)
		}
		if owner := heldBy(t, store, "k"); owner != "" {
			t.Errorf("the grant of %q answered after the deadline was not released", owner)
		}
	})
}

func TestAcquireWithoutDeadlineReturnsStoreCauseAfterTTLOfFailures(t *testing.T) {
	for name, wrap := range map[string]func(*fakebackend.Fake) driver.Backend{
		"polling": func(f *fakebackend.Fake) driver.Backend { return f.Backend() },
		"queue":   queued,
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				b := newFaulty(store)
				c := newClient(t, wrap(b), boundOpts())
				b.SetAll(refusing)
				var err error
				took := within(t, b, c, 15*time.Second+2*time.Second, "Acquire(Background) on a store that refuses connections", func() {
					_, err = c.Acquire(context.Background(), "k")
				})
				if took < 15*time.Second {
					t.Errorf("Acquire gave up after %v; want after one TTL (15s) of failures", took)
				}
				if !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "connection refused") {
					t.Errorf("Acquire = %v; want the store's cause (connection refused)", err)
				}
				var be *fencelock.BackendError
				if !errors.As(err, &be) {
					t.Errorf("Acquire = %v; want a *BackendError", err)
				}

				// A silent store: each request is cut at its bound.
				b.SetAll(silent)
				took = within(t, b, c, 2*15*time.Second+2*time.Second, "Acquire(Background) on a silent store", func() {
					_, err = c.Acquire(context.Background(), "k")
				})
				if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer") {
					t.Errorf("Acquire = %v; want the store's cause (no answer)", err)
				}
			})
		})
	}
}

func TestAcquireWithoutDeadlineOutlastsShortFailuresAndLongHolds(t *testing.T) {
	for name, wrap := range map[string]func(*fakebackend.Fake) driver.Backend{
		"polling": func(f *fakebackend.Fake) driver.Backend { return f.Backend() },
		"queue":   queued,
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				b := newFaulty(store)
				c := newClient(t, wrap(b), boundOpts())
				// Failures shorter than the TTL: Acquire goes on.
				b.SetAll(refusing)
				time.AfterFunc(10*time.Second, func() { b.SetAll(nil) })
				l, err := c.Acquire(context.Background(), "k")
				if err != nil {
					t.Fatalf("Acquire through 10s of refusals (TTL 15s) = %v; want the lease", err)
				}
				// A key held for three TTLs while the store answers is
				// a normal wait: Acquire does not give up.
				time.AfterFunc(45*time.Second, func() { l.Release(context.Background()) })
				start := time.Now()
				l2, err := c.Acquire(context.Background(), "k")
				if err != nil {
					t.Fatalf("Acquire of a key held 45s (TTL 15s) = %v; want the lease", err)
				}
				if got := time.Since(start); got < 45*time.Second {
					t.Errorf("Acquire took the key after %v; it was held for 45s", got)
				}
				l2.Release(context.Background())
			})
		})
	}
}

func TestAcquireWithDeadlineJoinsContextErrorWithStoreCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), boundOpts())
		b.SetAll(refusing)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var err error
		// With a deadline there is no failure window: Acquire tries
		// until the deadline, beyond the TTL.
		took := within(t, b, c, time.Minute+2*time.Second, "Acquire(1m deadline) on a refusing store", func() {
			_, err = c.Acquire(ctx, "k")
		})
		if took < time.Minute {
			t.Errorf("Acquire with a 1m deadline gave up after %v", took)
		}
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("Acquire = %v; want DeadlineExceeded joined with connection refused", err)
		}
	})
}

func TestReleaseAndInspectWithoutDeadlineAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), boundOpts())
		l, err := c.Acquire(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		b.SetAll(silent)
		within(t, b, c, 2*time.Second, "Release(Background) on a silent store", func() {
			err = l.Release(context.Background())
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Release = %v; want DeadlineExceeded", err)
		}
		within(t, b, c, 15*time.Second, "Inspect(Background) on a silent store", func() {
			_, err = c.Inspect(context.Background(), "k")
		})
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer") {
			t.Errorf("Inspect = %v; want DeadlineExceeded saying the store did not answer", err)
		}
		within(t, b, c, 15*time.Second, "List(Background) on a silent store", func() {
			_, err = c.List(context.Background(), "")
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("List = %v; want DeadlineExceeded", err)
		}
		b.SetAll(nil)
	})
}

// endingClock is the system clock (the bubble's, under synctest) that,
// once armed at some instant, ends the caller's context the first time
// the engine reads a later time: right after a wait between attempts,
// before the next attempt is sent.
type endingClock struct {
	mu      sync.Mutex
	armedAt time.Time
	end     context.CancelFunc
}

func (k *endingClock) Now() time.Time {
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.end != nil && !k.armedAt.IsZero() && now.After(k.armedAt) {
		k.end()
		k.end = nil
	}
	return now
}

func (k *endingClock) arm(end context.CancelFunc) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.armedAt, k.end = time.Now(), end
}

// An Acquire whose caller's context ends after its backoff, just before
// the next attempt is sent (so that attempt never reaches the store),
// still reports the refusal its earlier attempt met: the unsent attempt's
// bare context error must not replace the store's last failure.
func TestAcquireEndedBeforeNextAttemptKeepsStoreCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		clock := &endingClock{}
		o := boundOpts()
		o.Clock = clock
		c := newClient(t, b.Backend(), o)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var sent int
		b.Set(fakebackend.Acquire, func(context.Context) error {
			sent++
			clock.arm(cancel)
			return refused
		})
		var err error
		within(t, b, c, 2*time.Second, "Acquire on a refusing store whose caller gave up", func() {
			_, err = c.Acquire(ctx, "k")
		})
		if sent != 1 {
			t.Fatalf("%d acquire requests reached the store; want 1 (the caller's end came before the second)", sent)
		}
		if !errors.Is(err, context.Canceled) || !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("Acquire = %v; want context.Canceled joined with connection refused", err)
		}
	})
}

// TestAcquireBehindLiveHolderEndsWithoutBlamingTheStore: a wait in the
// store's queue that outlasts the call's TTL behind a live holder, while
// the store answers, ends at the caller's deadline with the context's
// error alone: the wait's bound passing is no store failure, so the
// error names none ("no answer from the store", "is the store
// reachable?"), polling or queued.
func TestAcquireBehindLiveHolderEndsWithoutBlamingTheStore(t *testing.T) {
	for name, wrap := range map[string]func(*fakebackend.Fake) driver.Backend{
		"polling": func(f *fakebackend.Fake) driver.Backend { return f.Backend() },
		"queue":   queued,
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				b := newFaulty(store)
				c := newClient(t, wrap(b), boundOpts())
				l, err := c.Acquire(context.Background(), "k")
				if err != nil {
					t.Fatal(err)
				}
				defer l.Release(context.Background())
				// Three of the call's TTLs (15s) behind the holder.
				ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
				defer cancel()
				_, err = c.Acquire(ctx, "k")
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Acquire behind a live holder until its deadline = %v; want DeadlineExceeded", err)
				}
				if msg := err.Error(); strings.Contains(msg, "no answer") || strings.Contains(msg, "reachable") {
					t.Errorf("Acquire behind a live holder, the store answering, = %q; want no store failure named", msg)
				}
			})
		})
	}
}

// TestAcquireQueuedOnFreeKeyEndsNamingTheSilentWait: a wait in the
// store's queue that outlasts the call's TTL while the key is free (the
// store answers an Inspect, and its queue never grants: a broken watch)
// is no wait behind a holder: an Acquire that reaches its deadline so
// names the wait's silence beside the context's error.
func TestAcquireQueuedOnFreeKeyEndsNamingTheSilentWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, queued(b), boundOpts())
		// The first attempt finds the key held (a holder that leaves
		// at once); the queue then never answers.
		b.OnAcquire(func(ctx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: r.Key}}
		})
		b.Set(fakebackend.AcquireWait, func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		})
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		defer cancel()
		_, err := c.Acquire(ctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire on a free key whose queue is silent = %v; want DeadlineExceeded", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "no answer") {
			t.Errorf("Acquire on a free key whose queue is silent = %q; want the wait's silence named", msg)
		}
	})
}

// TestAcquirePollingEndsWithoutAnEarlierFailureOnceAnswered: a polling
// Acquire whose first attempts fail (the store refuses them), and whose
// later ones find the key held, ends at its deadline with the context's
// error alone: the store answered since, so the stale failure is no
// cause to report.
func TestAcquirePollingEndsWithoutAnEarlierFailureOnceAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), boundOpts())
		l, err := c.Acquire(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
		var mu sync.Mutex
		refusals := 2
		b.Set(fakebackend.Acquire, func(ctx context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if refusals > 0 {
				refusals--
				return refused
			}
			return nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		defer cancel()
		_, err = c.Acquire(ctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire = %v; want DeadlineExceeded", err)
		}
		if errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "refused") {
			t.Errorf("Acquire refused twice, then behind a live holder until its deadline = %q; want no stale failure named", err)
		}
	})
}

// TestAcquireWithoutDeadlineOnFreeKeyWhoseQueueNeverGrantsIsBounded: a
// store that answers reads, but whose queue never grants a free key (a
// watch or session that stopped working), is failing: an Acquire
// without a deadline gives up once that has lasted the call's TTL (two
// waits' bounds at most), naming the silent wait, instead of queueing
// again forever.
func TestAcquireWithoutDeadlineOnFreeKeyWhoseQueueNeverGrantsIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, queued(b), boundOpts())
		b.OnAcquire(func(ctx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: r.Key}}
		})
		b.Set(fakebackend.AcquireWait, silent)
		var err error
		within(t, b, c, 2*15*time.Second+2*time.Second, "Acquire(Background) on a free key whose queue never grants", func() {
			_, err = c.Acquire(context.Background(), "k")
		})
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer") {
			t.Errorf("Acquire = %v; want the silent wait named (no answer)", err)
		}
		if owner := heldBy(t, store, "k"); owner != "" {
			t.Errorf("after the Acquire gave up, %q holds the key; want it free", owner)
		}
	})
}
