package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// renewClock wraps a memory backend and checks, at every renewal it sees,
// that the renewal is not later than the engine's own schedule allows:
// after a success at s, the next renewal is due at s + the lease's
// interval (RenewInterval scaled to the TTL asked, then to the TTL
// granted); after a transient failure at f, the retry is due by
// f + interval/2 (the backoff's cap). Inside a synctest bubble the memory
// backend answers in no time, so any lateness at all is a scheduler bug.
// Not a fakebackend: it is a clock of the scheduler's deadlines, not a store fake.
type renewClock struct {
	b *memory.Backend

	ttl, ivl  time.Duration // the client's TTL and RenewInterval
	grantFrac float64       // 0: the TTL asked is granted; else this fraction of it
	failP     float64       // probability that a renewal fails transiently

	mu    sync.Mutex
	rnd   *rand.Rand
	due   map[string]time.Time // owner → the latest time its next renewal may start
	ivls  map[string]time.Duration
	renew int
	bad   []string
}

func newRenewClock(b *memory.Backend, ttl, ivl time.Duration, grantFrac, failP float64, seed uint64) *renewClock {
	return &renewClock{b: b, ttl: ttl, ivl: ivl, grantFrac: grantFrac, failP: failP,
		rnd: rand.New(rand.NewPCG(seed, 1)), due: map[string]time.Time{}, ivls: map[string]time.Duration{}}
}

func (r *renewClock) granted(asked time.Duration) time.Duration {
	if r.grantFrac == 0 {
		return asked
	}
	return time.Duration(float64(asked) * r.grantFrac)
}

// interval is the renewal interval the engine gives a lease whose TTL
// asked was asked and granted g.
func (r *renewClock) interval(g time.Duration) time.Duration {
	return time.Duration(float64(r.ivl) * float64(g) / float64(r.ttl))
}

// slack absorbs float rounding in the engine's scaling.
const slack = time.Microsecond

// check runs before a renewal of owner is sent; it reports whether the
// renewal is to fail (injected).
func (r *renewClock) check(owner string, now time.Time) (fail bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.renew++
	if d, ok := r.due[owner]; ok && now.After(d.Add(slack)) {
		r.bad = append(r.bad, fmt.Sprintf("renewal of %s at %v: %v after its due time", owner, now.Format("15:04:05.000000"), now.Sub(d)))
	}
	return r.failP > 0 && r.rnd.Float64() < r.failP
}

func (r *renewClock) after(owner string, now time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ivl, ok := r.ivls[owner]
	if !ok {
		return
	}
	switch {
	case err == nil:
		r.due[owner] = now.Add(ivl)
	case errors.Is(err, driver.ErrNotHeld):
		delete(r.due, owner)
	default:
		r.due[owner] = now.Add(ivl / 2)
	}
}

func (r *renewClock) forget(owner string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.due, owner)
	delete(r.ivls, owner)
}

func (r *renewClock) violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

func (r *renewClock) renewals() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.renew
}

// clockBackend is the plain form (no batch renewals).
// Not a fakebackend: it is renewClock's view as a backend, a scheduling probe.
type clockBackend struct{ r *renewClock }

func (c clockBackend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	now := time.Now()
	g, err := c.r.b.Acquire(ctx, req)
	if err != nil {
		return g, err
	}
	g.TTL = c.r.granted(req.TTL)
	c.r.mu.Lock()
	c.r.ivls[g.Owner] = c.r.interval(g.TTL)
	c.r.due[g.Owner] = now.Add(c.r.ivls[g.Owner])
	c.r.mu.Unlock()
	return g, nil
}

func (c clockBackend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	now := time.Now()
	if c.r.check(g.Owner, now) {
		c.r.after(g.Owner, now, memory.ErrUnreachable)
		return driver.Grant{}, memory.ErrUnreachable
	}
	ng, err := c.r.b.Renew(ctx, g, req)
	if err == nil {
		ng.TTL = c.r.granted(req.TTL)
	}
	c.r.after(g.Owner, now, err)
	return ng, err
}

func (c clockBackend) Release(ctx context.Context, g driver.Grant) error {
	c.r.forget(g.Owner)
	return c.r.b.Release(ctx, g)
}

func (c clockBackend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	return c.r.b.Inspect(ctx, key)
}

func (c clockBackend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	return c.r.b.List(ctx, prefix)
}

func (c clockBackend) Close() error { return c.r.b.Close() }

// clockBatch adds batch renewals (the scheduler then aligns batches on
// half a RenewInterval).
type clockBatch struct{ clockBackend }

func (c clockBatch) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	now := time.Now()
	out := make([]driver.RenewResult, len(grants))
	for i, g := range grants {
		if c.r.check(g.Owner, now) {
			out[i].Err = memory.ErrUnreachable
		} else {
			out[i].Grant, out[i].Err = c.r.b.Renew(ctx, g, req)
			if out[i].Err == nil {
				out[i].Grant.TTL = c.r.granted(req.TTL)
			}
		}
		c.r.after(g.Owner, now, out[i].Err)
	}
	return out, nil
}

// TestArmedSchedulerRenewsLeaseOnTime: the scheduler, woken by a
// lease that was released before it ran, stays armed for one
// RenewInterval; a lease acquired a little later is due a little after
// the armed time and schedules without waking it. Its renewals must still
// come exactly on time: the idle arm's timer fires at the armed time and
// re-arms for the lease. Catches a poked-arm timer set later than c.armed
// (say wait = 2 × RenewInterval, or no t.Reset at all in that case), which
// TestSchedulerStaysArmedAcrossAcquireReleaseLoop does not notice for
// leases held across the armed time.
func TestArmedSchedulerRenewsLeaseOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		for _, batch := range []bool{false, true} {
			rc := newRenewClock(store.Backend(), 30*time.Second, 10*time.Second, 0, 0, 1)
			var b driver.Backend = clockBackend{rc}
			if batch {
				b = clockBatch{clockBackend{rc}}
			}
			c := newClient(t, b, &fencelock.Options{TTL: 30 * time.Second})
			for range 5 {
				l, err := c.TryAcquire(t.Context(), "loop")
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				time.Sleep(100 * time.Millisecond)
			}
			// Armed until ~10s after the first poke; this lease is due at
			// 10.5s, after the armed time: no poke.
			l, err := c.TryAcquire(t.Context(), "held")
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(65 * time.Second)
			select {
			case <-l.Done():
				t.Fatalf("batch=%v: held lease lost: %v", batch, l.Err())
			default:
			}
			if n := rc.renewals(); n != 6 {
				t.Errorf("batch=%v: %d renewals in 65s of a 10s-interval lease; want 6", batch, n)
			}
			if err := l.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			for _, v := range rc.violations() {
				t.Errorf("batch=%v: %s", batch, v)
			}
			c.Close()
		}
	})
}

// TestSchedulerNeverLateUnderMixedLoad drives a client with
// acquire/release loops (which leave the scheduler armed on an empty
// queue), long holds, per-call TTLs shorter and longer than the client's,
// SetMetadata (renewSoon), transient renewal failures (retries with
// backoff), token rotation, grants shorter than asked (interval scaled
// down), with and without batch renewals, and checks that no renewal ever
// starts after its due time.
func TestSchedulerNeverLateUnderMixedLoad(t *testing.T) {
	type config struct {
		batch     bool
		rotate    bool
		grantFrac float64
		failP     float64
	}
	var configs []config
	for _, batch := range []bool{false, true} {
		for _, rotate := range []bool{false, true} {
			for _, frac := range []float64{0, 0.5} {
				for _, failP := range []float64{0, 0.2} {
					configs = append(configs, config{batch, rotate, frac, failP})
				}
			}
		}
	}
	for i, cf := range configs {
		t.Run(fmt.Sprintf("batch=%v,rotate=%v,grant=%v,fail=%v", cf.batch, cf.rotate, cf.grantFrac, cf.failP), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const ttl, ivl = 30 * time.Second, 10 * time.Second
				store := memory.NewStore()
				rc := newRenewClock(store.Backend(), ttl, ivl, cf.grantFrac, cf.failP, uint64(i)+7)
				var b driver.Backend = clockBackend{rc}
				if cf.batch {
					b = clockBatch{clockBackend{rc}}
				}
				o := &fencelock.Options{TTL: ttl, RenewInterval: ivl, MinBackoff: 50 * time.Millisecond}
				if cf.rotate {
					o.RotateEvery = 12 * time.Second
				}
				c := newClient(t, b, o)
				ttls := []time.Duration{0, 3 * time.Second, 4500 * time.Millisecond, 7 * time.Second, 30 * time.Second, 61 * time.Second}
				holds := []time.Duration{0, 0, 0, 50 * time.Millisecond, 900 * time.Millisecond, 3 * time.Second, 9 * time.Second, 10 * time.Second, 11 * time.Second, 25 * time.Second, 47 * time.Second}
				var wg sync.WaitGroup
				for w := range 6 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rnd := rand.New(rand.NewPCG(uint64(i), uint64(w)))
						end := time.Now().Add(4 * time.Minute)
						for n := 0; time.Now().Before(end); n++ {
							var opts []fencelock.AcquireOption
							if d := ttls[rnd.IntN(len(ttls))]; d != 0 {
								opts = append(opts, fencelock.WithTTL(d))
							}
							key := fmt.Sprintf("w%d-%d", w, n%3)
							l, err := c.TryAcquire(context.Background(), key, opts...)
							if err != nil {
								t.Errorf("worker %d: %v", w, err)
								return
							}
							hold := holds[rnd.IntN(len(holds))]
							if rnd.IntN(4) == 0 && hold > 0 {
								time.Sleep(hold / 2)
								ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
								at := time.Now()
								err := l.SetMetadata(ctx, []byte{byte(n)})
								cancel()
								if cf.failP == 0 {
									// renewSoon: the renewal that carries
									// it is sent at once.
									if err != nil {
										t.Errorf("worker %d: SetMetadata: %v", w, err)
									} else if d := time.Since(at); d != 0 {
										t.Errorf("worker %d: SetMetadata took %v; want its renewal at once", w, d)
									}
								}
								hold -= hold / 2
							}
							time.Sleep(hold)
							select {
							case <-l.Done():
								if cf.failP == 0 {
									t.Errorf("worker %d: lease on %s (ttl %v) lost: %v", w, key, l.TTL(), l.Err())
								}
							default:
							}
							_ = l.Release(context.Background())
							if rnd.IntN(3) == 0 {
								time.Sleep(time.Duration(rnd.IntN(4000)) * time.Millisecond)
							}
						}
					}()
				}
				wg.Wait()
				t.Logf("%d renewals", rc.renewals())
				if rc.renewals() == 0 {
					t.Fatal("no renewals at all")
				}
				for j, v := range rc.violations() {
					if j == 10 {
						t.Errorf("…")
						break
					}
					t.Error(v)
				}
			})
		})
	}
}

// TestCloseWhileSchedulerArmedOnEmptyQueue: Close with the scheduler armed on
// an empty queue (its timer set) stops it; goleak in TestMain checks it
// exits, and Close must not hang.
func TestCloseWhileSchedulerArmedOnEmptyQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.TryAcquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := fencelock.SchedulerPokes(c); got != 1 {
			t.Fatalf("pokes = %d; want 1", got)
		}
		time.Sleep(time.Second)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		// synctest.Test fails if any bubble goroutine (the scheduler, its
		// timer) is left blocked.
	})
}
