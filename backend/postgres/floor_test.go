package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
)

// TestRaiseFloorNeverRepeatsAToken races RaiseFloor, with floors just
// above the sequence's current value, against acquires that draw tokens:
// setval is not transactional, so without the table lock a raise computed
// from a stale read moves the sequence back and a token is issued twice.
func TestRaiseFloorNeverRepeatsAToken(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	const workers, rounds = 6, 150
	var (
		mu     sync.Mutex
		issued = map[driver.Token]string{}
		dup    []string
		wg     sync.WaitGroup
		stop   = make(chan struct{})
	)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				key := fmt.Sprintf("k%d-%d", w, i)
				g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "o", TTL: time.Minute})
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				mu.Lock()
				if prev, ok := issued[g.Token]; ok {
					dup = append(dup, fmt.Sprintf("token %d issued to %s and %s", g.Token, prev, key))
				}
				issued[g.Token] = key
				mu.Unlock()
			}
		})
	}
	raises := 0
	var raiser sync.WaitGroup
	raiser.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			hw, err := b.HighWater(ctx, "")
			if err != nil {
				t.Errorf("HighWater: %v", err)
				return
			}
			if err := b.RaiseFloor(ctx, "", hw.Global+3); err != nil {
				t.Errorf("RaiseFloor: %v", err)
				return
			}
			raises++
		}
	})
	wg.Wait()
	close(stop)
	raiser.Wait()
	if len(dup) > 0 {
		t.Fatalf("%d tokens issued twice while the floor was raised %d times, e.g. %s", len(dup), raises, dup[0])
	}
	if raises == 0 {
		t.Fatal("the floor was never raised during the run: the test proved nothing")
	}
	t.Logf("%d tokens, %d concurrent raises, no token issued twice", len(issued), raises)
}

// TestRaiseFloorRejectsTokensPostgresCannotStore checks the bigint bound.
func TestRaiseFloorRejectsTokensPostgresCannotStore(t *testing.T) {
	base := testURL(t)
	dsn := withParams(t, base, "table", uniqueTable(t, base))
	b, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.RaiseFloor(t.Context(), "k", 1<<63); !errors.Is(err, driver.ErrInvalidOption) {
		t.Fatalf("RaiseFloor(2^63) = %v, want ErrInvalidOption", err)
	}
	hw, err := b.HighWater(t.Context(), "")
	if err != nil || hw.Global != 0 {
		t.Fatalf("after a rejected raise, HighWater = %+v, %v: want nothing changed", hw, err)
	}
}
