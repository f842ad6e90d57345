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

type batchKind struct {
	ttl    time.Duration
	rotate bool
}

type batchLane struct {
	busy bool
	next *batchGroup // gathering while busy
}

type batchGroup struct {
	grants   []driver.Grant
	deadline time.Time     // the latest of the members' deadlines; zero: none
	turn     chan struct{} // closed when the group may be sent
	done     chan struct{} // closed when results are in
	results  []driver.RenewResult
	err      error
}

type coalescer struct {
	mu    sync.Mutex
	lanes map[batchKind]*batchLane
}

// RenewBatch implements driver.BatchRenewer: one UPDATE … FROM unnest(…)
// renews every grant (a grant missing from the result is ErrNotHeld), and
// concurrent calls are coalesced into as few statements as possible.
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidateTTL(req.TTL); err != nil {
		return nil, err
	}
	if len(grants) == 0 {
		return nil, nil
	}
	c := &b.batches
	k := batchKind{req.TTL, req.Rotate}
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
		c.mu.Unlock()
		res, err := b.renewBatchOnce(ctx, grants, req)
		c.handOff(lane)
		return res, err
	}
	g := lane.next
	leader := g == nil
	if leader {
		g = &batchGroup{turn: make(chan struct{}), done: make(chan struct{})}
		lane.next = g
	}
	off := len(g.grants)
	g.grants = append(g.grants, grants...)
	if d, ok := ctx.Deadline(); !ok || leader {
		g.deadline = d
	} else if !g.deadline.IsZero() && d.After(g.deadline) {
		g.deadline = d
	}
	c.mu.Unlock()

	if leader {
		// Send the group when the statement in flight returns. The wait
		// is bounded by that statement's own context.
		<-g.turn
		c.mu.Lock()
		all, deadline := g.grants, g.deadline // no more joiners: the group left lane.next
		c.mu.Unlock()
		// The statement serves every member: it runs until the latest
		// member's deadline (or none), not the leader's. Each member still
		// returns when its own context ends.
		gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		if !deadline.IsZero() {
			cancel()
			gctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), deadline)
		}
		g.results, g.err = b.renewBatchOnce(gctx, all, req)
		cancel()
		close(g.done)
		c.handOff(lane)
	} else {
		select {
		case <-g.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if g.err != nil {
		return nil, g.err
	}
	return g.results[off : off+len(grants)], nil
}

// handOff ends the lane's statement in flight: the gathering group, if
// any, becomes the one in flight.
func (c *coalescer) handOff(lane *batchLane) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := lane.next; g != nil {
		lane.next = nil
		close(g.turn)
		return
	}
	lane.busy = false
}
