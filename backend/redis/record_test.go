package redis_test

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
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
// is compared up to the newline after the owner), and so does an owner
// with a newline that spells the holder's owner, the newline and the start
// of its metadata.
func TestReleaseComparesWholeOwner(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "own", TTL: time.Minute, Metadata: []byte("er\nmore")})
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
		res, err := b.RenewBatch(ctx, []driver.Grant{bad}, driver.RenewRequest{TTL: time.Minute})
		if err != nil || !errors.Is(res[0].Err, driver.ErrNotHeld) {
			t.Errorf("RenewBatch as %q = %v, %v; want ErrNotHeld", owner, res, err)
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

// TestForeignRecordRefused: a lock record this backend did not write, a
// hash in the layout of earlier development versions or a string without
// the record's two newlines, is refused with an error matching
// ErrForeignRecord that names the key, and nothing stored changes: the
// value, its TTL and the counter stay, no token is drawn. (Renew and
// Release of a string they cannot match answer ErrNotHeld, also changing
// nothing.)
func TestForeignRecordRefused(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	for _, kind := range []string{"hash", "string"} {
		t.Run(kind, func(t *testing.T) {
			lock, counter := "{"+b.Prefix()+":"+kind+"}:lock", "{"+b.Prefix()+":"+kind+"}:token"
			if kind == "hash" {
				if err := rdb.HSet(ctx, lock, "owner", "old-owner", "token", "7").Err(); err != nil {
					t.Fatal(err)
				}
			} else if err := rdb.Set(ctx, lock, "7 old-owner", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.PExpire(ctx, lock, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.Set(ctx, counter, "7", 0).Err(); err != nil {
				t.Fatal(err)
			}
			dump := func() string { return rdb.Dump(ctx, lock).Val() }
			before := dump()
			g := driver.Grant{Key: kind, Owner: "old-owner", Token: 7}
			_, errAcquire := b.Acquire(ctx, driver.AcquireRequest{Key: kind, Owner: "new-owner", TTL: time.Minute})
			_, errRetry := b.Acquire(ctx, driver.AcquireRequest{Key: kind, Owner: "old-owner", TTL: time.Minute})
			_, errRenew := b.Renew(ctx, g, driver.RenewRequest{TTL: time.Hour, Rotate: true})
			errRelease := b.Release(ctx, g)
			_, errInspect := b.Inspect(ctx, kind)
			_, errList := b.List(ctx, kind)
			_, errForce := b.ForceRelease(ctx, kind)
			refused := map[string]error{"Acquire": errAcquire, "Acquire by its owner": errRetry, "Inspect": errInspect, "List": errList, "ForceRelease": errForce}
			if kind == "hash" {
				refused["Renew"], refused["Release"] = errRenew, errRelease
			} else {
				for name, err := range map[string]error{"Renew": errRenew, "Release": errRelease} {
					if !errors.Is(err, driver.ErrNotHeld) {
						t.Errorf("%s = %v; want ErrNotHeld", name, err)
					}
				}
			}
			for name, err := range refused {
				if !errors.Is(err, fencelockredis.ErrForeignRecord) {
					t.Errorf("%s = %v; want ErrForeignRecord", name, err)
				} else if !strings.Contains(err.Error(), strconv.Quote(kind)) {
					t.Errorf("%s: %q does not name the key", name, err)
				}
			}
			if after := dump(); after != before {
				t.Errorf("record changed")
			}
			if pttl := rdb.PTTL(ctx, lock).Val(); pttl <= 50*time.Second || pttl > time.Minute {
				t.Errorf("PTTL %v; want the minute it was given", pttl)
			}
			if c := rdb.Get(ctx, counter).Val(); c != "7" {
				t.Errorf("counter %s; want 7 (no token drawn)", c)
			}
		})
	}
}
