package redis_test

import (
	"errors"
	"math"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
)

// TestTokensExactPast2Pow53 is the regression test for tokens that
// repeated past 2^53: the scripts passed INCR's result through a Lua
// number (a double), so tokens above 2^53 came back rounded (…992, …992,
// …994). From a floor just below 2^53 and one just below 2^63-1 (the top
// of a PostgreSQL bigint, the largest token a migration can bring, and
// the largest integer Redis holds), every way of drawing a token (Acquire,
// a rotating Renew, a rotating RenewBatch, Acquire after Release) must
// give exactly the previous token + 1, and every way of reading one back
// (the holder's own retry, a plain Renew, Inspect, List, HighWater) must
// give it unchanged. Past 2^63-1 the backend must refuse with
// ErrTokenOverflow and change nothing, never round or wrap.
func TestTokensExactPast2Pow53(t *testing.T) {
	for _, tc := range []struct {
		name  string
		floor driver.Token
	}{
		{"2^53", 1<<53 - 3},
		{"2^63-1", math.MaxInt64 - 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, rdb := open(t)
			ctx := t.Context()
			const key = "exact"
			if err := b.RaiseFloor(ctx, key, tc.floor); err != nil {
				t.Fatalf("RaiseFloor(%d): %v", tc.floor, err)
			}
			prev := tc.floor
			next := func(what string, got driver.Token) {
				t.Helper()
				if got != prev+1 {
					t.Fatalf("%s: token %d, want exactly %d (previous + 1)", what, got, prev+1)
				}
				prev = got
			}
			same := func(what string, got driver.Token) {
				t.Helper()
				if got != prev {
					t.Fatalf("%s: token %d, want %d unchanged", what, got, prev)
				}
			}
			read := func() {
				t.Helper()
				in, err := b.Inspect(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				same("Inspect", in.Token)
				infos, err := b.List(ctx, key)
				if err != nil || len(infos) != 1 {
					t.Fatalf("List = %+v, %v", infos, err)
				}
				same("List", infos[0].Token)
				hw, err := b.HighWater(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				same("HighWater", hw.Keys[key])
			}
			owners := []string{"a", "b", "c", "d"}
			var g driver.Grant
			for i := 0; prev < math.MaxInt64 && i < 8; i++ {
				var err error
				g, err = b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owners[i%len(owners)], TTL: time.Minute})
				if err != nil {
					t.Fatalf("Acquire after %d: %v", prev, err)
				}
				next("Acquire", g.Token)
				read()
				// The holder's retry of an ambiguous acquire: the same grant.
				g2, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: g.Owner, TTL: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				same("Acquire retried by the holder", g2.Token)
				if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute}); err != nil {
					t.Fatal(err)
				}
				same("Renew", g.Token)
				if prev < math.MaxInt64 {
					if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute, Rotate: true}); err != nil {
						t.Fatalf("rotating Renew after %d: %v", prev, err)
					}
					next("rotating Renew", g.Token)
					read()
				}
				if prev < math.MaxInt64 {
					res, err := b.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: time.Minute, Rotate: true})
					if err != nil || res[0].Err != nil {
						t.Fatalf("rotating RenewBatch after %d: %v, %+v", prev, err, res)
					}
					g = res[0].Grant
					next("rotating RenewBatch", g.Token)
					read()
				}
				if prev == math.MaxInt64 {
					break
				}
				if err := b.Release(ctx, g); err != nil {
					t.Fatalf("Release(%d): %v", g.Token, err)
				}
			}
			if tc.floor < 1<<62 {
				if prev < tc.floor+8 {
					t.Fatalf("only reached %d", prev)
				}
				return
			}
			if prev != math.MaxInt64 {
				t.Fatalf("stopped at %d, want the counter at 2^63-1", prev)
			}
			// The counter is at 2^63-1: the holder g holds it. Rotation
			// must be refused, the grant left as it was.
			lock, counter := "{"+b.Prefix()+":"+key+"}:lock", "{"+b.Prefix()+":"+key+"}:token"
			if err := rdb.PExpire(ctx, lock, 30*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			_, err := b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute, Rotate: true})
			overflow(t, "rotating Renew at 2^63-1", err)
			if pttl := rdb.PTTL(ctx, lock).Val(); pttl > 30*time.Second {
				t.Fatalf("refused rotation still extended the lock: PTTL %v", pttl)
			}
			res, err := b.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: time.Minute, Rotate: true})
			if err != nil {
				t.Fatal(err)
			}
			overflow(t, "rotating RenewBatch at 2^63-1", res[0].Err)
			read()
			if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute}); err != nil {
				t.Fatalf("plain Renew at 2^63-1: %v", err)
			}
			same("Renew at 2^63-1", g.Token)
			if err := b.Release(ctx, g); err != nil {
				t.Fatal(err)
			}
			// Free key, counter at 2^63-1: Acquire must be refused and
			// store nothing.
			_, err = b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "z", TTL: time.Minute})
			overflow(t, "Acquire at 2^63-1", err)
			if n := rdb.Exists(ctx, lock).Val(); n != 0 {
				t.Fatal("refused Acquire left a lock record")
			}
			if v, err := rdb.Get(ctx, counter).Result(); err != nil || v != "9223372036854775807" {
				t.Fatalf("counter after refused Acquire = %q, %v", v, err)
			}
			// Floors: 2^63-2 is the highest that leaves a token to issue.
			for _, f := range []driver.Token{math.MaxInt64, 1 << 63, math.MaxUint64} {
				if err := b.RaiseFloor(ctx, "other", f); !errors.Is(err, driver.ErrInvalidOption) {
					t.Fatalf("RaiseFloor(%d) = %v, want ErrInvalidOption", f, err)
				}
			}
			if err := b.RaiseFloor(ctx, "other", math.MaxInt64-1); err != nil {
				t.Fatalf("RaiseFloor(2^63-2) = %v", err)
			}
			if g := acquire(t, b, "other", "o", time.Minute); g.Token != math.MaxInt64 {
				t.Fatalf("token after RaiseFloor(2^63-2) = %d", g.Token)
			}
		})
	}
}

func overflow(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, fencelockredis.ErrTokenOverflow) {
		t.Fatalf("%s = %v, want ErrTokenOverflow", what, err)
	}
	if !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("%s = %v, want it to match driver.ErrUnsupported (a definite answer, not retried)", what, err)
	}
	var re goredis.Error
	if errors.As(err, &re) {
		t.Fatalf("%s = %v: a raw server error, not the backend's", what, err)
	}
}
