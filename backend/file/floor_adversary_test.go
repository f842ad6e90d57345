//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package file_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/file"
	"github.com/fencelock/fencelock/driver"
)

// A floor just below 2^63-1 leaves room for one more token; after it,
// Acquire and a rotating Renew must refuse (ErrTokenOverflow) and change
// nothing, never hand out a token above 2^63-1, and a second process on
// the same directory sees the same.
func TestFloorNearMaxNeverIssuesAbove2p63(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	b1, err := file.New(ctx, &file.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b1.Close()
	b2, err := file.New(ctx, &file.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	const key, ttl = "near-max", 5 * time.Second
	if err := b2.RaiseFloor(ctx, key, math.MaxInt64-1); err != nil {
		t.Fatal(err)
	}
	g, err := b1.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "a", TTL: ttl})
	if err != nil || g.Token != math.MaxInt64 {
		t.Fatalf("Acquire after RaiseFloor(2^63-2) = %+v, %v; want token 2^63-1", g, err)
	}
	// The counter is exhausted: a rotation is refused and keeps the grant.
	if r, err := b1.Renew(ctx, g, driver.RenewRequest{TTL: ttl, Rotate: true}); !errors.Is(err, file.ErrTokenOverflow) {
		t.Fatalf("rotating Renew at 2^63-1 = %+v, %v; want ErrTokenOverflow", r, err)
	}
	if rs, err := b1.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: ttl, Rotate: true}); err != nil || !errors.Is(rs[0].Err, file.ErrTokenOverflow) {
		t.Fatalf("rotating RenewBatch at 2^63-1 = %+v, %v; want ErrTokenOverflow", rs, err)
	}
	if info, err := b2.Inspect(ctx, key); err != nil || info.Token != g.Token || info.Owner != "a" {
		t.Fatalf("Inspect after the refused rotations = %+v, %v; want the grant unchanged", info, err)
	}
	if _, err := b1.Renew(ctx, g, driver.RenewRequest{TTL: ttl}); err != nil {
		t.Fatalf("plain Renew of the grant after the refused rotation: %v", err)
	}
	if err := b1.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*file.Backend{b1, b2} {
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "b", TTL: ttl})
		if !errors.Is(err, file.ErrTokenOverflow) || !errors.Is(err, driver.ErrUnsupported) {
			t.Fatalf("Acquire with the counter at 2^63-1 = %+v, %v; want ErrTokenOverflow (and ErrUnsupported)", g, err)
		}
	}
	if info, err := b1.Inspect(ctx, key); err != nil || info.Owner != "" {
		t.Fatalf("Inspect after the refused Acquire = %+v, %v; want the key free", info, err)
	}
	if hw, err := b1.HighWater(ctx, ""); err != nil || hw.Keys[key] != math.MaxInt64 {
		t.Fatalf("HighWater = %+v, %v; want %q at 2^63-1", hw, err, key)
	}
}
