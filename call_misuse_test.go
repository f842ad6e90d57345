package fencelock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
)

// Misuses of the recipe seam by a third party's recipe: each must work or
// return a typed error, and leave the engine (Close's accounting of the
// calls in flight) intact.

// A Call ended twice counts once: Close still waits for another call in
// flight, and the second End neither panics nor ends that other call's
// registration.
func TestCallEndTwiceKeepsCloseWaitingForOtherCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := fencelock.New(memory.NewStore().Backend(), nil)
		if err != nil {
			t.Fatal(err)
		}
		other, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		k, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := k.End(nil); err != nil {
			t.Errorf("End = %v", err)
		}
		if err := k.End(nil); err != nil {
			t.Errorf("second End = %v; want nil (End is idempotent)", err)
		}
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		<-other.Context().Done()
		synctest.Wait()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while another call was in flight", err)
		default:
		}
		if err := other.End(other.Context().Err()); !errors.Is(err, fencelock.ErrClosed) {
			t.Errorf("End of the other call = %v; want ErrClosed", err)
		}
		if err := <-closed; err != nil {
			t.Errorf("Close = %v", err)
		}
	})
}

// Outcome, Request and Pause after End do not panic or hang: the call's
// context has ended, so Pause returns at once with an error.
func TestCallUseAfterEndReturnsWithoutHanging(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, memory.NewStore().Backend(), nil)
		k, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		k.End(nil)
		if err := k.Outcome(time.Now(), nil); err != nil {
			t.Errorf("Outcome(nil) after End = %v; want nil", err)
		}
		rctx, cancel := k.Request()
		defer cancel()
		if rctx.Err() == nil {
			t.Errorf("Request after End returned a live context")
		}
		if err := k.Pause(k.Context(), nil); err == nil {
			t.Errorf("Pause after End = nil; want the end of the call's context")
		}
	})
}

// Pause with a nil context waits on the call's Context instead of
// panicking.
func TestCallPauseNilContextUsesCallContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, memory.NewStore().Backend(), nil)
		k, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer k.End(nil)
		//lint:ignore SA1012 the misuse under test
		if err := k.Pause(nil, nil); err != nil { //nolint:staticcheck
			t.Errorf("Pause(nil) = %v; want nil after the backoff", err)
		}
	})
}

// Go after Close returns ErrClosed without running f.
func TestClientGoAfterCloseReturnsClosed(t *testing.T) {
	c, err := fencelock.New(memory.NewStore().Backend(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	if err := c.Go(func(context.Context) { ran.Store(true) }); !errors.Is(err, fencelock.ErrClosed) {
		t.Errorf("Go after Close = %v; want ErrClosed", err)
	}
	if ran.Load() {
		t.Errorf("Go ran f after Close")
	}
}

// OnEnd registered after the lease ended runs f once, at once, with the
// cause; registered before, f runs once when the lease ends.
func TestLeaseOnEndRunsOnceBeforeOrAfterEnd(t *testing.T) {
	c := newClient(t, memory.NewStore().Backend(), nil)
	ctx := context.Background()
	l, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var before atomic.Int32
	var beforeCause error
	l.OnEnd(func(cause error) { before.Add(1); beforeCause = cause })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l.Release(ctx)
	if n := before.Load(); n != 1 || !errors.Is(beforeCause, fencelock.ErrReleased) {
		t.Errorf("OnEnd before the end ran %d times with %v; want once with ErrReleased", n, beforeCause)
	}
	var after atomic.Int32
	var afterCause error
	l.OnEnd(func(cause error) { after.Add(1); afterCause = cause })
	if n := after.Load(); n != 1 || !errors.Is(afterCause, fencelock.ErrReleased) {
		t.Errorf("OnEnd after the end ran %d times with %v; want once with ErrReleased", n, afterCause)
	}
}

// ReleaseNow racing Release: the key is free at once after both return
// (ReleaseNow skips the minimum hold), and neither hangs nor panics.
func TestLeaseReleaseNowRacingReleaseFreesKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, memory.NewStore().Backend(), nil)
		ctx := context.Background()
		l, err := c.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		go func() { errs <- l.Release(ctx) }()
		go func() { errs <- l.ReleaseNow(ctx) }()
		for range 2 {
			if err := <-errs; err != nil && !errors.Is(err, fencelock.ErrNotHeld) {
				t.Errorf("release = %v", err)
			}
		}
		l2, err := c.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatalf("TryAcquire after both releases = %v", err)
		}
		l2.Release(ctx)
	})
}
