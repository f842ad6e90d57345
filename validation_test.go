package fencelock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// badKeys break driver.ValidateKey's rules: empty, a control character,
// invalid UTF-8, one byte too long.
var badKeys = []string{"", "bad\x00key", "bad\xffkey", strings.Repeat("k", driver.MaxKeyLen+1)}

// events records the kinds of the events a client emits.
type events struct {
	mu    sync.Mutex
	kinds []fencelock.EventKind
}

func (e *events) Observe(ev fencelock.Event) {
	e.mu.Lock()
	e.kinds = append(e.kinds, ev.Kind)
	e.mu.Unlock()
}

func (e *events) count(k fencelock.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, x := range e.kinds {
		if x == k {
			n++
		}
	}
	return n
}

// TestBadKeyIsDefiniteAndStoresNothing: the backend owns validation (see
// "Validation" in driver/driver.go); the Client does not check keys
// itself, so a bad key must still come back from every Client entry point
// as an error matching ErrInvalidKey, from one backend call (never
// retried, also while the store is unreachable), with nothing stored.
func TestBadKeyIsDefiniteAndStoresNothing(t *testing.T) {
	for _, unreachable := range []bool{false, true} {
		store := memory.NewStore()
		mb := store.Backend()
		mb.SetUnreachable(unreachable)
		// Plain but for ForceRelease, so that a waiting Acquire polls.
		b := fakebackend.New(mb, fakebackend.ForceReleaser)
		ev := &events{}
		c := newClient(t, b.Backend(), &fencelock.Options{Observer: ev})
		for _, k := range badKeys {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			before := b.Calls(fakebackend.Acquire)
			if _, err := c.TryAcquire(ctx, k); !errors.Is(err, fencelock.ErrInvalidKey) {
				t.Errorf("unreachable=%v: TryAcquire(%q) = %v; want ErrInvalidKey", unreachable, k, err)
			}
			if _, err := c.Acquire(ctx, k); !errors.Is(err, fencelock.ErrInvalidKey) {
				t.Errorf("unreachable=%v: Acquire(%q) = %v; want ErrInvalidKey", unreachable, k, err)
			}
			ran := false
			if err := c.Do(ctx, k, func(context.Context, *fencelock.Lease) error { ran = true; return nil }); !errors.Is(err, fencelock.ErrInvalidKey) || ran {
				t.Errorf("unreachable=%v: Do(%q) = %v, callback ran %v; want ErrInvalidKey, not run", unreachable, k, err, ran)
			}
			if n := b.Calls(fakebackend.Acquire) - before; n != 3 {
				t.Errorf("unreachable=%v: TryAcquire, Acquire and Do of %q made %d backend Acquire calls; want 3 (one each, never retried)", unreachable, k, n)
			}
			if _, err := c.Inspect(ctx, k); !errors.Is(err, fencelock.ErrInvalidKey) {
				t.Errorf("unreachable=%v: Inspect(%q) = %v; want ErrInvalidKey", unreachable, k, err)
			}
			if _, err := c.ForceRelease(ctx, k); !errors.Is(err, fencelock.ErrInvalidKey) {
				t.Errorf("unreachable=%v: ForceRelease(%q) = %v; want ErrInvalidKey", unreachable, k, err)
			}
			if k != "" { // "" is a valid prefix: every key
				if _, err := c.List(ctx, k); !errors.Is(err, fencelock.ErrInvalidKey) {
					t.Errorf("unreachable=%v: List(%q) = %v; want ErrInvalidKey", unreachable, k, err)
				}
			}
			cancel()
		}
		if n := ev.count(fencelock.EventAcquireRetry); n != 0 {
			t.Errorf("unreachable=%v: %d acquire retries for bad keys; want none", unreachable, n)
		}
		if n := ev.count(fencelock.EventCleanupFailed); n != 0 {
			t.Errorf("unreachable=%v: %d clean-up failures for bad keys; want none (nothing to clean up)", unreachable, n)
		}
		infos, err := store.Backend().List(context.Background(), "")
		if err != nil || len(infos) != 0 {
			t.Errorf("unreachable=%v: store holds %v (err %v) after bad keys; want nothing", unreachable, infos, err)
		}
		if hw, err := store.Backend().HighWater(context.Background(), ""); err != nil || len(hw.Keys) != 0 || hw.Global != 0 {
			t.Errorf("unreachable=%v: store issued tokens (high water %+v, err %v) for bad keys; want none", unreachable, hw, err)
		}
	}
}

// TestBadKeyCleanupEndsAtInvalidKey: after an acquire of a bad key failed
// transiently, the engine's clean-up looks the key up; the backend's
// ErrInvalidKey is an answer (it cannot have stored anything under that
// key), not a clean-up failure to retry in the background.
func TestBadKeyCleanupEndsAtInvalidKey(t *testing.T) {
	// Acquire fails transiently before the store looks at the request (a
	// backend that checks its connection before validating).
	b := fakebackend.New(memory.New(), fakebackend.ForceReleaser)
	b.Set(fakebackend.Acquire, fakebackend.Fail(errReplyLost))
	ev := &events{}
	c := newClient(t, b.Backend(), &fencelock.Options{Observer: ev})
	if _, err := c.TryAcquire(context.Background(), "bad\x00key"); err == nil {
		t.Fatal("TryAcquire succeeded through a failing backend")
	}
	if n := b.Calls(fakebackend.Inspect); n != 1 {
		t.Errorf("clean-up looked the key up %d times; want 1", n)
	}
	if n := ev.count(fencelock.EventCleanupFailed); n != 0 {
		t.Errorf("%d clean-up failures reported for a key the backend refuses; want none", n)
	}
}
