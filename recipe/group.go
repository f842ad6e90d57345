package recipe

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
)

// grantState is where a grant of several leases is in its life.
type grantState int

const (
	held grantState = iota
	released
	lost
)

// leaseGroup is what a grant made of several leases (MultiGrant,
// RWGrant) holds them with: one context and one life for all of them.
// The grant is lost when any of its leases is lost (its context ends
// with that lease's *LostError as cause), and its other leases are then
// released. A grant embeds it and starts it once (start); it must not be
// copied after that. Its fields other than c, ctx and cancel are under mu.
//
// Lock order: a lease's lock, then mu. A lease ends under its own lock
// and then takes mu (partEnded, through Lease.OnEnd), so nothing may call
// a lease's method while it holds mu: a lease ending meanwhile would wait
// for mu while mu's holder waits for that lease, and the grant would hang
// for good (its Done never closed, every later method blocked).
type leaseGroup struct {
	c      *fencelock.Client
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu     sync.Mutex
	leases []*fencelock.Lease
	state  grantState
	err    error // the *LostError once lost
}

// start makes the group hold ls, with a context that carries parent's
// values but not its cancellation, and ties the group's life to each
// lease's.
func (g *leaseGroup) start(c *fencelock.Client, parent context.Context, ls []*fencelock.Lease) {
	g.c, g.leases, g.state = c, ls, held
	g.ctx, g.cancel = context.WithCancelCause(context.WithoutCancel(parent))
	// The minimum hold is the grant's: it counts from now for every
	// lease, not from when each arrived.
	now := c.Options().Clock.Now()
	for _, l := range ls {
		l.RestartMinHold(now)
	}
	for _, l := range ls {
		l.OnEnd(g.partEnded)
	}
}

// partEnded ends the grant when one of its leases ended while it was held
// (lost, or released by Client.Close), and releases the others. It runs
// under that lease's lock, as the lease ends (Lease.OnEnd): the grant's
// Done is closed before the lease's own.
func (g *leaseGroup) partEnded(cause error) {
	g.mu.Lock()
	if g.state != held {
		g.mu.Unlock()
		return
	}
	var lostErr *fencelock.LostError
	if errors.As(cause, &lostErr) {
		g.state, g.err = lost, lostErr
	} else {
		g.state = released
	}
	ls := g.leases
	g.mu.Unlock()
	g.cancel(cause)
	// The grant was handed out: its other leases keep their minimum hold.
	// Not under the lease's lock; Close releases them itself once it has
	// begun.
	go g.c.Go(func(context.Context) { releaseLeases(context.Background(), true, ls) })
}

// replaceLeases makes ls the group's leases, and runs also (if not nil)
// under the group's lock with them, if the grant is still held; if not,
// it changes nothing and returns the error of a call on an ended grant
// (notHeldErr). A lease of ls the group did not hold then ends the
// grant when it ends; one it held that ls lacks no longer does: the
// caller releases it. also must not call a lease's method (see
// leaseGroup's lock order).
func (g *leaseGroup) replaceLeases(ls []*fencelock.Lease, also func()) error {
	g.mu.Lock()
	if g.state != held {
		err := g.notHeldErr()
		g.mu.Unlock()
		return err
	}
	old := g.leases
	g.leases = ls
	if also != nil {
		also()
	}
	g.mu.Unlock()
	for _, l := range ls {
		if !slices.Contains(old, l) {
			l.OnEnd(g.partEnded)
		}
	}
	for _, l := range old {
		if !slices.Contains(ls, l) {
			l.OnEnd(func(error) {})
		}
	}
	return nil
}

// leaseList returns the group's leases, as a new slice.
func (g *leaseGroup) leaseList() []*fencelock.Lease {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.leases)
}

// lostErr returns the *LostError of the lease that was lost, nil while
// the grant is held or after it was released (the grant's Err).
func (g *leaseGroup) lostErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// remaining returns the least Remaining of the group's leases, zero once
// it has ended (the grant's Remaining).
func (g *leaseGroup) remaining() time.Duration {
	r := time.Duration(-1)
	for _, l := range g.leaseList() {
		if lr := l.Remaining(); r < 0 || lr < r {
			r = lr
		}
	}
	return max(r, 0)
}

// notHeldErr returns the error of a call on a grant that has ended
// (g.mu held).
func (g *leaseGroup) notHeldErr() error {
	if g.state == lost {
		return fmt.Errorf("%w: %w", fencelock.ErrNotHeld, g.err)
	}
	if errors.Is(context.Cause(g.ctx), fencelock.ErrClosed) {
		return fencelock.ErrClosed
	}
	return fencelock.ErrNotHeld
}

// release ends the grant and releases every lease it holds, at once
// (the grant's Release).
func (g *leaseGroup) release(ctx context.Context) error {
	g.mu.Lock()
	if g.state != held {
		err := g.notHeldErr()
		g.mu.Unlock()
		return err
	}
	g.state = released
	ls := g.leases
	g.mu.Unlock()
	g.cancel(fencelock.ErrReleased)
	return releaseJoined(ctx, ls)
}

// releaseJoined releases every lease of ls at once (Lease.Release) and
// returns their errors, joined.
func releaseJoined(ctx context.Context, ls []*fencelock.Lease) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for _, l := range ls {
		wg.Go(func() {
			if err := l.Release(ctx); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
