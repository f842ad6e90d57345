package fencelock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []fencelock.Event
}

func (r *recorder) Observe(e fencelock.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) kinds(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.Key == key {
			out = append(out, e.Kind.String())
		}
	}
	return out
}

func (r *recorder) find(kind fencelock.EventKind) fencelock.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Kind == kind {
			return e
		}
	}
	return fencelock.Event{}
}

func wantKinds(t *testing.T, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("events %v; want %v", got, want)
	}
}

func TestEventsAcquireRenewRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		c := newClient(t, memory.New(), &fencelock.Options{TTL: 3 * time.Second, Observer: rec})
		l, err := c.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond)
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		wantKinds(t, rec.kinds("k"), "acquired", "renewed", "renewed", "released")
		if e := rec.find(fencelock.EventReleased); e.Held != 2500*time.Millisecond || e.Backend != "memory" || e.Token != 1 {
			t.Errorf("released event %+v; want held 2.5s on memory, token 1", e)
		}
		if e := rec.find(fencelock.EventAcquired); e.Contended || e.Owner != l.Owner() {
			t.Errorf("acquired event %+v", e)
		}
	})
}

func TestEventsContendedAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		rec := &recorder{}
		h := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Minute})
		w := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Minute, Observer: rec})
		l, _ := h.Acquire(t.Context(), "k")
		if _, err := w.TryAcquire(t.Context(), "k"); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(4 * time.Second)
			l.Release(t.Context())
		}()
		if _, err := w.Acquire(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		wantKinds(t, rec.kinds("k"), "not_acquired", "waiting", "acquired")
		var held *fencelock.HeldError
		if e := rec.find(fencelock.EventWaiting); !errors.As(e.Err, &held) || held.Holder.Owner != l.Owner() {
			t.Errorf("waiting event %+v; want the *HeldError naming the holder %q", e, l.Owner())
		}
		if e := rec.find(fencelock.EventAcquired); !e.Contended || e.Wait != 4*time.Second {
			t.Errorf("acquired event %+v; want contended with a 4s wait", e)
		}
	})
}

func TestEventsLossByExpiryAndTheft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := store.Backend()
		rec := &recorder{}
		c := newClient(t, hidden(b), &fencelock.Options{TTL: 3 * time.Second, Observer: rec})
		// Expiry: the store is unreachable, local validity runs out.
		l, _ := c.Acquire(t.Context(), "expiry")
		b.SetUnreachable(true)
		<-l.Done()
		synctest.Wait() // the best-effort release of the lost lease has run, and failed
		b.SetUnreachable(false)
		got := rec.kinds("expiry")
		// renew_failed repeats while retries back off; compress the run.
		var squeezed []string
		for _, k := range got {
			if len(squeezed) == 0 || squeezed[len(squeezed)-1] != k {
				squeezed = append(squeezed, k)
			}
		}
		wantKinds(t, squeezed, "acquired", "renew_failed", "danger_zone", "renew_failed", "lost", "cleanup_failed")
		if e := rec.find(fencelock.EventLost); !errors.Is(e.Err, fencelock.ErrLocalExpiry) || e.Held != 2700*time.Millisecond {
			t.Errorf("lost event %+v; want local expiry after 2.7s", e)
		}
		// Theft: the record is taken; the next renewal is refused.
		l2, _ := c.Acquire(t.Context(), "theft")
		store.Expire("theft")
		<-l2.Done()
		wantKinds(t, rec.kinds("theft"), "acquired", "renew_failed", "lost")
	})
}

func TestEventsRotationAndFence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		c := newClient(t, memory.New(), &fencelock.Options{TTL: 4 * time.Second, RenewInterval: time.Second, RotateEvery: 2 * time.Second, Observer: rec})
		l, _ := c.Acquire(t.Context(), "k")
		time.Sleep(2500 * time.Millisecond)
		if e := rec.find(fencelock.EventRotated); e.Previous != 1 || e.Token != 2 {
			t.Errorf("rotation event %+v; want 1 → 2", e)
		}
		f := fencelock.Fence{Observer: rec}
		f.Check("res", 5, "x")
		f.Check("res", l.Token(), l.Owner())
		if e := rec.find(fencelock.EventFenceRejected); e.Key != "res" || e.Token != 2 || e.Previous != 5 {
			t.Errorf("fence event %+v", e)
		}
	})
}

func TestEventsAreLoggedAtTheirLevels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		lg := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		b := memory.New()
		c, err := fencelock.New(b, &fencelock.Options{TTL: 3 * time.Second, Logger: lg})
		if err != nil {
			t.Fatal(err)
		}
		l, _ := c.Acquire(t.Context(), "k")
		b.SetUnreachable(true)
		<-l.Done()
		c.Close() // every goroutine that logs has ended
		out := buf.String()
		for _, want := range []string{
			`level=DEBUG msg="fencelock: acquired" backend=memory key=k`,
			`level=WARN msg="fencelock: renew_failed"`,
			`level=WARN msg="fencelock: danger_zone"`,
			`level=ERROR msg="fencelock: lost"`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("log lacks %q:\n%s", want, out)
			}
		}
	})
}

// BenchmarkAcquireReleaseObserved is BenchmarkAcquireRelease with a no-op
// observer: the cost of observability when nobody looks.
func BenchmarkAcquireReleaseObserved(b *testing.B) {
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: time.Minute, Observer: fencelock.ObserverFunc(func(fencelock.Event) {})})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		l.Release(ctx)
	}
}

// slowRelease returns a memory backend whose Release takes 5ms (of the
// bubble's time); with gone set it answers that the record was already
// gone.
func slowRelease(gone bool) driver.Backend {
	f := fakebackend.New(memory.New(), fakebackend.Memory)
	f.OnRelease(func(ctx context.Context, g driver.Grant, next fakebackend.ReleaseFunc) error {
		time.Sleep(5 * time.Millisecond)
		err := next(ctx, g)
		if gone {
			return fencelock.ErrNotHeld
		}
		return err
	})
	return f.Backend()
}

// TestReleaseEventIsTimedForWhoeverListens: the engine reads the clock for
// a release's event only when the event reaches someone, so each listener
// (an Observer; a Logger alone at Debug; a Logger alone at Warn, for a
// release that found the record gone) gets the event with its Held and
// Latency.
func TestReleaseEventIsTimedForWhoeverListens(t *testing.T) {
	run := func(t *testing.T, gone bool, o fencelock.Options) error {
		var err error
		synctest.Test(t, func(t *testing.T) {
			o.TTL = time.Minute
			c, nerr := fencelock.New(slowRelease(gone), &o)
			if nerr != nil {
				t.Fatal(nerr)
			}
			defer c.Close()
			l, aerr := c.TryAcquire(t.Context(), "k")
			if aerr != nil {
				t.Fatal(aerr)
			}
			time.Sleep(time.Second)
			err = l.Release(t.Context())
		})
		return err
	}
	t.Run("observer", func(t *testing.T) {
		var rec recorder
		if err := run(t, false, fencelock.Options{Observer: &rec}); err != nil {
			t.Fatal(err)
		}
		var got []fencelock.Event
		for _, e := range rec.events {
			if e.Kind == fencelock.EventReleased {
				got = append(got, e)
			}
		}
		if len(got) != 1 || got[0].Held != time.Second+5*time.Millisecond || got[0].Latency != 5*time.Millisecond {
			t.Fatalf("released events %+v, want one with Held 1.005s and Latency 5ms", got)
		}
	})
	for _, tc := range []struct {
		name  string
		level slog.Level
		gone  bool
		want  string
	}{
		{"logger at debug", slog.LevelDebug, false, `level=DEBUG msg="fencelock: released" backend=memory key=k`},
		{"logger at warn, record gone", slog.LevelWarn, true, `level=WARN msg="fencelock: released" backend=memory key=k`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			lg := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
			err := run(t, tc.gone, fencelock.Options{Logger: lg})
			if tc.gone != errors.Is(err, fencelock.ErrNotHeld) {
				t.Fatalf("Release: %v", err)
			}
			out := buf.String()
			for _, want := range []string{tc.want, "latency=5ms", "held=1.005s"} {
				if !strings.Contains(out, want) {
					t.Errorf("log lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
