package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
	"github.com/fencelock/fencelock/internal/tokenfloor"
)

// Token floors.
//
// A token is a native token (a zxid of the holder's znode, see docs/backends/zookeeper.md)
// plus the offset in force at that zxid, token(z) = z + off(z), with off
// the offset history of package tokenfloor (which says why tokens stay
// strictly increasing in z, and why a holder's token does not change when
// the floor is raised while it holds). This file keeps what is
// ZooKeeper's own: where the history is stored, when a read of it is
// exact, the hand-off of grants decided before a raise, and the raise.
//
// The history is kept in the floor znode (ROOT/%floor) as
// tokenfloor.ParseFloor reads it. RaiseFloor only ever appends a segment,
// whose start is the zxid W of the write that appends it (written "-" and
// resolved from the znode's mzxid), with a version-checked Set; that write
// touches only the floor znode, so no lock znode has zxid W and every zxid
// is on one side of it. So the order of tokens is the order of zxids, and
// every argument in docs/backends/zookeeper.md about native tokens (per
// key, strictly increasing across holders) holds for tokens unchanged.
// Renew, Release, Inspect and NotifyLoss map between the two exactly.
//
// The last segment stores the floor asked for, "- F", and its offset is
// resolved when the znode is read: NextOffset(F - W), at least the
// previous offset (twice it once the history is long), at most 2^62. So
// every zxid z > W has z + off(z) > F, with no slack wasted on a guess of
// W: a raise to just above the tokens being issued now (a dual backend
// levelling its lower side, a re-run of a token copy) finds F - W at or
// below the previous offset and changes no offset, and a higher one gets
// exactly the offset it needs. A later raise writes that segment out with
// its start and offset ("W off"), dropping it if its offset is the
// previous one, so the list stays at most tokenfloor.ExactSegments + 63
// lines.
//
// RaiseFloor(F) writes nothing if F <= M + cur, M the floor znode's mzxid
// and cur the last offset: every zxid above M has a token of at least
// M+1+cur > F, and a grant whose zxid is at or below M handed out later
// rewrites its znode (below).
//
// Which offset a grant gets:
//
//   - Acquire and AcquireWait create their znode in a multi transaction
//     that also checks the floor znode's version (enqueue): if it commits
//     at zxid z, the floor read before is the one in force at z. If the
//     floor moved, the multi fails as a whole and is sent again.
//   - A grant whose zxid was decided earlier than it is handed out (a
//     waiter that reaches the head, Acquire finding the holder gone after
//     joining the queue) first syncs its server with the leader and reads
//     the floor znode; if the floor was written after its zxid (mzxid
//     above it), it rewrites its own znode (as a rotation does, marking
//     the key znode) for a zxid above W. A waiter granted before the raise
//     keeps its token like any holder.
//   - Every other zxid (a rotation, a holder another client reports) is
//     mapped with the floor as read after that zxid was seen on this
//     session: ZooKeeper serves a session's requests in order, on a
//     server at least as recent as anything the session has seen, so
//     that read has every segment that starts below z. The cache below
//     records up to which zxid the last read is exact.
//
// Range: floors must be below 2^62 and offsets stay at or below 2^62;
// zxids carry the leader epoch in their upper 32 bits and stay below 2^62
// while the epoch is below 2^30 (a zxid at or above it is an error, never
// a wrapped token), so tokens stay below 2^63.

// floorName is the floor znode's name under the root. It is not a name
// escapeKey produces ("%fl" is not an escape), so it is never a key's
// znode, and List skips it.
const floorName = "%floor"

// maxOffset bounds offsets, floors and zxids (see tokenfloor.MaxOffset).
const maxOffset = tokenfloor.MaxOffset

// Errors of token floors.
var (
	// errFloorZnode reports a floor znode that does not parse: no token
	// can be mapped until it is repaired.
	errFloorZnode = errors.New("zookeeper: the token floor znode does not parse")
	// errZxidRange reports a zxid at or above 2^62 (a leader epoch at or
	// above 2^30): no offset could be added without overflow.
	errZxidRange = errors.New("zookeeper: zxid at or above 2^62: no room for the token offset")
)

func (b *Backend) floorPath() string { return path.Join(b.root, floorName) }

// parseHistory reads the floor znode's data (tokenfloor.ParseFloor),
// whose mzxid is mzxid.
func parseHistory(data []byte, mzxid int64) (tokenfloor.History, error) {
	h, _, ok := tokenfloor.ParseFloor(string(data), mzxid)
	if !ok {
		return tokenfloor.History{}, errFloorZnode
	}
	return h, nil
}

// floorSnap is the floor znode as read: its history, data version and
// mzxid.
type floorSnap struct {
	h       tokenfloor.History
	version int32
	mzxid   int64
}

// floors caches the last floor read, exact for every zxid up to at (every
// segment that starts below at is in it).
type floors struct {
	mu    sync.Mutex
	known bool
	s     floorSnap
	at    int64
}

// observe records s as exact up to zxid at. A snapshot with a newer mzxid
// holds every segment of an older one (segments are only appended), so it
// is exact wherever the older one was.
func (f *floors) observe(s floorSnap, at int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !f.known || s.mzxid > f.s.mzxid:
		f.known, f.s, f.at = true, s, max(f.at, at)
	case s.mzxid == f.s.mzxid:
		f.at = max(f.at, at)
	}
}

func (f *floors) get() (floorSnap, int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s, f.at, f.known
}

// floorState returns the cached floor, reading it first if there is none.
func (b *Backend) floorState(ctx context.Context) (floorSnap, error) {
	if s, _, ok := b.fl.get(); ok {
		return s, nil
	}
	return b.readFloor(ctx, 0)
}

// floorCheck is the operation enqueue adds to its multi transaction.
func (b *Backend) floorCheck(s floorSnap) *zk.CheckVersionRequest {
	return &zk.CheckVersionRequest{Path: b.floorPath(), Version: s.version}
}

// floorMoved reports whether a failed enqueue multi failed at its floor
// check (ZooKeeper answers OK for the operations before the one that
// failed).
func floorMoved(res []zk.MultiResponse) bool {
	return len(res) == 3 && res[0].Error == nil && res[1].Error == nil &&
		(errors.Is(res[2].Error, zk.ErrBadVersion) || errors.Is(res[2].Error, zk.ErrNoNode))
}

// readFloor reads the floor znode, creating it empty if missing, and
// records it as exact up to after (a zxid this session saw before the
// read) and its own mzxid.
func (b *Backend) readFloor(ctx context.Context, after int64) (floorSnap, error) {
	p := b.floorPath()
	for range 5 {
		data, st, err := b.conn.Get(ctx, p)
		if errors.Is(err, zk.ErrNoNode) {
			if err := b.createFloor(ctx); err != nil {
				return floorSnap{}, err
			}
			continue
		}
		if err != nil {
			return floorSnap{}, err
		}
		h, err := parseHistory(data, st.Mzxid)
		if err != nil {
			return floorSnap{}, err
		}
		s := floorSnap{h: h, version: st.Version, mzxid: st.Mzxid}
		b.fl.observe(s, max(after, st.Mzxid))
		return s, nil
	}
	return floorSnap{}, errors.New("zookeeper: the token floor znode kept vanishing")
}

func (b *Backend) createFloor(ctx context.Context) error {
	_, err := b.conn.Create(ctx, b.floorPath(), nil, zk.FlagPersistent, b.acl)
	if errors.Is(err, zk.ErrNoNode) {
		if err := b.ensurePath(ctx, b.root); err != nil {
			return err
		}
		_, err = b.conn.Create(ctx, b.floorPath(), nil, zk.FlagPersistent, b.acl)
	}
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("zookeeper: creating the token floor znode: %w", err)
	}
	return nil
}

// token maps zxid z, seen on this session, to its token.
func (b *Backend) token(ctx context.Context, z int64) (driver.Token, error) {
	if z == 0 {
		return 0, nil
	}
	if z < 0 || z >= maxOffset {
		return 0, errZxidRange
	}
	s, at, ok := b.fl.get()
	if !ok || z > at {
		var err error
		if s, err = b.readFloor(ctx, z); err != nil {
			return 0, err
		}
	}
	return s.h.Token(z), nil
}

// native maps token t back to its zxid (0 if none maps to it).
func (b *Backend) native(ctx context.Context, t driver.Token) (int64, error) {
	if s, at, ok := b.fl.get(); ok {
		// A token from a segment the cache lacks maps, under the cache,
		// to a zxid above at, or to none.
		if z := s.h.Native(t); z != 0 && z <= at {
			return z, nil
		}
	}
	s, err := b.readFloor(ctx, 0)
	if err != nil {
		return 0, err
	}
	return s.h.Native(t), nil
}

// nativeGrant returns g with its zxid for a token. A grant with a handle
// carries its zxid there; if the token is not that zxid's, the result has
// token 0, which nothing holds.
func (b *Backend) nativeGrant(ctx context.Context, g driver.Grant) (driver.Grant, error) {
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	if h, ok := parseHandle(g.Handle); ok {
		t, err := b.token(ctx, h.token)
		if err != nil {
			return driver.Grant{}, err
		}
		if t == g.Token {
			g.Token = driver.Token(h.token)
		} else {
			g.Token = 0
		}
		return g, nil
	}
	z, err := b.native(ctx, g.Token)
	g.Token = driver.Token(z)
	return g, err
}

// handOff applies the floor to a grant whose zxid was decided before it
// is handed out: it syncs the server with the leader (so a raise that
// returned to anyone is seen) and reads the floor znode; if the floor was
// written after the grant's zxid, the grant's znode is rewritten
// (markedSet, as a rotation) for a zxid above that write. It returns the
// grant on native tokens. synced, if not nil, waits for a sync sent since
// the grant's zxid was decided (startSync).
func (b *Backend) handOff(ctx context.Context, g driver.Grant, synced func() error) (driver.Grant, error) {
	h, ok := parseHandle(g.Handle)
	if !ok {
		if synced != nil {
			_ = synced()
		}
		return driver.Grant{}, errors.New("zookeeper: malformed handle")
	}
	if synced == nil {
		synced = b.startSync(ctx)
	}
	if err := synced(); err != nil {
		return driver.Grant{}, err
	}
	s, err := b.readFloor(ctx, h.token)
	if err != nil {
		return driver.Grant{}, err
	}
	if s.mzxid <= h.token {
		return g, nil
	}
	st, err := b.keptSet(ctx, h.path, h.version)
	if err != nil {
		return driver.Grant{}, err
	}
	return b.grant(g.Key, g.Owner, h.path, st.Version, st.Mzxid), nil
}

// acquiredLate is handOff for acquire, which found itself first in the
// queue after joining it: on failure its znode is deleted and a znode that
// went or changed is reported as a held key. ctx bounds it, and so does
// floorTimeout.
func (b *Backend) acquiredLate(ctx context.Context, g driver.Grant, err error) (driver.Grant, error) {
	if err != nil {
		return driver.Grant{}, err
	}
	hctx, cancel := context.WithTimeout(ctx, b.floorTimeout())
	defer cancel()
	ng, err := b.handOff(hctx, g, nil)
	if err != nil {
		if h, ok := parseHandle(g.Handle); ok {
			b.deleteOwn(ctx, h.path)
		}
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: g.Key}}
		}
		return driver.Grant{}, err
	}
	return ng, nil
}

// confirmedLate is handOff for confirm, the first Renew of a waiter's
// grant: a znode that went or changed is no longer held. synced waits for
// the sync started before confirm's read (the two go out together). ctx
// bounds it, and so does floorTimeout.
func (b *Backend) confirmedLate(ctx context.Context, synced func() error, g driver.Grant, err error) (driver.Grant, error) {
	if err != nil {
		_ = synced()
		return driver.Grant{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.floorTimeout())
	defer cancel()
	ng, err := b.handOff(ctx, g, synced)
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		return driver.Grant{}, driver.ErrNotHeld
	}
	return ng, err
}

// startSync sends a sync of the root to the server and returns a function
// that waits for its reply. The sync goes out at once, pipelined with the
// caller's next request; the goroutine ends when the sync's reply comes or
// ctx ends (see call), and the caller always waits for it.
func (b *Backend) startSync(ctx context.Context) (wait func() error) {
	done := make(chan error, 1)
	go func() {
		_, err := b.conn.Sync(ctx, b.root)
		done <- err
	}()
	return func() error { return <-done }
}

// floorTimeout bounds the floor reads of a hand-off, besides the caller's
// context.
func (b *Backend) floorTimeout() time.Duration { return max(b.SessionTimeout(), 10*time.Second) }

// tokens is the backend's token translation (nativeGrant, token).
func (b *Backend) tokens() backendkit.TokenMap {
	return backendkit.TokenMap{Native: b.nativeGrant, Token: b.token}
}

var _ driver.TokenFloorer = (*Backend)(nil)

// HighWater implements driver.TokenFloorer. Keys holds, for each key
// znode under the root whose key starts with prefix, the highest token
// issued while it existed: the largest of its mzxid (every contender's
// transaction writes it), its pzxid (the last contender znode created or
// deleted, so a rotated holder that left is covered) and its holder's
// mzxid (a rotation). A key znode the server has removed (an empty
// container) is absent. Global is the token of a write made after those
// reads, above every token ever issued under the root: HighWater rewrites
// the floor znode with the same offsets (every segment's start written
// out), for its zxid. That write is the only change HighWater makes: the
// offsets stay, though waiters that queued before it rewrite their znode
// when granted, as after a raise.
func (b *Backend) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if err := driver.ValidatePrefix(prefix); err != nil {
		return driver.HighWater{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.HighWater{}, err
	}
	marks, err := b.keyMarks(ctx, prefix)
	if err != nil {
		return driver.HighWater{}, err
	}
	s, err := b.writeFloor(ctx, 0)
	if err != nil {
		return driver.HighWater{}, err
	}
	// s is exact up to its own write, which follows every mark.
	hw := driver.HighWater{Keys: make(map[string]driver.Token, len(marks))}
	for k, z := range marks {
		if z >= maxOffset {
			return driver.HighWater{}, errZxidRange
		}
		hw.Keys[k] = s.h.Token(z)
	}
	hw.Global = s.h.Token(s.mzxid)
	return hw, nil
}

// keyMarks reads, for each key znode under the root whose key starts with
// prefix, the highest zxid that may be a token of it (see HighWater), up
// to 16 keys at a time.
func (b *Backend) keyMarks(ctx context.Context, prefix string) (map[string]int64, error) {
	names, _, err := b.conn.Children(ctx, b.root)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, n := range names {
		if k, ok := unescapeKey(n); ok && strings.HasPrefix(k, prefix) && driver.ValidateKey(k) == nil {
			keys = append(keys, k)
		}
	}
	marks := make(map[string]int64, len(keys))
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, 16)
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			z, err := b.keyMark(ctx, b.parent(k))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				first = cmpOr(first, err)
			case z > 0:
				marks[k] = z
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return nil, first
	}
	return marks, nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// keyMark is the highest zxid that may be a token of the key znode parent
// (0 if it is gone): its mzxid and pzxid, and its holder's mzxid.
func (b *Backend) keyMark(ctx context.Context, parent string) (int64, error) {
	for range 5 {
		names, pst, err := b.conn.Children(ctx, parent)
		if errors.Is(err, zk.ErrNoNode) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		z := max(pst.Mzxid, pst.Pzxid)
		cs := sortChildren(names)
		if len(cs) == 0 {
			return z, nil
		}
		_, st, err := b.conn.Get(ctx, parent+"/"+cs[0].name)
		if errors.Is(err, zk.ErrNoNode) {
			continue // it just went (pzxid moved): read again
		}
		if err != nil {
			return 0, err
		}
		return max(z, st.Mzxid), nil
	}
	return 0, errors.New("zookeeper: the lock's queue kept changing while being read")
}

// RaiseFloor implements driver.TokenFloorer. The offset is one for the
// whole root, so raising any key's floor (or "") raises every key's: the
// floor znode is rewritten, version-checked (read again after a
// concurrent raise), with a new last segment "- floor" whose offset is
// floor minus the zxid of that write if that is above the previous
// offset, else the previous offset (no offset changes; the write only
// moves the znode's mzxid, for waiters that queued before it): see the
// comment at the top of floor.go for why every later token is above
// floor. A floor at or below the znode's mzxid plus the current offset
// writes nothing. Floors must be below 2^62.
func (b *Backend) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	if key != "" {
		if err := driver.ValidateKey(key); err != nil {
			return err
		}
	}
	if err := b.check(ctx); err != nil {
		return err
	}
	if floor >= maxOffset {
		return &driver.InvalidOptionError{Option: "token floor", Value: strconv.FormatUint(uint64(floor), 10), Reason: "must be below 2^62 on ZooKeeper, which keeps room for the zxid the offset is added to"}
	}
	if floor == 0 {
		return nil
	}
	_, err := b.writeFloor(ctx, int64(floor))
	return err
}

// writeFloor rewrites the floor znode, version-checked, with its segments
// written out and, if floor is not zero, a new last segment "- floor"; it
// writes nothing if floor is not zero and at or below the znode's mzxid
// plus the current offset (then the snapshot returned is the one read). It returns the floor as
// written, exact up to the write's zxid.
func (b *Backend) writeFloor(ctx context.Context, floor int64) (floorSnap, error) {
	for {
		if err := ctx.Err(); err != nil {
			return floorSnap{}, err
		}
		s, err := b.readFloor(ctx, 0)
		if err != nil {
			return floorSnap{}, err
		}
		if floor > 0 && floor <= s.mzxid+s.h.Last() {
			return s, nil
		}
		data := s.h.EncodeFloor(floor)
		st, err := b.conn.Set(ctx, b.floorPath(), []byte(data), s.version)
		switch {
		case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode):
			continue // raised (or removed) concurrently: read again
		case err != nil:
			return floorSnap{}, fmt.Errorf("zookeeper: writing the token floor: %w", err)
		}
		h, err := parseHistory([]byte(data), st.Mzxid)
		if err != nil {
			return floorSnap{}, err
		}
		ns := floorSnap{h: h, version: st.Version, mzxid: st.Mzxid}
		b.fl.observe(ns, st.Mzxid)
		return ns, nil
	}
}
