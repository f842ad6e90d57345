package redis_test

import (
	"bytes"
	"errors"
	"strconv"
	"testing"
	"time"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
)

// TestRecordLayout: a lock record is the string "<token>\n<owner>\n<meta>"
// with the lease's TTL, and metadata of any bytes (newlines, the record's
// own separators, binary) comes back exactly from Inspect and List, stays
// through a plain and a rotating renewal, is replaced by a holder's
// retried Acquire and by a renewal that sets it, and is removed by an
// empty one.
func TestRecordLayout(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	lock := "{" + b.Prefix() + ":rec}:lock"
	metas := [][]byte{[]byte("plain"), []byte("\n"), []byte("a\nb\n\nc\n"), {0, '\n', 0xff, '\r'}, bytes.Repeat([]byte("\n9\nx"), 100)}
	for _, md := range metas {
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "rec", Owner: "owner-1", TTL: time.Minute, Metadata: md})
		if err != nil {
			t.Fatal(err)
		}
		want := strconv.FormatUint(uint64(g.Token), 10) + "\nowner-1\n" + string(md)
		if got := rdb.Get(ctx, lock).Val(); got != want {
			t.Fatalf("record %q; want %q", got, want)
		}
		if pttl := rdb.PTTL(ctx, lock).Val(); pttl <= 50*time.Second || pttl > time.Minute {
			t.Fatalf("record PTTL %v; want the lease's minute", pttl)
		}
		check := func(step string, wantMD []byte, tok driver.Token) {
			t.Helper()
			in, err := b.Inspect(ctx, "rec")
			if err != nil {
				t.Fatal(err)
			}
			if in.Owner != "owner-1" || in.Token != tok || !bytes.Equal(in.Metadata, wantMD) || (wantMD == nil) != (in.Metadata == nil) {
				t.Fatalf("%s: Inspect = %+v (metadata %q); want owner-1, token %d, metadata %q", step, in, in.Metadata, tok, wantMD)
			}
			l, err := b.List(ctx, "rec")
			if err != nil {
				t.Fatal(err)
			}
			if len(l) != 1 || !bytes.Equal(l[0].Metadata, wantMD) || l[0].Token != tok {
				t.Fatalf("%s: List = %+v; want the record of token %d with metadata %q", step, l, tok, wantMD)
			}
		}
		check("after Acquire", md, g.Token)
		if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
		check("after a renewal", md, g.Token)
		old := g.Token
		if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute, Rotate: true}); err != nil || g.Token <= old {
			t.Fatalf("rotating Renew = %+v, %v; want a token above %d", g, err, old)
		}
		check("after a rotation", md, g.Token)
		// A retry by the holder keeps its token and takes the retry's metadata.
		if r, err := b.Acquire(ctx, driver.AcquireRequest{Key: "rec", Owner: "owner-1", TTL: time.Minute, Metadata: []byte("retried\n")}); err != nil || r.Token != g.Token {
			t.Fatalf("holder's retry = %+v, %v; want token %d", r, err, g.Token)
		}
		check("after the holder's retry", []byte("retried\n"), g.Token)
		if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute, SetMetadata: true, Metadata: md}); err != nil {
			t.Fatal(err)
		}
		check("after setting it", md, g.Token)
		if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute, SetMetadata: true}); err != nil {
			t.Fatal(err)
		}
		check("after removing it", nil, g.Token)
		// Another owner is refused, and told who holds the key.
		_, err = b.Acquire(ctx, driver.AcquireRequest{Key: "rec", Owner: "owner-2", TTL: time.Minute})
		var held *driver.HeldError
		if !errors.As(err, &held) || held.Holder.Owner != "owner-1" || held.Holder.Token != g.Token {
			t.Fatalf("Acquire by another owner = %v; want HeldError naming owner-1, token %d", err, g.Token)
		}
		if err := b.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		if n := rdb.Exists(ctx, lock).Val(); n != 0 {
			t.Fatalf("record still there after Release")
		}
	}
}

// TestReleaseComparesWholeOwner: an owner that is a prefix of the
// holder's, or has it as a prefix, releases and renews nothing (the record
// is compared up to the newline after the owner).
func TestReleaseComparesWholeOwner(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "own", TTL: time.Minute, Metadata: []byte("er")})
	if err != nil {
		t.Fatal(err)
	}
	lock := "{" + b.Prefix() + ":k}:lock"
	before := rdb.Get(ctx, lock).Val()
	for _, owner := range []string{"ow", "owner", "own\ner"} {
		bad := g
		bad.Owner = owner
		if err := b.Release(ctx, bad); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Release as %q = %v; want ErrNotHeld", owner, err)
		}
		if _, err := b.Renew(ctx, bad, driver.RenewRequest{TTL: time.Minute}); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Renew as %q = %v; want ErrNotHeld", owner, err)
		}
	}
	for _, tok := range []driver.Token{g.Token * 10, g.Token*10 + 1} {
		bad := g
		bad.Token = tok
		if err := b.Release(ctx, bad); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Release with token %d = %v; want ErrNotHeld", tok, err)
		}
	}
	if after := rdb.Get(ctx, lock).Val(); after != before {
		t.Fatalf("record %q -> %q", before, after)
	}
}

// TestOldHashRecordRefused: a lock record in the hash layout of earlier
// development versions is refused by every call with an error matching
// ErrOldFormat that names the key, and nothing stored changes: the hash,
// its TTL and the counter stay, no token is drawn.
func TestOldHashRecordRefused(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	lock, counter := "{"+b.Prefix()+":old}:lock", "{"+b.Prefix()+":old}:token"
	if err := rdb.HSet(ctx, lock, "owner", "old-owner", "token", "7").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.PExpire(ctx, lock, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, counter, "7", 0).Err(); err != nil {
		t.Fatal(err)
	}
	g := driver.Grant{Key: "old", Owner: "old-owner", Token: 7}
	_, errAcquire := b.Acquire(ctx, driver.AcquireRequest{Key: "old", Owner: "new-owner", TTL: time.Minute})
	_, errRetry := b.Acquire(ctx, driver.AcquireRequest{Key: "old", Owner: "old-owner", TTL: time.Minute})
	_, errRenew := b.Renew(ctx, g, driver.RenewRequest{TTL: time.Hour, Rotate: true})
	errRelease := b.Release(ctx, g)
	_, errInspect := b.Inspect(ctx, "old")
	_, errList := b.List(ctx, "old")
	_, errForce := b.ForceRelease(ctx, "old")
	for name, err := range map[string]error{"Acquire": errAcquire, "Acquire by its owner": errRetry, "Renew": errRenew,
		"Release": errRelease, "Inspect": errInspect, "List": errList, "ForceRelease": errForce} {
		if !errors.Is(err, fencelockredis.ErrOldFormat) {
			t.Errorf("%s = %v; want ErrOldFormat", name, err)
		} else if !bytes.Contains([]byte(err.Error()), []byte(`"old"`)) {
			t.Errorf("%s: %q does not name the key", name, err)
		}
	}
	if h := rdb.HGetAll(ctx, lock).Val(); h["owner"] != "old-owner" || h["token"] != "7" || len(h) != 2 {
		t.Errorf("hash now %v", h)
	}
	if pttl := rdb.PTTL(ctx, lock).Val(); pttl <= 50*time.Second || pttl > time.Minute {
		t.Errorf("hash PTTL %v; want the minute it was given", pttl)
	}
	if c := rdb.Get(ctx, counter).Val(); c != "7" {
		t.Errorf("counter %s; want 7 (no token drawn)", c)
	}
}
