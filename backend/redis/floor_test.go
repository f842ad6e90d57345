package redis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// TestFloorExactUpToLuaPrecision raises a counter past 2^53, where
// Lua's numbers lose precision, and checks that the floor script compares
// exactly: one above is taken, one below is not.
func TestFloorExactUpToLuaPrecision(t *testing.T) {
	b, _ := open(t)
	ctx := t.Context()
	const big = driver.Token(1<<53 - 3)
	if err := b.RaiseFloor(ctx, "big", big); err != nil {
		t.Fatal(err)
	}
	if err := b.RaiseFloor(ctx, "big", big-1); err != nil { // lower: ignored
		t.Fatal(err)
	}
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "big", Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if g.Token != big+1 {
		t.Fatalf("token after RaiseFloor(%d) then a lower floor = %d, want %d", big, g.Token, big+1)
	}
	hw, err := b.HighWater(ctx, "big")
	if err != nil || hw.Keys["big"] != big+1 {
		t.Fatalf("HighWater = %+v, %v; want big = %d", hw, err, big+1)
	}
	if err := b.RaiseFloor(ctx, "big", 1<<53); !errors.Is(err, driver.ErrInvalidOption) {
		t.Fatalf("RaiseFloor(2^53) = %v, want ErrInvalidOption (tokens past 2^53 lose precision in Lua)", err)
	}
	if err := b.RaiseFloor(ctx, "", 5); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("RaiseFloor(\"\") = %v, want ErrUnsupported", err)
	}
}
