package recipe_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

// TestRecipesPassTheCallsLockDelayOn checks that a lock delay given to a
// recipe's call (WithLockDelay) reaches the leases the recipe takes: after
// a holder's record ended without a release, each recipe's try on the key
// is refused for the delay, with a *HeldError whose LockDelay says how
// much is left, rather than granted at once.
func TestRecipesPassTheCallsLockDelayOn(t *testing.T) {
	const delay = time.Hour
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		key  func(key string) string // the record the recipe's first lease is on
		try  func(c *fencelock.Client, key string) error
	}{
		{"TryAcquireAll", func(key string) string { return key }, func(c *fencelock.Client, key string) error {
			g, err := recipe.TryAcquireAll(ctx, c, []string{key}, fencelock.WithLockDelay(delay))
			if err == nil {
				_ = g.Release(ctx)
			}
			return err
		}},
		{"Semaphore.TryAcquire", func(key string) string { _, slots := recipe.Keys(key, 1); return slots[0] }, func(c *fencelock.Client, key string) error {
			s, err := recipe.NewSemaphore(c, key, 1)
			if err != nil {
				return err
			}
			l, err := s.TryAcquire(ctx, fencelock.WithLockDelay(delay))
			if err == nil {
				_ = l.Release(ctx)
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := memory.NewStore()
			c, err := fencelock.New(store.Backend(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			key := "delayed"
			record := tc.key(key)
			holder, err := c.TryAcquire(ctx, record, fencelock.WithLockDelay(delay))
			if err != nil {
				t.Fatal(err)
			}
			if !store.Expire(record) {
				t.Fatalf("the holder's record of %q was not live", record)
			}
			<-holder.Done() // lost: its renewal is refused, or the store told it
			err = tc.try(c, key)
			var held *fencelock.HeldError
			if !errors.As(err, &held) || held.LockDelay <= 0 {
				t.Fatalf("%s with WithLockDelay(%v) right after the holder's record expired = %v; want a *HeldError with the rest of the delay (the recipe must pass the call's lock delay to its leases)", tc.name, delay, err)
			}
		})
	}
}
