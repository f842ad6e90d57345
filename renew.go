package fencelock

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// schedule is the client's one long-lived goroutine. It renews each held
// lease when it falls due: one short-lived goroutine per renewal, or, for a
// BatchRenewer, one per batch of every lease due within the next half
// interval (so a client's N leases cost at most about two round trips per
// interval). It exits when Close closes c.stop.
func (c *Client) schedule() {
	defer c.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	align := time.Duration(0)
	if c.batch != nil {
		align = c.o.RenewInterval / 2
	}
	poked := false // woken by scheduleLocked rather than the timer
	for {
		c.mu.Lock()
		now := c.now()
		var due []*Lease
		// Once the earliest lease is due, take every due lease, plus (for
		// batches) the regular renewals due within the next half interval,
		// so batches are few and large; a retry after a failure waits its
		// own backoff.
		if c.queue.Len() > 0 && !c.queue[0].due.After(now) {
			for c.queue.Len() > 0 {
				top := c.queue[0]
				if top.due.After(now) && (top.retrying || top.due.After(now.Add(align))) {
					break
				}
				due = append(due, heap.Pop(&c.queue).(*renewal).l)
			}
		}
		wait := time.Duration(-1)
		if c.queue.Len() > 0 {
			wait = c.queue[0].due.Sub(now)
		}
		if len(due) > 0 {
			// c.wg cannot be waited on while this goroutine runs.
			if c.batch != nil {
				c.wg.Add(1)
				go c.renewBatch(due)
			} else {
				c.wg.Add(len(due))
				for _, l := range due {
					go c.renewOne(l)
				}
			}
		}
		c.armed = time.Time{}
		switch {
		case wait >= 0:
			c.armed = c.queue[0].due
		case poked:
			// Woken for a lease that is gone already (a loop of
			// acquire and release forgets each lease before this
			// goroutine runs): stay armed for a while, so that the
			// next leases, due no earlier, schedule without waking
			// this goroutine. The timer's firing on an empty queue
			// disarms it: an idle client sleeps.
			wait = c.o.RenewInterval
			c.armed = now.Add(wait)
		}
		c.mu.Unlock()
		if wait >= 0 {
			t.Reset(wait)
		}
		select {
		case <-c.wake:
			poked = true
		case <-t.C:
			poked = false
		case <-c.stop:
			t.Stop()
			return
		}
		t.Stop()
	}
}

// renewal is a held lease's entry in the scheduler. The entry and the
// queue are guarded by c.mu, and only the scheduler's own code (this file
// and forget) touches them; the Lease's fields are guarded by l.mu. An
// entry is in the queue (idx ≥ 0) while its lease waits for its next
// renewal, and out of it (idx = −1) while a renewal is in flight.
type renewal struct {
	l        *Lease
	due      time.Time
	retrying bool // the next renewal is a retry after a failure
	urgent   bool // renew again at once when the renewal in flight ends (SetMetadata)
	idx      int  // index in c.queue; −1 while not queued
}

// renewalQueue is a min-heap of scheduler entries by due time.
type renewalQueue []*renewal

func (q renewalQueue) Len() int           { return len(q) }
func (q renewalQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q renewalQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].idx = i
	q[j].idx = j
}
func (q *renewalQueue) Push(x any) {
	r := x.(*renewal)
	r.idx = len(*q)
	*q = append(*q, r)
}
func (q *renewalQueue) Pop() any {
	old := *q
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	r.idx = -1
	return r
}

// scheduleLocked queues r to be renewed at due. Called with c.mu held,
// for an entry that is not queued.
func (c *Client) scheduleLocked(r *renewal, due time.Time, retrying bool) {
	r.due, r.retrying = due, retrying
	heap.Push(&c.queue, r)
	c.pokeIfEarlierLocked(due)
}

// reschedule queues l's next renewal, unless l has left the client's held
// leases meanwhile (released or lost).
func (c *Client) reschedule(l *Lease, due time.Time, retrying bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.leases[l]; ok && r.idx < 0 {
		if r.urgent {
			r.urgent = false
			if now := c.now(); due.After(now) {
				due = now
			}
		}
		c.scheduleLocked(r, due, retrying)
	}
}

// renewSoon makes l's next renewal happen at once: now if it is queued,
// right after the one in flight otherwise.
func (c *Client) renewSoon(l *Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.leases[l]
	if !ok {
		return
	}
	if r.idx < 0 {
		r.urgent = true
		return
	}
	now := c.now()
	r.due, r.retrying = now, false
	heap.Fix(&c.queue, r.idx)
	c.pokeIfEarlierLocked(now)
}

// pokeIfEarlierLocked wakes the scheduler if its timer is not set to fire
// at or before t. Called with c.mu held.
func (c *Client) pokeIfEarlierLocked(t time.Time) {
	if c.armed.IsZero() || t.Before(c.armed) {
		c.poke()
	}
}

// renewPlan reads what a renewal of l needs; ok is false if l has ended.
// It takes l's pending SetMetadata, if any: the renewal carries it (and
// renewed hands the update back if the renewal fails transiently).
func (c *Client) renewPlan(l *Lease, now time.Time) (p plan, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != held {
		return p, false
	}
	// Rotate now if waiting for the next renewal would stretch the gap
	// between rotations beyond RotateEvery.
	p.rotate = l.rotateEvery > 0 && now.Add(l.interval).After(l.lastRotate.Add(l.rotateEvery))
	l.renewing = true
	l.renewed = make(chan struct{})
	p.g, p.deadline, p.meta = l.grant, l.validUntil, l.metaReq
	l.metaReq = nil
	return p, true
}

// plan is one lease's part in a renewal.
type plan struct {
	g        driver.Grant
	rotate   bool
	deadline time.Time   // the end of the lease's local validity
	meta     *metaUpdate // a SetMetadata the renewal carries, or nil
}

// request is the RenewRequest of p for a lease with the given TTL.
func (p *plan) request(ttl time.Duration) driver.RenewRequest {
	req := driver.RenewRequest{TTL: ttl, Rotate: p.rotate}
	if p.meta != nil {
		req.SetMetadata, req.Metadata = true, p.meta.data
	}
	return req
}

func (c *Client) renewOne(l *Lease) {
	defer c.wg.Done()
	start := c.now()
	p, ok := c.renewPlan(l, start)
	if !ok {
		return
	}
	c.renewPlanned(l, start, p)
}

// renewPlanned sends one lease's renewal and applies the answer.
func (c *Client) renewPlanned(l *Lease, start time.Time, p plan) {
	// The lease's context aborts the request if the lease ends meanwhile,
	// except with a minimum hold: a release into the hold waits for this
	// renewal's real answer (holdForMinimum), and an aborted request could
	// still reach the store after the hold renewal.
	parent := l.Context()
	if l.minHold > 0 {
		parent = context.WithoutCancel(parent)
		// Close's budget ends it still (see Client.drain).
		var stop context.CancelFunc
		parent, stop = context.WithCancel(parent)
		defer context.AfterFunc(c.drain, stop)()
		defer stop()
	}
	ctx, cancel := context.WithTimeout(parent, p.deadline.Sub(start))
	ng, err := c.b.Renew(ctx, p.g, p.request(l.ttl))
	cancel()
	c.renewed(l, start, p, ng, err)
}

func (c *Client) renewBatch(due []*Lease) {
	defer c.wg.Done()
	start := c.now()
	type item struct {
		l *Lease
		p plan
	}
	// One RenewBatch per distinct request: RenewRequest has one TTL and
	// one Rotate flag for all its grants, and leases of one client may
	// have different TTLs (WithTTL).
	type group struct {
		req   driver.RenewRequest
		items []item
	}
	type groupKey struct {
		ttl    time.Duration
		rotate bool
	}
	var groups []*group
	index := make(map[groupKey]*group)
	deadline := time.Time{}
	var single []item // renewals that carry metadata, which RenewBatch never does
	for _, l := range due {
		p, ok := c.renewPlan(l, start)
		if !ok {
			continue
		}
		if p.meta != nil {
			single = append(single, item{l, p})
			continue
		}
		gk := groupKey{l.ttl, p.rotate}
		gr := index[gk]
		if gr == nil {
			gr = &group{req: p.request(l.ttl)}
			index[gk] = gr
			groups = append(groups, gr)
		}
		gr.items = append(gr.items, item{l, p})
		// The latest deadline bounds the batch: each lease's own timer
		// ends it at its deadline, and one lease near its end must not
		// fail the renewal of all the others.
		if p.deadline.After(deadline) {
			deadline = p.deadline
		}
	}
	for _, it := range single {
		c.renewPlanned(it.l, start, it.p)
	}
	for _, gr := range groups {
		grants := make([]driver.Grant, len(gr.items))
		for j, it := range gr.items {
			grants[j] = it.p.g
		}
		ctx, cancel := context.WithTimeout(c.drain, deadline.Sub(start))
		results, err := c.batch.RenewBatch(ctx, grants, gr.req)
		cancel()
		if err == nil && len(results) != len(grants) {
			err = errors.New("backend returned a batch result of the wrong length")
		}
		for j, it := range gr.items {
			if err != nil {
				c.renewed(it.l, start, it.p, driver.Grant{}, err)
			} else {
				c.renewed(it.l, start, it.p, results[j].Grant, results[j].Err)
			}
		}
	}
}

// renewed applies the outcome of a renewal of l that was sent at start:
// it updates the lease, then reports, and then either ends the lease or
// queues its next renewal. A SetMetadata the renewal carried learns its
// outcome last, once the lease's state says it.
func (c *Client) renewed(l *Lease, start time.Time, p plan, ng driver.Grant, err error) {
	old := p.g
	o := l.applyRenewal(start, p, ng, err)
	if o.lost != nil {
		c.emit(o.event)
		l.lose(o.lost)
		l.answer(p.meta, false)
		return
	}
	if o.ended {
		l.answer(p.meta, false)
		return
	}
	c.reschedule(l, o.next, o.retrying)
	c.emit(o.event)
	if o.rotated {
		c.emit(Event{Kind: EventRotated, Key: l.key, Owner: l.owner, Token: ng.Token, Previous: old.Token})
	}
	if !o.retrying {
		l.answer(p.meta, true)
	}
}

// errLateRenewal is the cause of a loss when a renewal's answer arrived
// after the lease's local validity had ended.
var errLateRenewal = fmt.Errorf("%w: the store answered the renewal after the lease's local validity (TTL − Margin) had ended", ErrLocalExpiry)

// renewalOutcome is what a renewal's answer means for its lease.
type renewalOutcome struct {
	ended    bool      // the lease had already ended: nothing to do
	lost     error     // the lease is lost with this cause
	event    Event     // EventRenewed or EventRenewFailed
	rotated  bool      // the token changed: report EventRotated too
	next     time.Time // when to renew next
	retrying bool      // next is a retry after a failure
}

// applyRenewal updates l with a renewal's answer, under l.mu, and says
// what the caller must do next.
func (l *Lease) applyRenewal(start time.Time, p plan, ng driver.Grant, err error) renewalOutcome {
	c := l.c
	old, rotate := p.g, p.rotate
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewing = false
	close(l.renewed)
	if p.meta != nil {
		switch {
		case err == nil && ng.Token >= old.Token:
			l.meta = p.meta.data // stored, whatever happens to the lease now
		case err != nil && !definite(err) && l.state == held && l.metaReq == nil && !p.meta.cancelled:
			l.metaReq = p.meta // retried with the next renewal
		}
	}
	if (rotate || p.meta != nil) && err != nil && !definite(err) {
		// The rotation may have taken effect: our record may now carry
		// a token we have not seen (a metadata update issues one too on
		// stores whose token is the record's version: etcd, ZooKeeper).
		// Kept until a renewal succeeds.
		l.unsure = true
	}
	if l.state != held {
		if err == nil && ng.Token >= old.Token {
			// Released during this renewal (into its minimum hold, or
			// with Close): the record is now ng, and the hold renewal
			// or release that waits for this answer must name it (a
			// rotated token, and the Handle a backend keeps state in).
			if ng.Key == "" {
				ng.Key, ng.Owner = old.Key, old.Owner
			}
			if ng.Handle == "" {
				ng.Handle = old.Handle
			}
			l.grant, l.unsure = ng, false
		}
		return renewalOutcome{ended: true}
	}
	switch {
	case err == nil && ng.Token < old.Token:
		err = fmt.Errorf("%w: had %d, got %d", ErrTokenRegressed, old.Token, ng.Token)
		return renewalOutcome{lost: ErrTokenRegressed,
			event: Event{Kind: EventRenewFailed, Key: l.key, Owner: l.owner, Token: old.Token, Definite: true, Err: err}}
	case err == nil:
		if ng.Key == "" {
			ng.Key, ng.Owner = old.Key, old.Owner
		}
		if ng.Handle == "" {
			ng.Handle = old.Handle
		}
		l.grant = ng
		l.unsure = false
		now := c.now()
		if !now.Before(l.validUntil) {
			// The answer came after the lease's local validity had
			// ended; only its timer has not run yet (a busy process).
			// The lease ended then: Remaining has said so since, and a
			// holder may have stopped on it. Never extend it again.
			// The record is ng now, for the clean-up to free.
			return renewalOutcome{lost: errLateRenewal,
				event: Event{Kind: EventRenewFailed, Key: l.key, Owner: l.owner, Token: ng.Token, Definite: true, Err: errLateRenewal}}
		}
		if rotate && ng.Token > old.Token {
			l.lastRotate = start
		}
		l.failures = 0
		l.setValidityLocked(start, ng, now)
		return renewalOutcome{next: start.Add(l.interval), rotated: ng.Token > old.Token,
			event: Event{Kind: EventRenewed, Key: l.key, Owner: l.owner, Token: ng.Token, Latency: now.Sub(start)}}
	case errors.Is(err, ErrNotHeld):
		return renewalOutcome{lost: err,
			event: Event{Kind: EventRenewFailed, Key: l.key, Owner: l.owner, Token: old.Token, Definite: true, Err: err}}
	default:
		l.failures++
		retry := min(c.o.MinBackoff<<min(l.failures, 20), l.interval/2)
		return renewalOutcome{next: c.now().Add(jitter(retry)), retrying: true,
			event: Event{Kind: EventRenewFailed, Key: l.key, Owner: l.owner, Token: old.Token,
				Remaining: l.validUntil.Sub(c.now()), Err: c.wrap(context.Background(), "renew", err)}}
	}
}
