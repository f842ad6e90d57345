package conformance

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// metaOf returns the metadata Inspect reports for key, failing the test on
// an error.
func metaOf(t *testing.T, ctx context.Context, b driver.Backend, key string) driver.Info {
	t.Helper()
	info, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return info
}

// wantMeta checks that Inspect and List both report want (nil meaning no
// payload: Info.Metadata must then be nil, not merely empty) for a key held
// by owner.
func wantMeta(t *testing.T, ctx context.Context, b driver.Backend, key, owner string, want []byte, when string) {
	t.Helper()
	info := metaOf(t, ctx, b, key)
	if info.Owner != owner {
		t.Fatalf("%s: Inspect(%q) holder = %q; want %q", when, key, info.Owner, owner)
	}
	checkMeta(t, "Inspect", key, info.Metadata, want, when)
	infos, err := b.List(ctx, key)
	if err != nil {
		t.Fatalf("List(%q): %v", key, err)
	}
	found := false
	for _, in := range infos {
		if in.Key != key {
			continue
		}
		found = true
		checkMeta(t, "List", key, in.Metadata, want, when)
	}
	if !found {
		t.Fatalf("%s: List(%q) = %v; missing the held key", when, key, infos)
	}
}

func checkMeta(t *testing.T, how, key string, got, want []byte, when string) {
	t.Helper()
	if want == nil {
		if got != nil {
			t.Errorf("%s: %s(%q).Metadata = %q (len %d, non-nil); want nil", when, how, key, short(got), len(got))
		}
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: %s(%q).Metadata = %q (len %d); want %q (len %d)", when, how, key, short(got), len(got), short(want), len(want))
	}
}

// short abbreviates a payload for an error message.
func short(b []byte) []byte {
	if len(b) > 32 {
		return append(b[:32:32], "…"...)
	}
	return b
}

func testMetadata(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	b, other := s.backend(t), s.backend(t)
	ttl := 10 * s.h.TTL // no case here waits for expiry; keep renewals unnecessary

	// Arbitrary bytes round-trip exactly: NUL, invalid UTF-8, a quote, a
	// newline, and a payload of exactly MaxMetadataLen bytes.
	bin := []byte("a\x00b\xff\xfe\"'\n\x00")
	full := make([]byte, driver.MaxMetadataLen)
	for i := range full {
		full[i] = byte(i*7 + 3)
	}
	for _, tc := range []struct {
		name string
		md   []byte
		want []byte
	}{
		{"binary", bin, bin},
		{"max", full, full},
		{"empty", []byte{}, nil},
		{"nil", nil, nil},
	} {
		key := s.key(t, tc.name)
		var arg []byte
		if tc.md != nil {
			arg = make([]byte, len(tc.md))
			copy(arg, tc.md)
		}
		owner := "conformance-" + randHex()
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Metadata: arg})
		if err != nil {
			t.Fatalf("Acquire(%q) with %s metadata: %v", key, tc.name, err)
		}
		for i := range arg {
			arg[i] = 'X' // the caller may reuse its slice; the stored copy must not change
		}
		wantMeta(t, ctx, other, key, owner, tc.want, "after Acquire with "+tc.name+" metadata")
		if err := b.Release(ctx, g); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if info := metaOf(t, ctx, other, key); info.Locked() || info.Metadata != nil {
			t.Errorf("after Release Inspect(%q) = %+v; want free with no metadata", key, info)
		}
	}

	// Too large: refused by Acquire and Renew with an *InvalidOptionError,
	// nothing stored.
	big := make([]byte, driver.MaxMetadataLen+1)
	key := s.key(t, "big")
	_, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-" + randHex(), TTL: ttl, Metadata: big})
	checkInvalid(t, "Acquire", err)
	if info := metaOf(t, ctx, other, key); info.Locked() {
		t.Errorf("after a refused Acquire Inspect(%q) = %+v; want free", key, info)
	}

	// The holder's Renew with SetMetadata replaces it; without SetMetadata
	// (whatever Metadata says) and across rotation it is kept.
	key = s.key(t, "renew")
	owner := "conformance-" + randHex()
	v1, v2, v3 := []byte("v1\x00"), []byte("v2\xff"), []byte("v3")
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Metadata: v1})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	_, err = b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: big})
	checkInvalid(t, "Renew", err)
	wantMeta(t, ctx, other, key, owner, v1, "after a Renew with oversized metadata")
	before := g.Token
	if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: v2}); err != nil {
		t.Fatalf("holder's Renew(SetMetadata): %v", err)
	}
	// A store whose token is the record's version (etcd, ZooKeeper)
	// issues a new token when it rewrites the record; never a lower one.
	if g.Token < before {
		t.Fatalf("Renew(SetMetadata) returned token %d, below %d", g.Token, before)
	}
	wantMeta(t, ctx, other, key, owner, v2, "after the holder's Renew with SetMetadata")
	if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, Metadata: v3}); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	wantMeta(t, ctx, other, key, owner, v2, "after a Renew without SetMetadata (Metadata set but not SetMetadata)")
	if br, ok := b.(driver.BatchRenewer); ok {
		res, err := br.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: ttl})
		if err != nil || len(res) != 1 || res[0].Err != nil {
			t.Fatalf("RenewBatch = %v, %v", res, err)
		}
		g = res[0].Grant
		wantMeta(t, ctx, other, key, owner, v2, "after RenewBatch")
		res, err = br.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: ttl, Rotate: true})
		if err != nil || len(res) != 1 || res[0].Err != nil {
			t.Fatalf("RenewBatch(Rotate) = %v, %v", res, err)
		}
		g = res[0].Grant
		wantMeta(t, ctx, other, key, owner, v2, "after RenewBatch with Rotate")
	}
	g2, err := b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, Rotate: true})
	if err != nil {
		t.Fatalf("Renew(Rotate): %v", err)
	}
	wantMeta(t, ctx, other, key, owner, v2, "after a rotation")
	if g2.Token != g.Token {
		// The pre-rotation grant is stale: it must not set metadata.
		if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: v3}); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Renew(SetMetadata) with the pre-rotation grant = %v; want ErrNotHeld", err)
		}
		wantMeta(t, ctx, other, key, owner, v2, "after a Renew(SetMetadata) with the pre-rotation grant")
	}
	g = g2
	// A foreign owner's grant, with the holder's token, must not set it.
	forged := driver.Grant{Key: key, Owner: "conformance-" + randHex(), Token: g.Token, Handle: g.Handle}
	if _, err := other.Renew(ctx, forged, driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: v3}); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Renew(SetMetadata) with another owner's grant = %v; want ErrNotHeld", err)
	}
	wantMeta(t, ctx, other, key, owner, v2, "after a Renew(SetMetadata) with another owner's grant")
	// An empty payload set by the holder clears it.
	if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: []byte{}}); err != nil {
		t.Fatalf("holder's Renew(SetMetadata, empty): %v", err)
	}
	wantMeta(t, ctx, other, key, owner, nil, "after the holder's Renew with SetMetadata and an empty payload")
	if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: v1}); err != nil {
		t.Fatalf("holder's Renew(SetMetadata): %v", err)
	}

	// Release drops it with the record; a stale grant after release and
	// re-acquisition by another must not set it; the new holder's retry
	// (an Acquire by the same Owner) replaces it.
	if err := b.Release(ctx, g); err != nil {
		t.Fatalf("Release: %v", err)
	}
	owner2 := "conformance-" + randHex()
	g3, err := other.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner2, TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire by another after Release: %v", err)
	}
	wantMeta(t, ctx, b, key, owner2, nil, "after Release and an Acquire by another without metadata (the released holder's payload must be gone)")
	if g3, err = other.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner2, TTL: ttl, Metadata: v3}); err != nil {
		t.Fatalf("same-owner re-Acquire: %v", err)
	}
	wantMeta(t, ctx, b, key, owner2, v3, "after a same-owner re-Acquire with new metadata")
	if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: v1}); !errors.Is(err, driver.ErrNotHeld) {
		t.Errorf("Renew(SetMetadata) with the released holder's grant = %v; want ErrNotHeld", err)
	}
	wantMeta(t, ctx, b, key, owner2, v3, "after a Renew(SetMetadata) with the released holder's grant")
	if err := other.Release(ctx, g3); err != nil {
		t.Fatalf("Release: %v", err)
	}

	// ForceRelease drops it too.
	if f, ok := other.(driver.ForceReleaser); ok {
		g4, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Metadata: v1})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if _, err := f.ForceRelease(ctx, key); err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
		if _, err := b.Renew(ctx, g4, driver.RenewRequest{TTL: ttl, SetMetadata: true, Metadata: v2}); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Renew(SetMetadata) after ForceRelease = %v; want ErrNotHeld", err)
		}
		g5, err := other.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner2, TTL: ttl})
		if err != nil {
			t.Fatalf("Acquire after ForceRelease: %v", err)
		}
		wantMeta(t, ctx, b, key, owner2, nil, "after ForceRelease and an Acquire without metadata")
		if err := other.Release(ctx, g5); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	// A queued waiter's metadata is the holder's once it is granted.
	if w, ok := other.(driver.Waiter); ok {
		key := s.key(t, "wait")
		ga, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl, Metadata: v1})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		type result struct {
			g   driver.Grant
			err error
		}
		done := make(chan result, 1)
		go func() {
			g, err := w.AcquireWait(ctx, driver.AcquireRequest{Key: key, Owner: owner2, TTL: ttl, Metadata: v2})
			done <- result{g, err}
		}()
		// No store event tells that the waiter has queued: the pause
		// makes the queued path likely. If the release still comes first,
		// the waiter takes a free key, which must carry its metadata all
		// the same; the case is right either way.
		select {
		case r := <-done:
			t.Fatalf("AcquireWait returned while the key was held: %+v, %v", r.g, r.err)
		case <-time.After(100 * time.Millisecond):
		}
		if err := b.Release(ctx, ga); err != nil {
			t.Fatalf("Release: %v", err)
		}
		r := <-done
		if r.err != nil {
			t.Fatalf("AcquireWait: %v", r.err)
		}
		// The engine confirms a waited grant with a Renew.
		gw, err := other.Renew(ctx, r.g, driver.RenewRequest{TTL: ttl})
		if err != nil {
			t.Fatalf("Renew of the waited grant: %v", err)
		}
		wantMeta(t, ctx, b, key, owner2, v2, "after AcquireWait with metadata and its confirming Renew")
		if err := other.Release(ctx, gw); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	checkEmpty(t, ctx, s.client(t), s.prefix+strings.ReplaceAll(t.Name(), "/", ".")+"/")
}

func checkInvalid(t *testing.T, what string, err error) {
	t.Helper()
	var ie *driver.InvalidOptionError
	if !errors.Is(err, driver.ErrInvalidOption) || !errors.As(err, &ie) {
		t.Errorf("%s with %d bytes of metadata = %v (%T); want an *InvalidOptionError (ErrInvalidOption)", what, driver.MaxMetadataLen+1, err, err)
	}
}
