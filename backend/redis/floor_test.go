package redis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// TestFloorExactPastLuaPrecision raises a counter near 2^53, where Lua's
// numbers lose precision, and checks that the floor script compares
// exactly: one above is taken, one below is not. A floor of 2^63-1 or more
// (no token left to issue) is refused.
func TestFloorExactPastLuaPrecision(t *testing.T) {
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
	if err := b.RaiseFloor(ctx, "big", 1<<63-1); !errors.Is(err, driver.ErrInvalidOption) {
		t.Fatalf("RaiseFloor(2^63-1) = %v, want ErrInvalidOption (no token above it fits in Redis)", err)
	}
	if err := b.RaiseFloor(ctx, "", 5); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("RaiseFloor(\"\") = %v, want ErrUnsupported", err)
	}
}
