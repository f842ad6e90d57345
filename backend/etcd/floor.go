package etcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
	"github.com/fencelock/fencelock/internal/tokenfloor"
)

// Token floors.
//
// A token is a native token (a mod revision, see docs/backends/etcd.md) plus the offset
// in force at that revision, token(r) = r + off(r), with off the offset
// history of package tokenfloor (which says why tokens stay strictly
// increasing in r, and why a holder's token does not change when the floor
// is raised while it holds). This file keeps what is etcd's own: where the
// history is stored, when a read of it is exact, and the raise.
//
// The history is kept in the floor key (PREFIX + "%floor") as
// tokenfloor.ParseOffsets reads it. RaiseFloor only ever appends a segment,
// with a larger offset, whose start is the floor key's own mod revision W,
// the revision of the write that appended it; no lock entry has revision W
// (the write touches only the floor key), so every revision is on one side
// of it. So the order of tokens is the order of native tokens, and every
// argument in docs/backends/etcd.md about native tokens (per key, strictly
// increasing across holders) holds for tokens unchanged. Renew, Release and
// Inspect map between the two exactly.
//
// RaiseFloor(F), reading the floor key at revision C, with the current
// (last) offset cur and the floor key's own mod revision M:
//
//   - F <= M + cur: nothing is written. Every revision above M has an
//     offset of cur, so a token of at least M+1+cur > F; a grant handed
//     out later whose revision is at or below M is a waiter that queued
//     before M, and AcquireWait re-puts its entry (bump, marker included)
//     when the floor key is newer than the entry, so it too gets a
//     revision above M.
//   - F <= C+1+cur: the floor key is rewritten (compare-and-swap on its
//     mod revision) with the same segments, so its mod revision becomes
//     the write's revision W > C. Every later grant has a revision above
//     W (a waiter older than W is re-put, as above), so at least C+2, and
//     its token is at least C+2+cur > F. No segment is added: a raise to
//     just above the tokens being issued now (a dual backend levelling
//     its lower side, a re-run of a token copy) leaves the offsets alone.
//   - Otherwise the rewrite appends a segment starting at W with the
//     offset NextOffset(F-C-1): at least what the same argument needs,
//     so later tokens are at least C+2+F-C-1 = F+1.
//
// Revisions are far below 2^62, so tokens stay below 2^63.

// floorName is the floor key's name under the prefix. It contains "%f",
// which escape never produces ('%' only before "25" or "2F"), so it is
// never a key's queue or marker.
const floorName = "%floor"

// maxOffset bounds offsets and floors (see tokenfloor.MaxOffset).
const maxOffset = tokenfloor.MaxOffset

// errFloorKey reports a floor key that does not parse: no token can be
// mapped until it is repaired.
var errFloorKey = errors.New("etcd: the token floor key does not parse")

func (b *Backend) floorKey() string { return b.prefix + floorName }

// parseHistory reads the floor key's value (tokenfloor.ParseOffsets),
// whose last segment may start at kv's own mod revision. A nil kv is the
// empty history.
func parseHistory(kv *mvccpb.KeyValue) (tokenfloor.History, error) {
	if kv == nil {
		return tokenfloor.Empty(), nil
	}
	h, ok := tokenfloor.ParseOffsets(string(kv.Value), kv.ModRevision)
	if !ok {
		return tokenfloor.History{}, errFloorKey
	}
	return h, nil
}

// floors caches the history as read at revision at: exact for every
// revision up to at (a later raise starts a segment above at). mod is the
// floor key's mod revision in that read (0: absent).
type floors struct {
	mu  sync.Mutex
	at  int64
	h   tokenfloor.History
	mod int64
}

// observe records the floor key as read at revision at (kv nil: absent).
func (f *floors) observe(at int64, kv *mvccpb.KeyValue) error {
	h, err := parseHistory(kv)
	if err != nil {
		return err
	}
	var mod int64
	if kv != nil {
		mod = kv.ModRevision
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if at > f.at {
		f.at, f.h, f.mod = at, h, mod
	}
	return nil
}

// known returns the cached floor key's mod revision, if there is a cached
// read: what acquire's transaction compares instead of reading the key.
func (f *floors) known() (mod int64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mod, !f.h.IsZero()
}

// held records that the floor key's mod revision was mod at revision at
// (a transaction's compare said so): if the cache is that version of the
// key, it is exact up to at. (A cache that moved on to a newer version
// was read at a revision at or above that version's, which is above at,
// since the key was still at mod then.)
func (f *floors) held(at, mod int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.h.IsZero() && f.mod == mod && at > f.at {
		f.at = at
	}
}

// cached returns the history if it is exact up to revision r.
func (f *floors) cached(r int64) (tokenfloor.History, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.h, !f.h.IsZero() && r <= f.at
}

// readFloor reads the floor key (linearizable) and records it.
func (b *Backend) readFloor(ctx context.Context) (*clientv3.GetResponse, tokenfloor.History, error) {
	resp, err := b.cli.Get(ctx, b.floorKey())
	if err != nil {
		return nil, tokenfloor.History{}, err
	}
	var kv *mvccpb.KeyValue
	if len(resp.Kvs) > 0 {
		kv = resp.Kvs[0]
	}
	if err := b.fl.observe(resp.Header.Revision, kv); err != nil {
		return nil, tokenfloor.History{}, err
	}
	h, _ := parseHistory(kv)
	return resp, h, nil
}

// token maps revision r (at or below a revision already read) to its
// token, reading the floor key if the cache is older than r.
func (b *Backend) token(ctx context.Context, r int64) (driver.Token, error) {
	if r <= 0 {
		return 0, nil
	}
	h, ok := b.fl.cached(r)
	if !ok {
		var err error
		if _, h, err = b.readFloor(ctx); err != nil {
			return 0, err
		}
	}
	return h.Token(r), nil
}

// native maps a token a caller passed in to its revision (0: none maps
// to it, so the grant is not held), reading the floor key if the cache
// may miss its segment.
func (b *Backend) native(ctx context.Context, t driver.Token) (int64, error) {
	// A token from a segment the cache lacks maps, under the cache, to a
	// revision above at.
	if r, ok := b.fl.cachedNative(t); ok {
		return r, nil
	}
	_, h, err := b.readFloor(ctx)
	if err != nil {
		return 0, err
	}
	return h.Native(t), nil
}

// cachedNative maps token t to its revision from the cache alone, if the
// cache holds the segment t is from (as native would without reading).
func (f *floors) cachedNative(t driver.Token) (int64, bool) {
	f.mu.Lock()
	h, at := f.h, f.at
	f.mu.Unlock()
	if h.IsZero() {
		return 0, false
	}
	r := h.Native(t)
	return r, r <= at
}

// nativeGrant returns g with its native token (0 if none maps to it).
func (b *Backend) nativeGrant(ctx context.Context, g driver.Grant) (driver.Grant, error) {
	r, err := b.native(ctx, g.Token)
	g.Token = driver.Token(r)
	return g, err
}

// tokens is the backend's token translation (nativeGrant, token).
func (b *Backend) tokens() backendkit.TokenMap {
	return backendkit.TokenMap{Native: b.nativeGrant, Token: b.token}
}

var _ driver.TokenFloorer = (*Backend)(nil)

// HighWater implements driver.TokenFloorer, in one read of the keys
// under prefix: Keys holds, for each key with entries or a rotation marker,
// the highest token among them; Global is the token of the read's
// revision, above every token ever issued under this prefix (etcd's
// revision counts every write of the cluster, so it is far above most
// keys' marks).
func (b *Backend) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if err := driver.ValidatePrefix(prefix); err != nil {
		return driver.HighWater{}, err
	}
	if b.closed.Load() {
		return driver.HighWater{}, driver.ErrClosed
	}
	resp, err := b.cli.Txn(ctx).Then(
		clientv3.OpGet(b.prefix+escape(prefix), clientv3.WithPrefix()),
		clientv3.OpGet(b.floorKey()),
	).Commit()
	if err != nil {
		return driver.HighWater{}, err
	}
	if err := b.fl.observe(resp.Header.Revision, firstOf(resp, 1)); err != nil {
		return driver.HighWater{}, err
	}
	h, _ := parseHistory(firstOf(resp, 1))
	hw := driver.HighWater{Keys: make(map[string]driver.Token)}
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		k := string(kv.Key)
		key, ok := b.parseEntry(k)
		if !ok {
			// A rotation marker: PREFIX + escape(key).
			rest, _ := strings.CutPrefix(k, b.prefix)
			if key, ok = unescape(rest); !ok || driver.ValidateKey(key) != nil {
				continue
			}
		}
		hw.Keys[key] = max(hw.Keys[key], h.Token(kv.ModRevision))
	}
	hw.Global = h.Token(resp.Header.Revision)
	return hw, nil
}

// RaiseFloor implements driver.TokenFloorer. The offset is one for the
// whole prefix, so raising any key's floor (or "") raises every key's. A
// floor that the tokens issued from now on exceed already changes nothing
// or only rewrites the floor key to move its revision; a higher one
// appends a segment with the offset it needs, compare-and-swap on the
// floor key's mod revision (see the comment at the top of floor.go for
// why every later token is above floor). Floors must be below 2^62.
func (b *Backend) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	if key != "" {
		if err := driver.ValidateKey(key); err != nil {
			return err
		}
	}
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if floor >= maxOffset {
		return &driver.InvalidOptionError{Option: "token floor", Value: strconv.FormatUint(uint64(floor), 10), Reason: "must be below 2^62 on etcd, which keeps room for the revision the offset is added to"}
	}
	f := int64(floor)
	for {
		resp, h, err := b.readFloor(ctx)
		if err != nil {
			return err
		}
		cur := h.Last()
		var mod int64
		if len(resp.Kvs) > 0 {
			mod = resp.Kvs[0].ModRevision
		}
		if f <= mod+cur {
			return nil
		}
		// The current segment's start becomes explicit; a new one starts
		// at this write's revision W > C.
		next := h
		if need := f - resp.Header.Revision - 1; need > cur {
			next = h.Append(0, h.NextOffset(need))
		}
		t, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(b.floorKey()), "=", mod)).
			Then(clientv3.OpPut(b.floorKey(), next.EncodeOffsets()), clientv3.OpGet(b.floorKey())).
			Commit()
		if err != nil {
			return fmt.Errorf("etcd: raising the token floor: %w", err)
		}
		if t.Succeeded {
			return b.fl.observe(t.Header.Revision, firstOf(t, 1))
		}
		// Raised concurrently: read again.
	}
}
