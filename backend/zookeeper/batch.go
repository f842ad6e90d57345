package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

// maxBatch bounds the operations of one multi (ZooKeeper rejects requests
// above jute.maxbuffer, 1 MB by default).
const maxBatch = 1000

// maxPipelined bounds the renewal reads of one batch in flight at once.
const maxPipelined = 128

var _ driver.BatchRenewer = (*Backend)(nil)

// RenewBatch implements driver.BatchRenewer (see renewBatch).
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	return b.tokens().RenewBatch(ctx, grants, req, b.renewBatch)
}

// renewBatch is RenewBatch (floor.go) on native tokens. Without Rotate, on a
// connection Open made, one read renews every grant whose loss watch is
// armed: the reply proves the session alive, and ZooKeeper delivers a
// watch event before the reply to any later request, so a watch that saw
// no event proves the znode unchanged. The other grants' renewal reads (see
// Renew) are sent at once, pipelined on the session. Renewals never write,
// so they never wait for the transaction log's fsync. With Rotate, one multi transaction rewrites every
// grant's znode, version-checked, and each new mzxid is that grant's token;
// a multi fails as a whole at its first failing operation, so that grant
// gets ErrNotHeld and the rest are sent again.
func (b *Backend) renewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	// The engine gives a batch the earliest local-validity deadline of its
	// leases; one lease at its deadline must not fail the renewal of all
	// the others, so only cancellation stops a batch. (An answer after a
	// lease's deadline is harmless: the engine dates every renewal from
	// when it was sent, ignores leases that have already ended, and ends
	// a lease whose answer came after its local validity.)
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil, ctx.Err()
	}
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	ctx, cancel := b.batchContext(ctx)
	defer cancel()
	if err := b.sweep(ctx); err != nil {
		return nil, err
	}
	out := make([]driver.RenewResult, len(grants))
	if !req.Rotate {
		b.renewEach(ctx, grants, req, b.renewWatched(ctx, grants, out), out)
		return out, nil
	}
	if err := b.rotateBatch(ctx, grants, req, out); err != nil {
		return nil, err
	}
	return out, nil
}

// batchContext bounds the requests of a batch: ctx's deadline does not
// end them (see renewBatch) but its cancellation does, and so does the
// later of that deadline and a session timeout from now, after which
// every lease of the session that the server has not answered for is
// lost anyway.
func (b *Backend) batchContext(ctx context.Context) (context.Context, context.CancelFunc) {
	by := time.Now().Add(max(b.SessionTimeout(), time.Second))
	if d, ok := ctx.Deadline(); ok && d.After(by) {
		by = d
	}
	bctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), by)
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})
	return bctx, func() { stop(); cancel() }
}

// renewEach renews the grants at the indexes idx one by one with renew,
// pipelined on the session, filling out.
func (b *Backend) renewEach(ctx context.Context, grants []driver.Grant, req driver.RenewRequest, idx []int, out []driver.RenewResult) {
	rctx := ctx // a batchContext
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxPipelined)
	for _, i := range idx {
		g := grants[i]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i].Grant, out[i].Err = b.renew(rctx, g, req)
		}()
	}
	wg.Wait()
}

// rotateItem is a grant of a rotating batch: its index, its handle, and
// its znode's data as read (see readData).
type rotateItem struct {
	i    int
	h    handle
	data []byte
}

// rotateBatch is RenewBatch with Rotate: the grants' znodes are read
// (pipelined: the rewrite must keep each znode's data, owner and metadata),
// then rewritten by multi transactions of up to maxBatch version-checked
// writes, each sent again without the grant it failed at.
func (b *Backend) rotateBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest, out []driver.RenewResult) error {
	var items []rotateItem
	for i, g := range grants {
		h, ok := parseHandle(g.Handle)
		switch {
		case g.Handle == "" || ok && (h.unconfirmed || b.isRotating(h.path)):
			// Rare shapes: the single-grant path handles them.
			out[i].Grant, out[i].Err = b.renew(ctx, g, req)
		case !ok || h.tag != ownerTag(g.Owner) || h.token != int64(g.Token):
			out[i].Err = driver.ErrNotHeld
		default:
			items = append(items, rotateItem{i: i, h: h})
		}
	}
	items = b.readData(ctx, items, out)
	for len(items) > 0 {
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err()
		}
		chunk := items[:min(len(items), maxBatch)]
		bad, err := b.rotateChunk(ctx, grants, chunk, out)
		switch {
		case err != nil:
			return err
		case bad < 0:
			items = items[len(chunk):]
		default:
			out[chunk[bad].i].Err = driver.ErrNotHeld
			items = append(items[:bad:bad], items[bad+1:]...)
		}
	}
	return nil
}

// readData reads the data of every item's znode, pipelined on the session,
// and returns the items still to rotate: a znode that is gone, changed
// (another version) or not this session's gets ErrNotHeld in out, a read
// that failed its error.
func (b *Backend) readData(ctx context.Context, items []rotateItem, out []driver.RenewResult) []rotateItem {
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxPipelined)
	sid := b.conn.SessionID()
	for j := range items {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			data, st, err := b.conn.Get(ctx, items[j].h.path)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				errs[j] = driver.ErrNotHeld
			case err != nil:
				errs[j] = err
			case st.Version != items[j].h.version || st.Mzxid != items[j].h.token || st.EphemeralOwner != sid:
				errs[j] = driver.ErrNotHeld
			default:
				items[j].data = data
			}
		}()
	}
	wg.Wait()
	kept := items[:0]
	for j, it := range items {
		if errs[j] != nil {
			out[it.i].Err = errs[j]
			continue
		}
		kept = append(kept, it)
	}
	return kept
}

// rotateChunk rewrites the znodes of chunk in one multi transaction, marks
// their key znodes (see markedSet) and fills out for each. If the multi
// failed as a whole at a grant whose znode is gone or changed, it fills
// nothing and returns that grant's index in chunk; otherwise bad is -1.
func (b *Backend) rotateChunk(ctx context.Context, grants []driver.Grant, chunk []rotateItem, out []driver.RenewResult) (bad int, err error) {
	ops := make([]any, len(chunk))
	for j, it := range chunk {
		ops[j] = &zk.SetDataRequest{Path: it.h.path, Data: it.data, Version: it.h.version}
		b.setRotating(it.h.path, it.h.version)
	}
	res, err := b.conn.Multi(ctx, nil, ops...)
	if err != nil && definiteZK(err) {
		for _, it := range chunk {
			b.clearRotating(it.h.path)
		}
	}
	switch {
	case err == nil:
		if len(res) != len(chunk) {
			return -1, errors.New("zookeeper: malformed multi response")
		}
		marks := b.markParents(ctx, chunk)
		for j, it := range chunk {
			g := grants[it.i]
			if err := marks[path.Dir(it.h.path)]; err != nil || res[j].Stat == nil {
				out[it.i].Err = errors.Join(err, errors.New("zookeeper: rotation not confirmed")) // Renew finishes it (b.rotating)
				continue
			}
			b.clearRotating(it.h.path)
			out[it.i].Grant = b.grant(g.Key, g.Owner, it.h.path, res[j].Stat.Version, res[j].Stat.Mzxid)
		}
		return -1, nil
	case errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion):
		for j, r := range res {
			if r.Error != nil {
				if j < len(chunk) {
					return j, nil
				}
				break
			}
		}
	}
	return -1, err
}

// markParents bumps the ACL version of the key znode of every grant in
// chunk (see markedSet), pipelined, and returns each key znode's error.
func (b *Backend) markParents(ctx context.Context, chunk []rotateItem) map[string]error {
	marks := map[string]error{}
	var parents []string
	for _, it := range chunk {
		p := path.Dir(it.h.path)
		if _, dup := marks[p]; !dup {
			marks[p] = nil
			parents = append(parents, p)
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxPipelined)
	for _, parent := range parents {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := b.conn.SetACL(ctx, parent, b.acl, -1)
			mu.Lock()
			marks[parent] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return marks
}

func (b *Backend) isRotating(p string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.rotating[p]
	return ok
}

// renewWatched renews in one read the grants whose znode has an armed,
// event-free watch (see RenewBatch), filling out; it returns the indexes of
// the grants left to renew one by one.
func (b *Backend) renewWatched(ctx context.Context, grants []driver.Grant, out []driver.RenewResult) (slow []int) {
	type cand struct {
		i      int
		h      handle
		w      *nodeWatch
		events int
	}
	var fast []cand
	b.mu.Lock()
	for i, g := range grants {
		h, ok := parseHandle(g.Handle)
		var w *nodeWatch
		if ok && b.evented && !h.unconfirmed && h.tag == ownerTag(g.Owner) && h.token == int64(g.Token) {
			w = b.watched[h.path]
		}
		if w == nil || !w.armed || w.version != h.version || w.mzxid != h.token {
			slow = append(slow, i)
			continue
		}
		fast = append(fast, cand{i, h, w, w.events})
	}
	b.mu.Unlock()
	if len(fast) == 0 {
		return slow
	}
	synced := b.startSync(ctx) // the leader's confirmation (confirmedTTL)
	_, _, err := b.conn.Exists(ctx, b.root)
	if serr := synced(); err == nil && serr != nil {
		err = fmt.Errorf("zookeeper: renew: the server could not confirm the session with its leader (sync): %w", serr)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range fast {
		switch {
		case err != nil:
			out[c.i].Err = err
		case c.w.events != c.events || b.watched[c.h.path] != c.w:
			slow = append(slow, c.i) // something happened: ask the znode itself
		default:
			g := grants[c.i]
			out[c.i].Grant = b.grant(g.Key, g.Owner, c.h.path, c.h.version, c.h.token)
		}
	}
	return slow
}
