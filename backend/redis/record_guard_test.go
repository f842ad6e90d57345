package redis_test

import (
	"bytes"
	"errors"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
)

// TestForeignRecordWithTwoNewlinesUnchanged: until the scripts
// checked the first line, their only test that a record is theirs was
// "two newlines", so a foreign string that has two newlines but whose
// first line is not a token ("x", "0", a leading zero, 20 digits, empty)
// was read as a record. The holder's-retry path of acquire.lua then
// rewrites it (SET … PX with the caller's metadata and TTL) and
// force.lua deletes it, and only afterwards does Go fail to parse the
// token, with an untyped "malformed token" error. Invariant broken: bad
// input (a record the backend did not write) must get a typed error
// (ErrForeignRecord) and change nothing stored; here the call reports
// failure yet has changed (or deleted) the value.
func TestForeignRecordWithTwoNewlinesUnchanged(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	for i, rec := range []string{"x\nold-owner\n", "0\nold-owner\nmeta", "07\nold-owner\n", "12345678901234567890\nold-owner\n", "\nold-owner\n"} {
		key := "foreign2nl-" + strconv.Itoa(i)
		lock := "{" + b.Prefix() + ":" + key + "}:lock"
		for _, call := range []struct {
			name string
			do   func() error
		}{
			{"Acquire by the owner on line 2", func() error {
				_, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "old-owner", TTL: time.Second, Metadata: []byte("mine")})
				return err
			}},
			{"ForceRelease", func() error {
				_, err := b.ForceRelease(ctx, key)
				return err
			}},
			{"Acquire by another owner", func() error {
				_, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "other", TTL: time.Second})
				return err
			}},
			{"Inspect", func() error {
				_, err := b.Inspect(ctx, key)
				return err
			}},
			{"List", func() error {
				_, err := b.List(ctx, key)
				return err
			}},
		} {
			if err := rdb.Set(ctx, lock, rec, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			err := call.do()
			got, gerr := rdb.Get(ctx, lock).Result()
			pttl := rdb.PTTL(ctx, lock).Val()
			if gerr != nil || got != rec || pttl <= 50*time.Second {
				t.Errorf("record %q: %s (err %v) changed it: now %q (%v), PTTL %v", rec, call.name, err, got, gerr, pttl)
			}
			if !errors.Is(err, fencelockredis.ErrForeignRecord) {
				t.Errorf("record %q: %s = %v; want an error matching ErrForeignRecord", rec, call.name, err)
			}
		}
	}
}

// TestStaleTokenIsDecimalPrefixOfCurrent: a stale grant whose token
// is a decimal prefix of the current token (1 vs 10..19, after rotations)
// renews, rotates and releases nothing (the existing tests cover the other
// direction, a token with the current one as its prefix).
func TestStaleTokenIsDecimalPrefixOfCurrent(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "pfx", Owner: "o", TTL: time.Minute, Metadata: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	stale := g
	// Next token: stale.Token*10, whose decimal starts with stale.Token's.
	counter := "{" + b.Prefix() + ":pfx}:token"
	if err := rdb.Set(ctx, counter, strconv.FormatUint(uint64(stale.Token)*10-1, 10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	cur, err := b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute, Rotate: true})
	if err != nil || cur.Token != stale.Token*10 {
		t.Fatalf("rotation = %+v, %v; want token %d", cur, err, stale.Token*10)
	}
	lock := "{" + b.Prefix() + ":pfx}:lock"
	before := rdb.Get(ctx, lock).Val()
	if err := b.Release(ctx, stale); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Release(stale) = %v; want ErrNotHeld", err)
	}
	if _, err := b.Renew(ctx, stale, driver.RenewRequest{TTL: time.Minute, Rotate: true, SetMetadata: true, Metadata: []byte("x")}); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Renew(stale) = %v; want ErrNotHeld", err)
	}
	res, err := b.RenewBatch(ctx, []driver.Grant{stale}, driver.RenewRequest{TTL: time.Minute})
	if err != nil || !errors.Is(res[0].Err, driver.ErrNotHeld) {
		t.Errorf("RenewBatch(stale) = %+v, %v; want ErrNotHeld", res, err)
	}
	if after := rdb.Get(ctx, lock).Val(); after != before {
		t.Fatalf("record %q -> %q", before, after)
	}
	if c := rdb.Get(ctx, counter).Val(); c != strconv.FormatUint(uint64(cur.Token), 10) {
		t.Fatalf("counter %s; want %d (no token drawn by the stale rotation)", c, cur.Token)
	}
	if err := b.Release(ctx, cur); err != nil {
		t.Fatalf("Release(current) = %v", err)
	}
}

// TestEmptyMetadataAndRESP2: an Acquire with empty (non-nil)
// metadata stores none and Inspect answers nil; a holder's retry with no
// metadata removes what the record had; metadata that spells another
// owner's record head ("\n<token>\n<owner>\n") gives that owner nothing;
// and a RESP2 connection reads "no metadata" as nil too (the default
// go-redis client speaks RESP3).
func TestEmptyMetadataAndRESP2(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	opt, err := goredis.ParseURL(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.Protocol = 2
	rdb2 := goredis.NewClient(opt)
	t.Cleanup(func() { rdb2.Close() })
	b2, err := fencelockredis.New(ctx, rdb2, &fencelockredis.Options{Prefix: b.Prefix(), SkipChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b2.Close() })
	lock := "{" + b.Prefix() + ":em}:lock"

	inspect := func(step string, wantMD []byte) {
		t.Helper()
		for name, be := range map[string]*fencelockredis.Backend{"RESP3": b, "RESP2": b2} {
			in, err := be.Inspect(ctx, "em")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(in.Metadata, wantMD) || (wantMD == nil) != (in.Metadata == nil) {
				t.Errorf("%s, %s: Inspect metadata %q; want %q", step, name, in.Metadata, wantMD)
			}
			l, err := be.List(ctx, "em")
			if err != nil || len(l) != 1 || !bytes.Equal(l[0].Metadata, wantMD) || (wantMD == nil) != (l[0].Metadata == nil) {
				t.Errorf("%s, %s: List = %+v, %v; want metadata %q", step, name, l, err, wantMD)
			}
		}
	}
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "em", Owner: "o", TTL: time.Minute, Metadata: []byte{}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rdb.Get(ctx, lock).Val(), strconv.FormatUint(uint64(g.Token), 10)+"\no\n"; got != want {
		t.Fatalf("record %q; want %q", got, want)
	}
	inspect("empty metadata", nil)

	// Metadata that spells the head of another owner's record, and the
	// whole of a record of the holder's own with another token.
	md := []byte("\n" + strconv.FormatUint(uint64(g.Token), 10) + "\nother\n" + "\n" + strconv.FormatUint(uint64(g.Token)+1, 10) + "\no\n")
	if r, err := b.Acquire(ctx, driver.AcquireRequest{Key: "em", Owner: "o", TTL: time.Minute, Metadata: md}); err != nil || r.Token != g.Token {
		t.Fatalf("holder's retry = %+v, %v", r, err)
	}
	inspect("metadata spelling heads", md)
	for _, bad := range []driver.Grant{{Key: "em", Owner: "other", Token: g.Token}, {Key: "em", Owner: "o", Token: g.Token + 1}} {
		if err := b.Release(ctx, bad); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Release(%+v) = %v; want ErrNotHeld", bad, err)
		}
	}
	inspect("after wrong releases", md)

	if r, err := b.Acquire(ctx, driver.AcquireRequest{Key: "em", Owner: "o", TTL: time.Minute}); err != nil || r.Token != g.Token {
		t.Fatalf("holder's retry without metadata = %+v, %v", r, err)
	}
	inspect("retry without metadata", nil)
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
}
