package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// Renewal batches are coalesced: while one batch statement for a given
// (TTL, Rotate) is in flight, further RenewBatch calls join a single
// waiting group, which is sent as one statement as soon as the first
// returns (group commit). However finely the engine splits its renewals,
// a backend then has at most one renewal statement running and one
// gathering per kind, and each round trip renews everything that came due
// meanwhile.
//
// A caller whose context ends gets the context's error, which the engine
// treats as a failed renewal: it keeps the token it has and retries with
// it. The statement must therefore never renew, and above all never
// rotate, on behalf of a caller that has gone without telling it:
//
//   - A member that leaves before its group is sent is taken out of the
//     group; the statement is built only from the members still waiting
//     (and a group whose members have all left is not sent).
//   - A member that leaves while the statement runs cannot be taken out of
//     it. Whatever the statement rotated for it is remembered (see
//     rotations), so that its retry with the token it holds renews the
//     record the statement left instead of being refused as a stale token.

type batchKind struct {
	ttl    time.Duration
	rotate bool
}

type batchLane struct {
	busy bool        // a group owns the lane: its statement is in flight or about to be sent
	next *batchGroup // gathering while busy
}

// member is one RenewBatch call in a group.
type member struct {
	ctx     context.Context
	grants  []driver.Grant
	gone    bool // left before the group was sent: not in the statement
	left    bool // left while the statement ran: its results reach no one
	results []driver.RenewResult
}

type batchGroup struct {
	members  []*member
	live     int           // members not gone
	turn     chan struct{} // closed when the group may be sent
	sent     bool          // a member has taken the group to send it
	finished bool          // results are in (also signalled by done)
	done     chan struct{}
	err      error
}

type coalescer struct {
	mu    sync.Mutex
	lanes map[batchKind]*batchLane
}

// RenewBatch implements driver.BatchRenewer: one UPDATE … FROM unnest(…)
// renews every grant (a grant missing from the result is ErrNotHeld), and
// concurrent calls are coalesced into as few statements as possible. A
// call whose context ends before its statement is sent is left out of it.
// The call that sends a statement waits for its answer, up to the latest
// deadline among the calls it serves.
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	if len(grants) == 0 {
		return nil, nil
	}
	c := &b.batches
	k := batchKind{req.TTL, req.Rotate}
	m := &member{ctx: ctx, grants: grants}
	c.mu.Lock()
	if c.lanes == nil {
		c.lanes = make(map[batchKind]*batchLane)
	}
	lane := c.lanes[k]
	if lane == nil {
		lane = &batchLane{}
		c.lanes[k] = lane
	}
	if !lane.busy {
		lane.busy = true
		g := &batchGroup{members: []*member{m}, live: 1, sent: true, done: make(chan struct{})}
		c.mu.Unlock()
		return b.send(lane, g, m, req)
	}
	g := lane.next
	if g == nil {
		g = &batchGroup{turn: make(chan struct{}), done: make(chan struct{})}
		lane.next = g
	}
	g.members = append(g.members, m)
	g.live++
	c.mu.Unlock()

	select {
	case <-g.turn:
	case <-ctx.Done():
	}
	c.mu.Lock()
	switch {
	case m.gone: // the sender found this member's context ended
		c.mu.Unlock()
		return nil, ctx.Err()
	case !g.sent && ctx.Err() != nil:
		c.leaveLocked(lane, g, m)
		c.mu.Unlock()
		return nil, ctx.Err()
	case !g.sent:
		// The group's turn has come and no other member has taken it.
		g.sent = true
		c.mu.Unlock()
		return b.send(lane, g, m, req)
	}
	c.mu.Unlock()

	// Another member sends the group.
	select {
	case <-g.done:
	case <-ctx.Done():
		c.mu.Lock()
		if !g.finished {
			m.left = true // the sender remembers what it rotates for m
			c.mu.Unlock()
			return nil, ctx.Err()
		}
		c.mu.Unlock()
	}
	return m.results, g.err
}

// leaveLocked takes m, whose context has ended, out of a group not yet
// sent. A group left empty is dropped; if it already owned the lane, the
// lane passes on. Called with c.mu held.
func (c *coalescer) leaveLocked(lane *batchLane, g *batchGroup, m *member) {
	m.gone = true
	g.live--
	if g.live > 0 {
		return
	}
	if lane.next == g {
		lane.next = nil // still gathering: nobody will send it
		return
	}
	c.handOffLocked(lane) // promoted, but nobody is left to send it
}

// send runs g's statement on behalf of its members that are still waiting
// (self, which sends, among them), hands their results out and passes the
// lane on.
func (b *Backend) send(lane *batchLane, g *batchGroup, self *member, req driver.RenewRequest) ([]driver.RenewResult, error) {
	c := &b.batches
	c.mu.Lock()
	var (
		in         []*member
		all        []driver.Grant
		deadline   time.Time
		noDeadline bool
	)
	for _, m := range g.members {
		if m.gone {
			continue
		}
		if m != self && m.ctx.Err() != nil {
			m.gone = true // its caller has its context's error: leave it out
			g.live--
			continue
		}
		in = append(in, m)
		all = append(all, m.grants...)
		if d, ok := m.ctx.Deadline(); !ok {
			noDeadline = true
		} else if d.After(deadline) {
			deadline = d
		}
	}
	c.mu.Unlock()

	// The statement serves every member: it runs until the latest member's
	// deadline (or none), not the sender's. Each member but the sender
	// still returns when its own context ends.
	base := context.WithoutCancel(self.ctx)
	gctx, cancel := context.WithCancel(base)
	if !noDeadline {
		cancel()
		gctx, cancel = context.WithDeadline(base, deadline)
	}
	results, err := b.renewBatchOnce(gctx, all, req)
	cancel()

	c.mu.Lock()
	g.err = err
	off := 0
	for _, m := range in {
		n := len(m.grants)
		if err == nil {
			m.results = results[off : off+n]
			b.rot.settle(m.grants, m.results, req.TTL, m.left || m.ctx.Err() != nil)
		}
		off += n
	}
	g.finished = true
	close(g.done)
	c.handOffLocked(lane)
	c.mu.Unlock()
	return self.results, err
}

// handOffLocked ends the group that owns the lane: the gathering group, if
// any, becomes the one to send. Called with c.mu held.
func (c *coalescer) handOffLocked(lane *batchLane) {
	if g := lane.next; g != nil {
		lane.next = nil
		close(g.turn)
		return
	}
	lane.busy = false
}

// grantID identifies a grant as the statements check it.
type grantID struct {
	key, owner string
	token      int64
}

func idOf(g driver.Grant) grantID { return grantID{g.Key, g.Owner, int64(g.Token)} }

// rotations remembers the tokens that a renewal statement rotated for a
// caller that was gone when the answer came, keyed by the grant the caller
// still holds. A later Renew, RenewBatch or Release of that grant is sent
// with the token the row has, so that a rotation the caller never saw does
// not make its own record refuse it. Only this backend's own answers for
// exactly that (key, owner, token) are remembered, and the statements still
// check owner, token and expiry, so nothing else can match. An entry lives
// as long as the record it describes could (the TTL of the renewal that
// rotated it) and is dropped once the caller has seen the outcome.
type rotations struct {
	mu   sync.Mutex
	m    map[grantID]rotated
	high int // prune when len(m) reaches this
}

type rotated struct {
	token int64
	until time.Time
}

// settle records the outcome of renewing grants (the callers' grants, as
// they hold them): for a caller that will not see results (gone), the
// tokens the statement rotated; otherwise (or once a grant is refused) the
// entries are no longer needed.
func (r *rotations) settle(grants []driver.Grant, results []driver.RenewResult, ttl time.Duration, gone bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for i, g := range grants {
		id := idOf(g)
		res := results[i]
		if gone && res.Err == nil && res.Grant.Token != g.Token {
			if r.m == nil {
				r.m = make(map[grantID]rotated)
			}
			r.m[id] = rotated{token: int64(res.Grant.Token), until: now.Add(ttl)}
		} else {
			delete(r.m, id)
		}
	}
	if len(r.m) >= max(r.high, 64) {
		for id, e := range r.m {
			if !now.Before(e.until) {
				delete(r.m, id)
			}
		}
		r.high = 2 * len(r.m)
	}
}

// current returns g with the token its record has, if a renewal rotated it
// for a caller that never saw the answer.
func (r *rotations) current(g driver.Grant) driver.Grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.m[idOf(g)]; ok && time.Now().Before(e.until) {
		g.Token = driver.Token(e.token)
	}
	return g
}

// forget drops what is remembered for g: its caller has seen the outcome.
func (r *rotations) forget(g driver.Grant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, idOf(g))
}
