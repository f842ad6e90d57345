package mongo

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A claim that keeps colliding (every retry's read returning the same
// base, as a read behind the commit point would) gives up with the
// transient errTokenRace after maxClaimRounds, in bounded time and
// without a context deadline; before that it waits, never spinning, and
// a context that ends stops it at once.
func TestClaimBackoffIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var err error
		round := 0
		for ; err == nil; round++ {
			err = claimBackoff(context.Background(), round)
		}
		if !errors.Is(err, errTokenRace) {
			t.Fatalf("claimBackoff after %d rounds = %v; want errTokenRace", round, err)
		}
		if round != maxClaimRounds {
			t.Errorf("gave up after %d collisions; want %d", round, maxClaimRounds)
		}
		// Rounds 2..31 wait at least half of 1, 2, 4, 8, 16, 32, 32, … ms.
		if spent := time.Since(start); spent < 300*time.Millisecond || spent > time.Second {
			t.Errorf("%d collisions took %v; want between 300ms and 1s of backoff", round, spent)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := claimBackoff(ctx, 5); !errors.Is(err, context.Canceled) {
			t.Errorf("claimBackoff with an ended context = %v; want context.Canceled", err)
		}
	})
}
