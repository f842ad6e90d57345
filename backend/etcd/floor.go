package etcd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
)

// Token floors.
//
// A token is a native token (a mod revision, see docs/backends/etcd.md) plus the offset
// in force at that revision:
//
//	token(r) = r + off(r)
//
// off is kept in the floor key (PREFIX + "%floor") as a list of segments
// "start offset": off(r) is the offset of the last segment whose start is
// below r. RaiseFloor only ever appends a segment, with a larger offset,
// whose start is the floor key's own mod revision W, the revision of the
// write that appended it; no lock entry has revision W (the write touches
// only the floor key), so every revision is on one side of it. So off never
// decreases as r grows, and token is strictly increasing in r: the order
// of tokens is the order of native tokens, and every argument in docs/backends/etcd.md
// about native tokens (per key, strictly increasing across holders) holds
// for tokens unchanged. The mapping is a function of r alone, whenever
// it is evaluated: a holder's token does not change when the floor is
// raised while it holds, and Renew, Release and Inspect map between the
// two exactly.
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
//     offset F-C-1, exactly what the same argument needs: later tokens
//     are at least C+2+F-C-1 = F+1.
//
// The history is never pruned: a held lock or a waiter may come from any
// segment. While it is shorter than exactSegments, a new offset is what
// the raise needs; from then on, at least twice the previous one (a
// backend may raise more than asked), so there are at most exactSegments
// + 63 segments. Offsets stay at or below 2^62, so tokens stay below 2^63
// (revisions are far below 2^62).

// floorName is the floor key's name under the prefix. It contains "%f",
// which escape never produces ('%' only before "25" or "2F"), so it is
// never a key's queue or marker.
const floorName = "%floor"

// maxOffset bounds offsets and floors: token = revision + offset stays
// below 2^63 while revisions are below 2^62.
const maxOffset = 1 << 62

// exactSegments is how many segments the history may have before a new
// offset must at least double the previous one (see above).
const exactSegments = 64

// errFloorKey reports a floor key that does not parse: no token can be
// mapped until it is repaired.
var errFloorKey = errors.New("etcd: the token floor key does not parse")

func (b *Backend) floorKey() string { return b.prefix + floorName }

// history is the offset function: segment i covers revisions above
// starts[i] (up to starts[i+1]), with offset offs[i]. starts[0] = 0 and
// offs[0] = 0: the revisions before any raise.
type history struct {
	starts, offs []int64
}

// parseHistory reads the floor key's value: lines "start offset", the
// last one with start "-", meaning kv's own mod revision. A nil kv is the
// empty history.
func parseHistory(kv *mvccpb.KeyValue) (history, error) {
	h := history{starts: []int64{0}, offs: []int64{0}}
	if kv == nil || len(strings.TrimSpace(string(kv.Value))) == 0 {
		return h, nil
	}
	lines := strings.Split(strings.TrimSpace(string(kv.Value)), "\n")
	for i, line := range lines {
		s, o, ok := strings.Cut(line, " ")
		if !ok {
			return history{}, errFloorKey
		}
		var start int64
		if s == "-" && i == len(lines)-1 {
			start = kv.ModRevision
		} else {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return history{}, errFloorKey
			}
			start = v
		}
		off, err := strconv.ParseInt(o, 10, 64)
		if err != nil || start <= h.starts[len(h.starts)-1] || off <= h.offs[len(h.offs)-1] || off > maxOffset {
			return history{}, errFloorKey
		}
		h.starts = append(h.starts, start)
		h.offs = append(h.offs, off)
	}
	return h, nil
}

// encode writes h; a last segment with start 0 is written "-": it starts
// at the revision of the write.
func (h history) encode() string {
	var sb strings.Builder
	for i := 1; i < len(h.starts); i++ {
		if i == len(h.starts)-1 && h.starts[i] == 0 {
			sb.WriteString("-")
		} else {
			sb.WriteString(strconv.FormatInt(h.starts[i], 10))
		}
		sb.WriteByte(' ')
		sb.WriteString(strconv.FormatInt(h.offs[i], 10))
		sb.WriteByte('\n')
	}
	return sb.String()
}

func (h history) last() int64 { return h.offs[len(h.offs)-1] }

// off returns the offset in force at revision r.
func (h history) off(r int64) int64 {
	i := len(h.starts) - 1
	for i > 0 && h.starts[i] >= r {
		i--
	}
	return h.offs[i]
}

// native maps a token back to its revision, or 0 if no revision maps to
// it. token is strictly increasing, so at most one segment matches.
func (h history) native(t driver.Token) int64 {
	if t == 0 || t > math.MaxInt64 {
		return 0
	}
	for i := len(h.starts) - 1; i >= 0; i-- {
		r := int64(t) - h.offs[i]
		if r > h.starts[i] && (i == len(h.starts)-1 || r <= h.starts[i+1]) {
			return r
		}
	}
	return 0
}

// floors caches the history as read at revision at: exact for every
// revision up to at (a later raise starts a segment above at). mod is the
// floor key's mod revision in that read (0: absent).
type floors struct {
	mu  sync.Mutex
	at  int64
	h   history
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
	return f.mod, f.h.starts != nil
}

// held records that the floor key's mod revision was mod at revision at
// (a transaction's compare said so): if the cache is that version of the
// key, it is exact up to at. (A cache that moved on to a newer version
// was read at a revision at or above that version's, which is above at,
// since the key was still at mod then.)
func (f *floors) held(at, mod int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.h.starts != nil && f.mod == mod && at > f.at {
		f.at = at
	}
}

// cached returns the history if it is exact up to revision r.
func (f *floors) cached(r int64) (history, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.h, f.h.starts != nil && r <= f.at
}

// readFloor reads the floor key (linearizable) and records it.
func (b *Backend) readFloor(ctx context.Context) (*clientv3.GetResponse, history, error) {
	resp, err := b.cli.Get(ctx, b.floorKey())
	if err != nil {
		return nil, history{}, err
	}
	var kv *mvccpb.KeyValue
	if len(resp.Kvs) > 0 {
		kv = resp.Kvs[0]
	}
	if err := b.fl.observe(resp.Header.Revision, kv); err != nil {
		return nil, history{}, err
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
	return driver.Token(r + h.off(r)), nil
}

// native maps a token a caller passed in to its revision (0: none maps
// to it, so the grant is not held), reading the floor key if the cache
// may miss its segment.
func (b *Backend) native(ctx context.Context, t driver.Token) (int64, error) {
	f := &b.fl
	f.mu.Lock()
	h, at := f.h, f.at
	f.mu.Unlock()
	if h.starts != nil {
		// A token from a segment the cache lacks maps, under the cache,
		// to a revision above at.
		if r := h.native(t); r <= at {
			return r, nil
		}
	}
	_, h, err := b.readFloor(ctx)
	if err != nil {
		return 0, err
	}
	return h.native(t), nil
}

// nativeGrant returns g with its native token (0 if none maps to it).
func (b *Backend) nativeGrant(ctx context.Context, g driver.Grant) (driver.Grant, error) {
	r, err := b.native(ctx, g.Token)
	g.Token = driver.Token(r)
	return g, err
}

// tokenInfo maps info's token.
func (b *Backend) tokenInfo(ctx context.Context, info driver.Info) (driver.Info, error) {
	t, err := b.token(ctx, int64(info.Token))
	info.Token = t
	return info, err
}

// tokenErr maps the holder's token in a *driver.HeldError.
func (b *Backend) tokenErr(ctx context.Context, err error) error {
	var held *driver.HeldError
	if errors.As(err, &held) && held.Holder.Token != 0 {
		info, terr := b.tokenInfo(ctx, held.Holder)
		if terr != nil {
			return terr
		}
		held.Holder = info
	}
	return err
}

var _ driver.TokenFloorer = (*Backend)(nil)

// Acquire implements driver.Backend (see acquire); the token offset is
// the cached one, checked in the acquiring transaction itself.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := b.acquire(ctx, req)
	if err != nil {
		return driver.Grant{}, b.tokenErr(ctx, err)
	}
	g.Token, err = b.token(ctx, int64(g.Token))
	if err != nil {
		return driver.Grant{}, err
	}
	return g, nil
}

// AcquireWait implements driver.Waiter (see acquireWait). If the floor was
// raised after the waiter queued, its entry is re-put (bump) before the
// grant is returned, so that its token is above the floor.
func (b *Backend) AcquireWait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := b.acquireWait(ctx, req)
	if err != nil {
		return driver.Grant{}, b.tokenErr(ctx, err)
	}
	resp, _, err := b.readFloor(ctx)
	if err == nil && len(resp.Kvs) > 0 && resp.Kvs[0].ModRevision > int64(g.Token) {
		var tok driver.Token
		name, _ := handleName(g.Handle) // acquireWait's grants carry it
		if tok, err = b.bump(ctx, req.Key, b.queuePrefix(req.Key)+name, entryValue(req.Owner, req.Metadata), int64(g.Token)); err == nil {
			g.Token = tok
		}
	}
	if err == nil {
		g.Token, err = b.token(ctx, int64(g.Token))
	}
	if err != nil {
		// Leave no entry behind (as acquireWait does on failure).
		cctx, cancel := context.WithTimeout(context.Background(), b.cleanupTimeout)
		_ = b.release(cctx, g)
		cancel()
		return driver.Grant{}, err
	}
	return g, nil
}

// Renew implements driver.Backend (see renew).
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	return b.tokens().Renew(ctx, g, req, b.renew)
}

// RenewBatch implements driver.BatchRenewer (see renewBatch).
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	return b.tokens().RenewBatch(ctx, grants, req, b.renewBatch)
}

// tokens is the backend's token translation (nativeGrant, token).
func (b *Backend) tokens() backendkit.TokenMap {
	return backendkit.TokenMap{Native: b.nativeGrant, Token: b.token}
}

// Release implements driver.Backend (see release).
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	n, err := b.nativeGrant(ctx, g)
	if err != nil {
		return err
	}
	return b.release(ctx, n)
}

// NotifyLoss implements driver.LossNotifier (see notifyLoss). A token
// that no revision maps to is reported lost at once.
func (b *Backend) NotifyLoss(g driver.Grant, lost func(cause error)) (stop func()) {
	ctx, cancel := context.WithTimeout(b.ctx, b.cleanupTimeout)
	n, err := b.nativeGrant(ctx, g)
	cancel()
	if err == nil && n.Token == 0 && g.Token != 0 {
		err = driver.ErrNotHeld
	}
	if err != nil {
		var once sync.Once
		t := time.AfterFunc(0, func() { once.Do(func() { lost(err) }) })
		return func() { t.Stop(); once.Do(func() {}) }
	}
	return b.notifyLoss(n, lost)
}

// Inspect implements driver.Backend (see inspect).
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	info, err := b.inspect(ctx, key)
	if err != nil {
		return driver.Info{}, err
	}
	return b.tokenInfo(ctx, info)
}

// List implements driver.Backend (see list).
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	infos, err := b.list(ctx, prefix)
	if err != nil {
		return nil, err
	}
	for i := range infos {
		if infos[i], err = b.tokenInfo(ctx, infos[i]); err != nil {
			return nil, err
		}
	}
	return infos, nil
}

// ForceRelease implements driver.ForceReleaser (see forceRelease).
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	info, err := b.forceRelease(ctx, key)
	if err != nil {
		return driver.Info{}, err
	}
	return b.tokenInfo(ctx, info)
}

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
		hw.Keys[key] = max(hw.Keys[key], driver.Token(kv.ModRevision+h.off(kv.ModRevision)))
	}
	hw.Global = driver.Token(resp.Header.Revision + h.off(resp.Header.Revision))
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
		cur := h.last()
		var mod int64
		if len(resp.Kvs) > 0 {
			mod = resp.Kvs[0].ModRevision
		}
		if f <= mod+cur {
			return nil
		}
		// The current segment's start becomes explicit; a new one starts
		// at this write's revision W > C.
		next := history{starts: append([]int64(nil), h.starts...), offs: append([]int64(nil), h.offs...)}
		if need := f - resp.Header.Revision - 1; need > cur {
			off := need
			if len(h.starts) >= exactSegments {
				off = max(off, 2*cur)
			}
			next.starts = append(next.starts, 0)
			next.offs = append(next.offs, min(off, maxOffset))
		}
		t, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(b.floorKey()), "=", mod)).
			Then(clientv3.OpPut(b.floorKey(), next.encode()), clientv3.OpGet(b.floorKey())).
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
