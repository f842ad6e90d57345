package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
)

// lockPair takes the leases of two keys together, in the order given:
// both, or neither, waiting while either is held, until ctx ends (or
// WithWait's bound passes: an error matching ErrNotAcquired). Releasing
// either lease, or losing it, releases the other. opts apply to both
// leases as to Client.Acquire.
//
// It is a recipe written only on fencelock's exported API, through the
// seam the recipe package uses (docs/writing-a-recipe.md quotes it).
func lockPair(ctx context.Context, c *fencelock.Client, first, second string, opts ...fencelock.AcquireOption) (a, b *fencelock.Lease, err error) {
	// Begin resolves and checks opts, applies WithWait to the whole
	// call, and makes Close end the call and wait for it.
	k, err := c.Begin(ctx, opts...)
	if err != nil {
		return nil, nil, err
	}
	defer func() { err = k.End(err) }() // End once: ErrClosed, or the WithWait bound's ErrNotAcquired
	ctx = k.Context()
	// Each lease gets the call's resolved options, without WithWait:
	// the call bounds the whole wait.
	lease := []fencelock.AcquireOption{
		fencelock.WithTTL(k.TTL()), fencelock.WithLabel(k.Label()),
		fencelock.WithMinHold(k.MinHold()), fencelock.WithMetadata(k.Metadata()),
	}
	for {
		start := time.Now()
		a, b, err = tryPair(ctx, k, c, first, second, lease)
		if err == nil {
			return a, b, nil
		}
		// A held key (ErrNotAcquired) and a failure of the store within
		// the call's failure window go on; anything else ends the call.
		if err := k.Outcome(start, err); err != nil {
			return nil, nil, err
		}
		// The one backoff: capped, jittered, and no longer than until
		// the holder that err names is due to expire.
		if err := k.Pause(ctx, err); err != nil {
			return nil, nil, err
		}
	}
}

// tryPair makes one round of lockPair: a look at the second key, then
// the first lease, then the second.
func tryPair(ctx context.Context, k *fencelock.Call, c *fencelock.Client, first, second string, lease []fencelock.AcquireOption) (a, b *fencelock.Lease, err error) {
	// A store request the call makes itself runs within Call.Request:
	// bounded by the TTL, and by the end of the store's failure window.
	rctx, cancel := k.Request()
	info, err := c.Inspect(rctx, second)
	cancel()
	switch {
	case err != nil:
		return nil, nil, err
	case info.Locked():
		// "Held" is an answer, not a success: report it as a
		// *HeldError, so that Pause grows and waits for its expiry.
		return nil, nil, &fencelock.HeldError{Holder: info}
	}
	if a, err = c.TryAcquire(ctx, first, lease...); err != nil {
		return nil, nil, err
	}
	if b, err = c.TryAcquire(ctx, second, lease...); err != nil {
		// a was never handed out: release it at once, whatever its
		// minimum hold (bounded by Options.ReleaseTimeout, even if ctx
		// has ended).
		_ = a.ReleaseNow(ctx)
		return nil, nil, err
	}
	a.OnEnd(releaseWith(c, b))
	b.OnEnd(releaseWith(c, a))
	return a, b, nil
}

// releaseWith returns an OnEnd hook that releases other. The hook runs
// under its lease's lock and must not block: from a goroutine of its
// own, it hands the release to Client.Go, whose goroutine Close waits
// for.
func releaseWith(c *fencelock.Client, other *fencelock.Lease) func(error) {
	return func(error) {
		go c.Go(func(closing context.Context) {
			// Bounded by Options.ReleaseTimeout, and by Close's budget
			// once closing has ended.
			_ = other.Release(closing)
		})
	}
}

// Example_writeARecipe runs lockPair, a recipe of two leases written on
// the seam (Client.Begin, Call, Lease.ReleaseNow, Lease.OnEnd,
// Client.Go) as a third party would write one.
func Example_writeARecipe() {
	ctx := context.Background()
	store := memory.NewStore()
	c, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "mover"})
	other, _ := fencelock.New(store.Backend(), &fencelock.Options{Owner: "other"})
	defer c.Close()
	defer other.Close()

	// Another client holds the second key: the pair is not taken, and
	// the first key is left free.
	held, _ := other.Acquire(ctx, "to")
	_, _, err := lockPair(ctx, c, "from", "to", fencelock.WithWait(300*time.Millisecond))
	info, _ := c.Inspect(ctx, "from")
	fmt.Println(errors.Is(err, fencelock.ErrNotAcquired), info.Locked())

	// Once it is released, the waiting call takes both.
	time.AfterFunc(100*time.Millisecond, func() { held.Release(ctx) })
	a, b, err := lockPair(ctx, c, "from", "to")
	fmt.Println(err, a.Key(), b.Key())

	// Releasing one releases the other (Err is nil: released, not lost).
	a.Release(ctx)
	<-b.Done()
	fmt.Println("second released:", b.Err() == nil)
	// Output:
	// true false
	// <nil> from to
	// second released: true
}
