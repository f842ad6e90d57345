package fencelock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
)

func TestLockDelayOutOfRangeRefused(t *testing.T) {
	if _, err := fencelock.New(memory.New(), &fencelock.Options{LockDelay: -time.Second}); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Errorf("New with Options.LockDelay -1s = %v; want ErrInvalidOption", err)
	}
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, d := range []time.Duration{-time.Millisecond, fencelock.MaxTTL + 1} {
		if _, err := c.TryAcquire(t.Context(), "k", fencelock.WithLockDelay(d)); !errors.Is(err, fencelock.ErrInvalidOption) {
			t.Errorf("TryAcquire with WithLockDelay(%v) = %v; want ErrInvalidOption", d, err)
		}
	}
}

func TestLockDelayURLParameter(t *testing.T) {
	ctx := t.Context()
	b, o, err := fencelock.OpenBackend(ctx, "mem://lockdelay-url?lock_delay=2500ms")
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if o.LockDelay != 2500*time.Millisecond {
		t.Errorf("lock_delay=2500ms gave Options.LockDelay %v", o.LockDelay)
	}
	c, err := fencelock.Open(ctx, "mem://lockdelay-url?lock_delay=2s", &fencelock.Options{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Options().LockDelay; got != 2*time.Second {
		t.Errorf("Open with lock_delay=2s and Options without one: LockDelay %v, want the URL's 2s", got)
	}
	c.Close()
	for raw, want := range map[string]string{
		"mem://x?lock_delay=5":   "did you mean 5s",
		"mem://x?lock_delay=-1s": "between 0",
		"mem://x?lock_delay=25h": "between 0",
	} {
		if _, _, err := fencelock.OpenBackend(ctx, raw); !errors.Is(err, fencelock.ErrInvalidOption) || !strings.Contains(err.Error(), want) {
			t.Errorf("OpenBackend(%q) = %v; want ErrInvalidOption saying %q", raw, err, want)
		}
	}
}

// TestLockDelayWaitEndsWithDelay checks that a waiting Acquire wakes when
// the lock delay ends, though no release announces it, and that
// TryAcquire's refusal says how much of the delay is left.
func TestLockDelayWaitEndsWithDelay(t *testing.T) {
	store := memory.NewStore()
	opts := &fencelock.Options{TTL: time.Second, LockDelay: 2 * time.Second, MaxBackoff: 20 * time.Second, MinBackoff: 10 * time.Second}
	c, err := fencelock.New(store.Backend(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	store.Expire("k")
	<-l.Done()
	_, err = c.TryAcquire(ctx, "k")
	var held *fencelock.HeldError
	if !errors.As(err, &held) || held.LockDelay <= 0 || !strings.Contains(err.Error(), "lock delay") {
		t.Fatalf("TryAcquire in the lock delay = %v; want a *HeldError with the rest of the delay", err)
	}
	// The backoff (10s to 20s) would sleep past the bound: only the delay's
	// end wakes the waiter in time.
	l2, err := c.Acquire(ctx, "k", fencelock.WithWait(5*time.Second))
	if err != nil {
		t.Fatalf("Acquire through a 2s lock delay with a 10s backoff: %v; the wait did not wake when the delay ended", err)
	}
	l2.Release(ctx)
}
