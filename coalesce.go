package fencelock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// maxBatch caps the members of one coalesced batch: a bigger batch makes
// its slowest member everybody's latency, and a statement with thousands
// of rows holds its row locks longer.
const maxBatch = 64

// maxInFlight is how many requests or batches a lane keeps in flight at
// once. One would leave the store idle while a batch's answer travels
// back and the next batch travels out; a store that executes requests
// one at a time (Redis) then does less than with a connection per
// caller. Two keep it busy, and under load each still carries the calls
// that queued meanwhile.
const maxInFlight = 2

// Coalescing (see docs/internals.md, "Coalescing"). A lane sends one kind
// of request (acquire attempts, releases) to the store, at most one
// batch at a time. A call that finds the lane idle goes at once, alone,
// on its own goroutine, through the backend's single-request method: a
// lone caller pays nothing. Calls that arrive while a batch is in flight
// queue; when the batch returns, the queued calls (up to maxBatch, one
// per key) go together as the next batch, sent by the first of them on
// its own goroutine. No timer: batches form only from calls that would
// otherwise have waited for a connection of their own.
type lane[Q, R any] struct {
	c      *Client
	key    func(Q) string
	single func(context.Context, Q) (R, error)
	batch  func(context.Context, []Q) ([]R, []error, error)
	// late is given the answer of a member that left while its batch was
	// in flight (its caller has an ambiguous answer): a grant nobody
	// will hold is released. It runs before the lane's next turn, so
	// that no later request reaches the store before it.
	late func(Q, R, error)
	// owner, if set, names the caller of a request: the answer of a
	// member that left is not given to late while a request of the same
	// owner and key is queued (its call retries, and adopts or refuses
	// the record itself).
	owner func(Q) string

	mu sync.Mutex
	// busy counts the requests or batches in flight (or about to be
	// sent): at most maxInFlight.
	busy  int
	queue []*member[Q, R]
	// left counts, per owner and key (with owner set), the members that
	// left while their batch was in flight and whose answer has not come
	// back: a request of the same owner and key (its call's retry) waits
	// in the queue until it has, even with a place in flight free, so
	// that it never meets the store before the left member's answer is
	// dealt with (see send).
	left map[string]int

	batches atomic.Uint64 // batches of two or more sent
	members atomic.Uint64 // members of those batches
}

// member is one call waiting in, or sent with, a batch.
type member[Q, R any] struct {
	ctx   context.Context
	req   Q
	state memberState
	wake  chan struct{} // a buffer of one: the member's turn to send, or its answer
	group []*member[Q, R]
	res   R
	err   error
}

type memberState uint8

const (
	queued   memberState = iota // in the lane's queue
	chosen                      // taken from the queue into a batch, not yet sent
	leading                     // chosen to send its batch (group)
	sent                        // its batch is in flight
	left                        // its caller returned while its batch was in flight
	answered                    // res and err are its answer
)

func (m *member[Q, R]) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// do makes one request on the lane, with ctx its own bound.
func (l *lane[Q, R]) do(ctx context.Context, req Q) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	l.mu.Lock()
	if l.busy < maxInFlight && !l.behindLeftLocked(req) {
		l.busy++
		l.mu.Unlock()
		r, err := l.single(ctx, req)
		l.mu.Lock()
		l.nextLocked()
		l.mu.Unlock()
		return r, err
	}
	m := &member[Q, R]{ctx: ctx, req: req, wake: make(chan struct{}, 1)}
	l.queue = append(l.queue, m)
	l.mu.Unlock()
	done := ctx.Done()
	for {
		select {
		case <-m.wake:
		case <-done:
		}
		l.mu.Lock()
		switch m.state {
		case answered:
			l.mu.Unlock()
			return m.res, m.err
		case leading:
			group := m.group
			m.group = nil
			l.mu.Unlock()
			if done, r, err := l.lead(m, group); done {
				return r, err
			}
			continue
		case queued:
			if ctx.Err() != nil {
				// Never sent: the caller has its own context's error.
				for i, q := range l.queue {
					if q == m {
						l.queue = append(l.queue[:i], l.queue[i+1:]...)
						break
					}
				}
				l.mu.Unlock()
				return zero, ctx.Err()
			}
		case sent:
			if ctx.Err() != nil {
				// In flight: the store may apply it. The answer is the
				// caller's context's error (an unknown outcome); the
				// sender hands the store's answer to late.
				m.state = left
				if k, ok := l.leftKey(m.req); ok {
					if l.left == nil {
						l.left = make(map[string]int)
					}
					l.left[k]++
				}
				l.mu.Unlock()
				return zero, ctx.Err()
			}
		}
		if m.state == chosen && ctx.Err() != nil {
			// Its sender will see the end (before the batch is sent)
			// and answer it: wait for that, not for ctx again.
			done = nil
		}
		l.mu.Unlock()
	}
}

// leftKey names req's owner and key for the left count; ok is false on
// a lane without owners.
func (l *lane[Q, R]) leftKey(req Q) (string, bool) {
	if l.owner == nil {
		return "", false
	}
	return l.owner(req) + "\x00" + l.key(req), true
}

// behindLeftLocked reports whether req must wait for the answer of a
// member of the same owner and key that left its batch in flight.
// Called with l.mu held.
func (l *lane[Q, R]) behindLeftLocked(req Q) bool {
	k, ok := l.leftKey(req)
	return ok && l.left[k] > 0
}

// nextLocked ends the lane's turn: the queued calls, up to maxBatch and
// one per key, become the next batch, handed to the first of them to
// send; with none queued the lane is idle. Called with l.mu held.
func (l *lane[Q, R]) nextLocked() {
	if len(l.queue) == 0 {
		l.busy--
		return
	}
	var (
		group []*member[Q, R]
		rest  []*member[Q, R]
		keys  = make(map[string]struct{}, min(len(l.queue), maxBatch))
	)
	for _, m := range l.queue {
		k := l.key(m.req)
		if _, dup := keys[k]; dup || len(group) == maxBatch || l.behindLeftLocked(m.req) {
			rest = append(rest, m)
			continue
		}
		keys[k] = struct{}{}
		m.state = chosen
		group = append(group, m)
	}
	clear(l.queue[len(rest):])
	l.queue = append(l.queue[:0], rest...)
	if len(group) == 0 {
		// Every queued call waits for a left member's answer; the batch
		// that carries it takes them in its turn (send).
		l.busy--
		return
	}
	lead := group[0]
	lead.state, lead.group = leading, group
	lead.signal()
}

// lead sends group, chosen by nextLocked, of which self is the first
// member. A group of one is sent on self's goroutine, with the backend's
// single request; a batch of two or more on a goroutine of its own, so
// that every member, self included, returns at its own context's end
// while the batch is in flight. It reports done with self's answer, or
// !done: self waits for its answer as the other members do.
func (l *lane[Q, R]) lead(self *member[Q, R], group []*member[Q, R]) (done bool, _ R, _ error) {
	var zero R
	// Members whose context ended before the batch was sent leave it
	// with their context's error: nothing was sent for them.
	l.mu.Lock()
	live := group[:0]
	for _, m := range group {
		if m.ctx.Err() != nil {
			m.state, m.err = answered, m.ctx.Err()
			m.signal()
			continue
		}
		live = append(live, m)
	}
	if self.state == answered {
		// The sender's own context ended: the next member sends.
		if len(live) > 0 {
			live[0].state, live[0].group = leading, live
			live[0].signal()
		} else {
			l.nextLocked()
		}
		l.mu.Unlock()
		return true, zero, self.err
	}
	for _, m := range live {
		m.state = sent
	}
	l.mu.Unlock()
	if len(live) == 1 {
		r, err := l.single(self.ctx, self.req)
		l.mu.Lock()
		self.state, self.res, self.err = answered, r, err
		l.nextLocked()
		l.mu.Unlock()
		return true, r, err
	}
	ctx, cancel := l.batchCtx(self.ctx, live)
	send := func() {
		defer cancel()
		l.send(ctx, live)
	}
	if !l.c.goBackground(send) {
		send() // the client has stopped: Close waits for its calls
	}
	return false, zero, nil
}

// send sends the batch of members live on ctx, hands each member its
// answer (to late if it has left), and ends the lane's turn.
func (l *lane[Q, R]) send(ctx context.Context, live []*member[Q, R]) {
	l.batches.Add(1)
	l.members.Add(uint64(len(live)))
	reqs := make([]Q, len(live))
	for i, m := range live {
		reqs[i] = m.req
	}
	res, errs, err := l.batch(ctx, reqs)
	if err == nil && (len(res) != len(reqs) || len(errs) != len(reqs)) {
		err = errBatchLength
	}
	l.mu.Lock()
	var lates []*member[Q, R]
	for i, m := range live {
		var (
			r R
			e = err
		)
		if err == nil {
			r, e = res[i], errs[i]
		}
		m.res, m.err = r, e
		if m.state == left {
			lates = append(lates, m)
			continue
		}
		m.state = answered
		m.signal()
	}
	if len(lates) == 0 {
		l.nextLocked()
		l.mu.Unlock()
		return
	}
	// A member that left has a retry of its call queued: the retry
	// meets the record (a store grants its owner the record it holds
	// again), and its call keeps or abandons it. Releasing the grant
	// now would remove the record under the retry's lease.
	adopted := func(m *member[Q, R]) bool {
		if l.owner == nil {
			return false
		}
		for _, q := range l.queue {
			if l.owner(q.req) == l.owner(m.req) && l.key(q.req) == l.key(m.req) {
				return true
			}
		}
		return false
	}
	var orphans []*member[Q, R]
	for _, m := range lates {
		if !adopted(m) {
			orphans = append(orphans, m)
		}
	}
	l.mu.Unlock()
	// Before the lane's next turn, and before the left members' count
	// lets their retries through (behindLeftLocked): a retry that comes
	// meanwhile queues, is sent after the release, and gets a record of
	// its own.
	for _, m := range orphans {
		l.late(m.req, m.res, m.err)
	}
	l.mu.Lock()
	for _, m := range lates {
		if k, ok := l.leftKey(m.req); ok {
			if l.left[k]--; l.left[k] <= 0 {
				delete(l.left, k)
			}
		}
	}
	l.nextLocked()
	l.mu.Unlock()
}

// errBatchLength is a batch's error when the backend returned the wrong
// number of results: every member's outcome is unknown.
var errBatchLength = errors.New("backend returned a batch result of the wrong length")

// batchCtx is the context of a batch: the sender's values, ended at the
// latest deadline among its members (each member returns at its own), at
// most the client's TTL from now (the bound of any request), and by the
// end of Close's budget.
func (l *lane[Q, R]) batchCtx(sender context.Context, group []*member[Q, R]) (context.Context, context.CancelFunc) {
	c := l.c
	bound := c.now().Add(c.o.TTL)
	var latest time.Time
	for _, m := range group {
		d, ok := m.ctx.Deadline()
		if !ok {
			latest = bound
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	if latest.After(bound) {
		latest = bound
	}
	ctx, cancel := context.WithDeadlineCause(context.WithoutCancel(sender), latest, c.ttlBound)
	stop := context.AfterFunc(c.drain, cancel)
	return ctx, func() { stop(); cancel() }
}

// coalescing is a client's two lanes, nil without the backend's
// capability or with Options.NoCoalesce.
type coalescing struct {
	acquire *lane[driver.AcquireRequest, driver.Grant]
	release *lane[driver.Grant, struct{}]
}

// setUpCoalescing makes the client's lanes for the capabilities b has.
func (c *Client) setUpCoalescing(b Backend) {
	if c.o.NoCoalesce {
		return
	}
	if ba, ok := b.(driver.BatchAcquirer); ok {
		c.co.acquire = &lane[driver.AcquireRequest, driver.Grant]{
			c:      c,
			key:    func(r driver.AcquireRequest) string { return r.Key },
			single: b.Acquire,
			batch: func(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.Grant, []error, error) {
				res, err := ba.AcquireBatch(ctx, reqs)
				if err != nil {
					return nil, nil, err
				}
				gs, errs := make([]driver.Grant, len(res)), make([]error, len(res))
				for i, r := range res {
					gs[i], errs[i] = r.Grant, r.Err
				}
				return gs, errs, nil
			},
			late:  c.lateAcquired,
			owner: func(r driver.AcquireRequest) string { return r.Owner },
		}
	}
	if br, ok := b.(driver.BatchReleaser); ok {
		c.co.release = &lane[driver.Grant, struct{}]{
			c:   c,
			key: func(g driver.Grant) string { return g.Key },
			single: func(ctx context.Context, g driver.Grant) (struct{}, error) {
				return struct{}{}, b.Release(ctx, g)
			},
			batch: func(ctx context.Context, gs []driver.Grant) ([]struct{}, []error, error) {
				errs, err := br.ReleaseBatch(ctx, gs)
				if err != nil {
					return nil, nil, err
				}
				return make([]struct{}, len(errs)), errs, nil
			},
			late: func(driver.Grant, struct{}, error) {},
		}
	}
}

// acquireOnce makes one acquire attempt, coalesced with others where the
// backend can batch them.
func (c *Client) acquireOnce(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if c.co.acquire == nil {
		return c.b.Acquire(ctx, req)
	}
	return c.co.acquire.do(ctx, req)
}

// releaseOnce makes one release, coalesced with others where the backend
// can batch them.
func (c *Client) releaseOnce(ctx context.Context, g driver.Grant) error {
	if c.co.release == nil {
		return c.b.Release(ctx, g)
	}
	_, err := c.co.release.do(ctx, g)
	return err
}

// coalesceStats counts the batches of two or more coalesced requests
// the client sent: acquire batches and their members, release batches
// and their members (tests read it).
func (c *Client) coalesceStats() (acqBatches, acqMembers, relBatches, relMembers uint64) {
	if l := c.co.acquire; l != nil {
		acqBatches, acqMembers = l.batches.Load(), l.members.Load()
	}
	if l := c.co.release; l != nil {
		relBatches, relMembers = l.batches.Load(), l.members.Load()
	}
	return
}

// lateAcquired gives back the grant of a batch member whose caller
// stopped waiting before the batch answered (an error: its caller's
// clean-up, abandon, sees to it). Once: that call may still be retrying
// under the same owner, and its retry adopts the record or, when the call
// ends, removes it by owner (abandonFor); a background retry by owner
// from here could remove the live record of that retry's lease. The
// stores that batch acquisitions keep records with a TTL, which ends one
// whose release failed.
func (c *Client) lateAcquired(_ driver.AcquireRequest, g driver.Grant, err error) {
	if err != nil {
		return
	}
	c.releaseGrantOnce(g)
}
