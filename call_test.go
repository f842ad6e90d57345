package fencelock_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
)

// The recipe seam (Client.Begin and Call), checked on its own: what a
// third party's recipe relies on. The recipes' own tests (package
// recipe) exercise it through semaphores, read-write locks and elections.

// A Call that Close ends sees its context end with ErrClosed as cause,
// End reports ErrClosed, and Close waits for End.
func TestCallEndedByCloseReportsClosedAndCloseWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := fencelock.New(memory.NewStore().Backend(), nil)
		if err != nil {
			t.Fatal(err)
		}
		k, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		<-k.Context().Done()
		if cause := context.Cause(k.Context()); !errors.Is(cause, fencelock.ErrClosed) {
			t.Errorf("cause of the call's context = %v; want ErrClosed", cause)
		}
		synctest.Wait()
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) before the call ended", err)
		default:
		}
		if err := k.End(k.Context().Err()); !errors.Is(err, fencelock.ErrClosed) {
			t.Errorf("End = %v; want ErrClosed", err)
		}
		if err := <-closed; err != nil {
			t.Errorf("Close = %v", err)
		}
		if _, err := c.Begin(context.Background()); !errors.Is(err, fencelock.ErrClosed) {
			t.Errorf("Begin after Close = %v; want ErrClosed", err)
		}
	})
}

// WithWait bounds a Call begun with Begin (End then reports an error
// matching ErrNotAcquired), and not one begun with BeginTry.
func TestCallWaitBoundEndsBeginNotBeginTry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, memory.NewStore().Backend(), nil)
		k, err := c.Begin(context.Background(), fencelock.WithWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if k.Wait() != time.Second {
			t.Errorf("Wait = %v; want 1s", k.Wait())
		}
		start := time.Now()
		var perr error
		for perr == nil {
			perr = k.Pause(k.Context(), nil)
		}
		if took := time.Since(start); took != time.Second {
			t.Errorf("pauses ended after %v; want the wait bound, 1s", took)
		}
		if err := k.End(perr); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Errorf("End = %v; want ErrNotAcquired", err)
		}
		try, err := c.BeginTry(context.Background(), fencelock.WithWait(time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // fake time: the bound would have passed
		if err := try.Context().Err(); err != nil {
			t.Errorf("BeginTry's context ended (%v); WithWait must not bound it", err)
		}
		if err := try.End(nil); err != nil {
			t.Errorf("End(nil) = %v; want nil", err)
		}
	})
}

// Begin checks the options as Acquire does.
func TestCallBeginRefusesBadOption(t *testing.T) {
	c := newClient(t, memory.NewStore().Backend(), nil)
	var ie *fencelock.InvalidOptionError
	if _, err := c.Begin(t.Context(), fencelock.WithTTL(time.Nanosecond)); !errors.As(err, &ie) {
		t.Errorf("Begin(WithTTL(1ns)) = %v; want an *InvalidOptionError", err)
	}
}

// Pause waits no longer than just after the soonest expiry a hint's
// *HeldError names, even when the backoff is longer.
func TestCallPauseEndsAtHolderExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, memory.NewStore().Backend(), &fencelock.Options{MinBackoff: 10 * time.Second, MaxBackoff: 10 * time.Second})
		k, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer k.End(nil)
		hint := errors.Join(errors.New("context"), &fencelock.HeldError{Holder: fencelock.Info{Key: "k", Owner: "o", Remaining: 200 * time.Millisecond}})
		start := time.Now()
		if err := k.Pause(k.Context(), hint); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 201*time.Millisecond || took < 200*time.Millisecond {
			t.Errorf("Pause took %v; want just after the holder's expiry, 200ms", took)
		}
	})
}

// Without a deadline, a Call gives up once the store has failed for its
// TTL without an answer, with a *BackendError wrapping the last failure;
// an answer in between starts the window again.
func TestCallOutcomeGivesUpAfterTTLOfFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, memory.NewStore().Backend(), &fencelock.Options{TTL: 3 * time.Second})
		k, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer k.End(nil)
		if err := k.Outcome(time.Now(), refused); err != nil {
			t.Fatalf("first failure: Outcome = %v; want nil (retry)", err)
		}
		if err := k.Outcome(time.Now(), nil); err != nil {
			t.Fatalf("an answer: Outcome = %v; want nil", err)
		}
		begun := time.Now()
		var err2 error
		for err2 == nil {
			if err2 = k.Outcome(time.Now(), refused); err2 == nil {
				err2 = k.Pause(k.Context(), refused) // the window may end in the pause
			}
		}
		var be *fencelock.BackendError
		if !errors.As(err2, &be) || !errors.Is(err2, refused) {
			t.Errorf("Outcome after the window = %v; want a *BackendError wrapping the store's failure", err2)
		}
		if took := time.Since(begun); took < 3*time.Second || took > 3*time.Second+time.Millisecond {
			t.Errorf("gave up %v after the run of failures began; want the TTL, 3s", took)
		}
		if err := k.Outcome(time.Now(), fencelock.ErrInvalidKey); !errors.Is(err, fencelock.ErrInvalidKey) {
			t.Errorf("Outcome(ErrInvalidKey) = %v; want it back: an answer that ends the call", err)
		}
	})
}

// A Pause that runs to the end of the store's failure window ends the
// call there, with a *BackendError wrapping the store's last failure: a
// request sent at the window's end would have no time left for an
// answer, and would end the call on the bound that cut it instead of on
// what the store said.
func TestCallPauseToTheFailureWindowEndEndsTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A backoff (jittered: at least half of it) longer than the window:
		// the first Pause is cut to it.
		c := newClient(t, memory.NewStore().Backend(), &fencelock.Options{TTL: 3 * time.Second, MinBackoff: 8 * time.Second, MaxBackoff: 8 * time.Second})
		k, err := c.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer k.End(nil)
		begun := time.Now()
		if err := k.Outcome(begun, refused); err != nil {
			t.Fatalf("first failure: Outcome = %v; want nil (retry)", err)
		}
		perr := k.Pause(k.Context(), refused)
		var be *fencelock.BackendError
		if !errors.As(perr, &be) || !errors.Is(perr, refused) || errors.Is(perr, context.DeadlineExceeded) {
			t.Errorf("Pause to the window's end = %v; want a *BackendError wrapping the store's failure, and no deadline's", perr)
		}
		if took := time.Since(begun); took != 3*time.Second {
			t.Errorf("Pause ended %v after the failure; want the window's end, 3s", took)
		}
	})
}
