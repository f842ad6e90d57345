package fencelock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
)

type leaseState int

const (
	held leaseState = iota
	released
	lost
)

// Lease is a held lock: a key, a fencing token, and a deadline that the
// engine keeps pushing forward by renewing in the background. A Lease ends
// when it is released or lost; then Done is closed and Context is
// cancelled. Its methods are safe for concurrent use.
type Lease struct {
	c      *Client
	key    string
	owner  string
	label  string
	parent context.Context // Acquire's ctx, for its values
	done   chan struct{}

	// The call's settings (see callConfig), fixed for the lease's life.
	ttl         time.Duration // the TTL asked of the store
	baseIvl     time.Duration // the renewal interval for ttl
	baseMargin  time.Duration // the margin for ttl
	rotateEvery time.Duration // 0: never
	minHold     time.Duration
	lockDelay   time.Duration // WithLockDelay's: 0 if none

	// metaMu serializes SetMetadata calls: one update in flight at a time.
	// The first SetMetadata makes it, under mu: most leases never need it.
	metaMu chan struct{}

	// sched is the lease's scheduler entry. It lives here to save an
	// allocation, but belongs to the scheduler: guarded by c.mu and
	// touched only by renew.go and Client.forget, never under l.mu.
	sched renewal

	mu              sync.Mutex
	grant           driver.Grant
	state           leaseState
	err             error         // *LostError once lost
	releasePending  bool          // a backend release has not been confirmed
	releaseFailed   bool          // a release attempt failed transiently
	releaseRetrying bool          // a background retry of a failed release runs
	unheld          bool          // released without its minimum hold (ReleaseNow)
	releasing       chan struct{} // a one-slot semaphore: one release at a time
	renewing        bool          // a renewal request is in flight
	renewed         chan struct{} // closed when the renewal in flight has its answer
	// unsure: a rotating renewal's outcome is unknown (it failed
	// transiently, or was cut short), so the store may hold this lease's
	// record under a token the lease never saw. A later "not held" answer
	// may then be about our own record: clean-up finds it by owner.
	unsure      bool
	interval    time.Duration // RenewInterval scaled to the granted TTL
	margin      time.Duration // Margin scaled to the granted TTL
	validUntil  time.Time
	lastRotate  time.Time
	failures    int
	acquired    time.Time   // clock reading before the acquiring request
	granted     time.Time   // clock reading when the store's grant arrived
	meta        []byte      // the metadata the store last confirmed
	metaReq     *metaUpdate // a SetMetadata waiting for the next renewal
	timer       *time.Timer // fires at the danger zone, then at the end of validity
	dangerFired bool        // OnDanger ran for the current validity period
	stopLoss    func()
	ctx         context.Context // created on first use
	cancel      context.CancelCauseFunc
	endCause    error             // the context cause once ended
	onEnd       func(cause error) // run under mu when the lease ends (see OnEnd)
}

// newLease registers a fresh grant as a held lease. start is the clock
// reading taken before the request that produced g was sent.
// begin is when the Acquire call started (for the wait metric); contended
// says whether the key was found held on the way. k is the call: a grant
// it does not hand out is released within the call's overrun budget.
func (c *Client) newLease(ctx context.Context, k *call, begin, start time.Time, contended bool, cfg *callConfig, req driver.AcquireRequest, g driver.Grant) (*Lease, error) {
	if g.Key == "" {
		g.Key = req.Key
	}
	if g.Owner == "" {
		g.Owner = req.Owner
	}
	// One clock reading for the grant's arrival: it arms the timer,
	// judges lateness and ends the acquire's wait.
	granted := c.now()
	l := &Lease{c: c, key: req.Key, owner: req.Owner, label: cfg.label, parent: ctx, done: make(chan struct{}),
		ttl: cfg.ttl, baseIvl: cfg.interval, baseMargin: cfg.margin, rotateEvery: cfg.rotateEvery, minHold: cfg.minHold, lockDelay: cfg.lockDelay,
		meta: req.Metadata, releasing: make(chan struct{}, 1), grant: g, lastRotate: start, acquired: start, granted: granted}
	l.mu.Lock()
	l.setValidityLocked(start, g, granted)
	late := !granted.Before(l.validUntil)
	if late {
		l.state = released
		l.endLocked(errLateGrant)
	}
	l.mu.Unlock()
	if late {
		// The store's answer came after the grant's local validity had
		// already ended: by the holder's own rule it no longer holds the
		// key, and another client may already have it. Never hand out
		// such a lease; free the record (it is ours) and report a
		// transient failure.
		close(l.done)
		c.releaseGrantFor(k, g)
		return nil, errLateGrant
	}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		l.mu.Lock()
		l.state = released
		l.endLocked(ErrClosed)
		l.mu.Unlock()
		close(l.done)
		c.releaseGrantFor(k, g)
		return nil, ErrClosed
	}
	l.sched = renewal{l: l, idx: -1}
	c.leases[l] = &l.sched
	c.scheduleLocked(&l.sched, start.Add(l.interval), false)
	c.mu.Unlock()

	if c.loss != nil {
		stop := c.loss.NotifyLoss(g, func(cause error) { l.lose(cause) })
		l.mu.Lock()
		if l.state == held {
			l.stopLoss = stop
			stop = nil
		}
		l.mu.Unlock()
		if stop != nil {
			stop()
		}
	}
	c.emit(Event{Kind: EventAcquired, Key: l.key, Owner: l.owner, Token: g.Token, Wait: granted.Sub(begin), Contended: contended})
	return l, nil
}

// errLateGrant reports a grant whose local validity had ended by the time
// the store's answer arrived. It is transient: Acquire tries again.
var errLateGrant = fmt.Errorf("%w: the store answered after the grant's local validity (TTL − Margin) had ended", ErrLocalExpiry)

// setValidityLocked restarts the local-validity clock for a request sent
// at start that the store answered, at now, with grant g: the granted TTL,
// or the shorter time the store vouches for (g.Valid). When the store
// granted less than the lease's TTL (a ZooKeeper session negotiated
// shorter, say), the lease's renewal interval and margin shrink in
// proportion, so its schedule fits the TTL it really has.
func (l *Lease) setValidityLocked(start time.Time, g driver.Grant, now time.Time) {
	granted := g.TTL
	if g.Valid > 0 && (granted == 0 || g.Valid < granted) {
		granted = g.Valid
	}
	ttl := l.ttl
	l.interval, l.margin = l.baseIvl, l.baseMargin
	if granted > 0 && granted < ttl {
		l.interval = scaleDuration(l.baseIvl, granted, ttl)
		l.margin = scaleDuration(l.baseMargin, granted, ttl)
		ttl = granted
	}
	l.validUntil = start.Add(ttl - l.margin)
	l.dangerFired = false
	l.armLocked(now)
}

// scaleDuration returns d × num / den.
func scaleDuration(d, num, den time.Duration) time.Duration {
	return time.Duration(float64(d) * float64(num) / float64(den))
}

// armLocked sets the lease's one timer to its next point: the danger zone
// (one renewal interval before the end of validity) if OnDanger has not run
// for this validity period, else the end of validity.
func (l *Lease) armLocked(now time.Time) {
	d := l.validUntil.Sub(now)
	if !l.dangerFired {
		d = max(0, d-l.interval)
	}
	if l.timer == nil {
		l.timer = time.AfterFunc(d, l.onTimer)
	} else {
		l.timer.Reset(d)
	}
}

// endLocked stops the timer and records why the lease ended, cancelling
// its context if one was handed out.
func (l *Lease) endLocked(cause error) {
	if l.timer != nil {
		l.timer.Stop()
	}
	l.endCause = cause
	if l.cancel != nil {
		l.cancel(cause)
	}
	if l.onEnd != nil {
		l.onEnd(cause)
	}
}

func (l *Lease) onTimer() {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	now := l.c.now()
	if !now.Before(l.validUntil) {
		l.mu.Unlock()
		l.lose(ErrLocalExpiry)
		return
	}
	remaining := l.validUntil.Sub(now)
	danger := !l.dangerFired && remaining <= l.interval
	if danger {
		l.dangerFired = true
	}
	l.armLocked(now)
	l.mu.Unlock()
	if !danger {
		return // a stale firing after a renewal moved the deadline
	}
	l.c.emit(Event{Kind: EventDanger, Key: l.key, Owner: l.owner, Token: l.Token(), Remaining: remaining})
	if f := l.c.o.OnDanger; f != nil {
		f(l, remaining)
	}
}

// lose ends a held lease with the given cause. It is idempotent.
func (l *Lease) lose(cause error) {
	l.mu.Lock()
	if l.state != held {
		l.mu.Unlock()
		return
	}
	l.state = lost
	l.err = &LostError{Key: l.key, Token: l.grant.Token, Cause: cause}
	l.endLocked(l.err)
	// A rotating renewal still in flight may yet move our record to a
	// token we will never see.
	stop, g, unsure := l.stopLoss, l.grant, l.unsure || l.renewing
	l.stopLoss = nil
	l.mu.Unlock()

	c := l.c
	c.forget(l, false)
	// Observers hear of the loss before anyone can see Done closed.
	c.emit(Event{Kind: EventLost, Key: l.key, Owner: l.owner, Token: g.Token, Held: c.now().Sub(l.acquired), Err: l.Err()})
	close(l.done)
	if stop != nil {
		stop()
	}
	switch {
	case !errors.Is(cause, ErrNotHeld):
		// The store may still hold our record (we merely stopped
		// believing): free it early for the next holder, best effort —
		// by owner too if a rotation may have changed its token (a
		// ZooKeeper session keeps such a record alive as long as the
		// client lives). With a lock delay, not before the delay has
		// passed: a loss is an end without the holder's release, and a
		// release now would free the key at once, with no gap for a
		// write the holder still has in flight. A record store expires
		// the record into its gap meanwhile; a session store keeps the
		// key held until the release.
		delay := l.lockDelay
		c.goBackground(func() {
			if delay > 0 && c.sleep(c.life, delay) != nil {
				return // closing: the store expires it, or Close ends the session
			}
			c.releaseGrant(g)
			if unsure {
				c.abandon(driver.AcquireRequest{Key: g.Key, Owner: g.Owner})
			}
		})
	case unsure:
		// "Not held" after a rotation whose answer we never saw: the
		// record may be ours under the rotated token. Find it by owner.
		c.goBackground(func() { c.abandon(driver.AcquireRequest{Key: g.Key, Owner: g.Owner}) })
	}
}

// Key returns the lease's key.
func (l *Lease) Key() string { return l.key }

// Owner returns the owner string the store records for this lease: its
// label (WithLabel, or the client's Options.Owner) plus a suffix unique to
// the call.
func (l *Lease) Owner() string { return l.owner }

// Label returns the lease's owner label as given (WithLabel, or the
// client's Options.Owner); Info.Label returns the same for the store's
// record.
func (l *Lease) Label() string { return l.label }

// TTL returns the TTL the lease asks of the store at every renewal
// (WithTTL, or the client's Options.TTL).
func (l *Lease) TTL() time.Duration { return l.ttl }

// MinHold returns the lease's minimum hold (WithMinHold, or the client's
// Options.MinHold); 0 if none.
func (l *Lease) MinHold() time.Duration { return l.minHold }

// MinHoldEnd returns when the lease's minimum hold ends, by the client's
// Clock: when the store's grant arrived, plus MinHold (for a lease of an
// recipe's grant, when the grant was complete: see RestartMinHold). A release
// before then keeps the key until then. Zero without a minimum hold.
func (l *Lease) MinHoldEnd() time.Time {
	if l.minHold == 0 {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.granted.Add(l.minHold)
}

// Metadata returns a copy of the lease's metadata as the store last
// confirmed it: the WithMetadata payload, or the last successful
// SetMetadata's. nil if none.
func (l *Lease) Metadata() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.meta) == 0 {
		return nil
	}
	return append([]byte(nil), l.meta...)
}

// Token returns the lease's current fencing token. It changes only when
// Options.RotateEvery rotates it, and only upwards. Pass it with every
// write to the protected resource.
func (l *Lease) Token() Token {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grant.Token
}

// Done returns a channel that is closed when the lease ends: released, or
// lost (Err then says why).
func (l *Lease) Done() <-chan struct{} { return l.done }

// Context returns a context that is cancelled when the lease ends; its
// context.Cause is the *LostError, ErrReleased or ErrClosed. It carries the
// values of the context given to Acquire, but not its cancellation.
func (l *Lease) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithCancelCause(context.WithoutCancel(l.parent))
		if l.state != held {
			l.cancel(l.endCause)
		}
	}
	return l.ctx
}

// Err returns nil while the lease is held and after Release, and a
// *LostError (matching ErrLeaseLost) once the lease has been lost.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Remaining returns how long the lease stays valid by the holder's own
// clock if no further renewal succeeds; zero once it has ended.
func (l *Lease) Remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != held {
		return 0
	}
	return max(0, l.validUntil.Sub(l.c.now()))
}

// Release ends the lease: it stops renewal, cancels Context, and removes
// the record from the store if (and only if) this lease still owns it. The
// lease ends locally before the store is asked, so the holder stops
// believing it holds the lock first.
//
// Release returns ErrNotHeld if the lease was already released or lost
// (ErrClosed if Client.Close released it), or
// if the store no longer had this lease's record (it had expired or been
// taken: work done under the lease may not have been exclusive). If the
// store could not be reached, Release returns the error and may be called
// again: once a release attempt has failed, every later Release returns
// nil as soon as the record is gone, whether the first attempt, a retry
// or Client.Close removed it. The record expires with its TTL in any
// case.
//
// If ctx has already ended (a request's context, in a deferred Release),
// Release still asks the store, with a fresh context bounded by
// Options.ReleaseTimeout that carries ctx's values, so that a finished
// request does not leave its lock held until the TTL runs out. A ctx
// without a deadline is bounded by Options.ReleaseTimeout too.
func (l *Lease) Release(ctx context.Context) error { return l.release(ctx, ErrReleased) }

// errReleasedByClose is the context cause of a lease that Client.Close
// released: it matches both ErrReleased and ErrClosed.
var errReleasedByClose error = releasedByClose{}

type releasedByClose struct{}

func (releasedByClose) Error() string { return "fencelock: lease released by Client.Close" }

func (releasedByClose) Is(target error) bool { return target == ErrReleased || target == ErrClosed }

// release ends the lease with cause (ErrReleased, or ErrClosed when the
// client's Close releases it) and removes its record.
func (l *Lease) release(ctx context.Context, cause error) error {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = l.c.cleanupCtx(ctx)
		defer cancel()
	} else if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, l.c.o.ReleaseTimeout, l.c.releaseBound())
		defer cancel()
	}
	// One release of a lease at a time (the holder's and Close's), so
	// that each sees the outcome of the one before it instead of racing
	// it to the store and being told "not held" about its own record.
	select {
	case l.releasing <- struct{}{}:
		defer func() { <-l.releasing }()
	case <-ctx.Done():
		return ctx.Err()
	}
	l.mu.Lock()
	switch l.state {
	case lost:
		err := l.err
		l.mu.Unlock()
		<-l.done // closed right after the loss is reported
		return fmt.Errorf("%w: %w", ErrNotHeld, err)
	case released:
		pending, g, unsure, failed, cause := l.releasePending, l.grant, l.unsure, l.releaseFailed, l.endCause
		l.mu.Unlock()
		if !pending {
			switch {
			case failed:
				// Retries after a failed attempt succeed once the
				// record is gone, whoever removed it (the retry,
				// the first attempt, or Close).
				return nil
			case errors.Is(cause, ErrClosed):
				return ErrClosed // Close released it
			}
			return ErrNotHeld
		}
		start := l.c.releaseStart()
		err := l.c.releaseStore(ctx, g, unsure)
		if errors.Is(err, ErrNotHeld) {
			err = nil // an earlier, ambiguous attempt removed it
		}
		return l.finishRelease(ctx, start, err)
	}
	l.state = released
	// Released before its minimum hold has passed: the store keeps the
	// record until the window ends, instead of removing it now.
	windowEnd := l.granted.Add(l.minHold)
	hold := l.minHold > 0 && !l.unheld && l.c.now().Before(windowEnd)
	closing := errors.Is(cause, ErrClosed)
	if hold {
		cause = heldForMinimum{closed: closing}
	}
	l.releasePending = !hold
	// A renewal in flight may rotate the token after we read it: the
	// store's answer to this release may then be "not held" about our
	// own, rotated record.
	l.unsure = l.unsure || l.renewing
	var inFlight chan struct{} // the renewal a minimum hold must come after
	if hold && l.renewing {
		inFlight = l.renewed
	}
	l.endLocked(cause)
	stop, g, unsure, validUntil := l.stopLoss, l.grant, l.unsure, l.validUntil
	l.stopLoss = nil
	l.mu.Unlock()

	// From held to pending in one step, so that Close, whenever it
	// looks, finds the lease in one set or the other and waits for
	// this release before it closes the backend.
	l.c.forget(l, true)
	close(l.done)
	if stop != nil {
		stop()
	}
	if hold {
		return l.holdForMinimum(ctx, l.c.now(), g, unsure, windowEnd, inFlight, validUntil)
	}
	start := l.c.releaseStart()
	err := l.c.releaseStore(ctx, g, unsure)
	return l.finishRelease(ctx, start, err)
}

// heldForMinimum is the context cause of a lease released before its
// minimum hold passed: it matches ErrHeldForMinimum and ErrReleased, and
// ErrClosed too when Client.Close released it.
type heldForMinimum struct{ closed bool }

func (h heldForMinimum) Error() string {
	if h.closed {
		return ErrHeldForMinimum.Error() + " (released by Client.Close)"
	}
	return ErrHeldForMinimum.Error()
}

func (h heldForMinimum) Is(target error) bool {
	return target == ErrHeldForMinimum || target == ErrReleased || h.closed && target == ErrClosed
}

// holdForMinimum is Release of a lease whose minimum hold ends at end,
// still in the future: one renewal whose TTL is the rest of the window
// (so a record store expires the record then, even if this process dies),
// then, in the background, renewals of the same kind while the client
// lives (a session store, etcd or ZooKeeper, ties the record to the
// session and ignores the TTL), and the record's removal when the window
// ends. The lease has already ended for its holder.
//
// A renewal in flight at the release (inFlight, if not nil) asked for the
// lease's TTL, and may rotate the token. The hold renewal waits for its
// answer first, so that it renews the record as that renewal left it: a
// renewal applied while the hold renewal looks the record up by owner
// can leave a composite store (migrate.Dual) between two tokens for a
// moment, and the hold renewal would be told "not held" about its own
// record. The wait lasts until the lease's local validity ends at most
// (validUntil: the record lives at least that long, unless forced), Close
// begins, or ctx ends; then the hold renewal goes on (with a budget of its
// own if ctx ended),
// and keepUntil renews the record again once that renewal has its
// answer, for a renewal applied after the hold renewal cuts the record's
// life to the lease's TTL. keepUntil does so once more when the client
// is closing (Close waits for it). A renewal whose answer never came (a
// timeout) may still land later; then only a live client's keepUntil
// repairs it.
func (l *Lease) holdForMinimum(ctx context.Context, start time.Time, g driver.Grant, unsure bool, end time.Time, inFlight <-chan struct{}, validUntil time.Time) error {
	c := l.c
	if inFlight != nil {
		t := time.NewTimer(max(0, validUntil.Sub(c.now())))
		select {
		case <-inFlight:
			inFlight = nil
			// The renewal in flight may have rotated the record: renew
			// what it left (applyRenewal keeps its answer), not the
			// grant read before it.
			l.mu.Lock()
			g, unsure = l.grant, l.unsure
			l.mu.Unlock()
		case <-t.C:
		case <-c.life.Done():
			// Close has begun, and waits for this release before it
			// stops: renew now, while the backend is open; keepUntil
			// renews once more after the renewal's answer, and Close
			// waits for it.
		case <-ctx.Done():
			// The wait used ctx up: the hold renewal gets a budget
			// of its own.
			var cancel context.CancelFunc
			ctx, cancel = c.cleanupCtx(ctx)
			defer cancel()
		}
		t.Stop()
	}
	ng, sent, err := c.holdRenew(ctx, g, unsure, end)
	notHeld := errors.Is(err, ErrNotHeld)
	// The store was asked only once the lease's local validity had ended
	// (the renewal in flight held the hold renewal back, or the store
	// was slow): the record's TTL may have run out after the lease was
	// released, valid. That is the hold not kept, not a loss of the
	// lease: a failure of the release, whose record is gone (a second
	// Release returns nil), with nothing left to keep.
	expiredAfter := notHeld && !sent.Before(validUntil)
	if expiredAfter {
		err, notHeld = errHoldAfterValidity, false
	}
	l.mu.Lock()
	if err == nil {
		l.grant = mergeGrant(g, ng)
		g = l.grant
	} else if !notHeld {
		l.releaseFailed = true // a second Release returns nil
	}
	interval := l.interval
	l.mu.Unlock()
	c.mu.Lock()
	delete(c.pending, l)
	c.mu.Unlock()
	if !notHeld && !expiredAfter {
		retrying := err != nil
		c.goBackground(func() { c.keepUntil(g, interval, end, retrying, inFlight) })
	}
	err = c.wrap(ctx, "renew", err)
	now := c.now()
	ev := Event{Kind: EventReleased, Key: l.key, Owner: l.owner, Token: g.Token, Held: now.Sub(l.acquired), Latency: now.Sub(start), Err: err}
	if err != nil && !notHeld {
		ev.Kind = EventReleaseFailed
	}
	c.emit(ev)
	return err
}

// errHoldAfterValidity is Release's error when the minimum hold's
// renewal reached the store only after the lease's local validity had
// ended, and the store no longer had the record.
var errHoldAfterValidity = fmt.Errorf("%w: the minimum hold's renewal reached the store after the lease's local validity (TTL − Margin) had ended, and its record had expired: the key was not kept for the rest of the hold (the lease was released while valid)", ErrLocalExpiry)

// holdRenew renews g with the rest of the window until end as its TTL (at
// least MinTTL). When unsure (a rotation of g may have taken effect
// unseen) and the store answers "not held", it looks the key up and
// renews the record if its owner is g's, as releaseStore does. sent is
// when the request whose answer it returns was sent (by the client's
// Clock).
func (c *Client) holdRenew(ctx context.Context, g driver.Grant, unsure bool, end time.Time) (ng driver.Grant, sent time.Time, err error) {
	sent = c.now()
	req := driver.RenewRequest{TTL: max(MinTTL, end.Sub(sent))}
	ng, err = c.b.Renew(ctx, g, req)
	if !unsure || !errors.Is(err, ErrNotHeld) {
		return ng, sent, err
	}
	info, ierr := c.b.Inspect(ctx, g.Key)
	if ierr != nil {
		return ng, sent, ierr
	}
	if info.Owner != g.Owner {
		return ng, sent, err
	}
	// The record under its rotated token, as releaseStore sends it: a
	// fresh grant with no Handle, because g's Handle names the old token
	// (a backend that keeps state in it, such as migrate.Dual, refuses a
	// token its Handle does not match).
	sent = c.now()
	ng, err = c.b.Renew(ctx, driver.Grant{Key: g.Key, Owner: g.Owner, Token: info.Token}, req)
	return ng, sent, err
}

// keepUntil keeps the record of a lease released during its minimum hold
// until end: it renews it every interval with the rest of the window as
// TTL (retrying failures with backoff when retrying), and at once when
// the renewal in flight at the release (inFlight) has its answer, then removes it by
// owner. It stops early when the store has no record of this owner, or
// when the client closes (a record store then expires the record at end).
func (c *Client) keepUntil(g driver.Grant, interval time.Duration, end time.Time, retrying bool, inFlight <-chan struct{}) {
	backoff := c.o.MinBackoff
	for {
		now := c.now()
		if !now.Before(end) {
			c.abandon(driver.AcquireRequest{Key: g.Key, Owner: g.Owner})
			return
		}
		wait := interval
		if retrying {
			wait = jitter(backoff)
		}
		t := time.NewTimer(min(wait, end.Sub(now)))
		select {
		case <-c.life.Done():
			t.Stop()
			if inFlight != nil {
				// Closing while the renewal in flight at the release
				// has no answer yet: once it has one, renew the
				// record for the rest of the window one last time
				// (Close waits for this goroutine before it closes
				// the backend), unless Close's budget ends first.
				select {
				case <-inFlight:
				case <-c.drain.Done():
					return
				}
				if c.now().Before(end) {
					ctx, cancel := context.WithTimeout(c.drain, c.o.ReleaseTimeout)
					_, _, _ = c.holdRenew(ctx, g, true, end)
					cancel()
				}
			}
			return
		case <-t.C:
		case <-inFlight:
			// The renewal in flight at the release has its answer: it
			// may have cut the record's life to the lease's TTL.
			t.Stop()
			inFlight = nil
		}
		if !c.now().Before(end) {
			continue
		}
		// A rotating renewal that was in flight when the lease was
		// released may reach the store after the first hold renewal
		// and move the record to a token this loop never saw: "not
		// held" is then answered by looking the record up by owner
		// (unique per lease).
		ctx, cancel := context.WithTimeout(c.life, c.o.ReleaseTimeout)
		ng, _, err := c.holdRenew(ctx, g, true, end)
		cancel()
		switch {
		case errors.Is(err, ErrNotHeld):
			return
		case err != nil:
			retrying = true
			backoff = min(2*backoff, interval)
			c.emit(Event{Kind: EventRenewFailed, Key: g.Key, Owner: g.Owner, Token: g.Token, Err: c.wrap(context.Background(), "renew", err)})
		default:
			g = mergeGrant(g, ng)
			retrying, backoff = false, c.o.MinBackoff
		}
	}
}

// mergeGrant returns a renewal's answer ng, completed with old's key,
// owner and handle where the backend left them empty.
func mergeGrant(old, ng driver.Grant) driver.Grant {
	if ng.Key == "" {
		ng.Key, ng.Owner = old.Key, old.Owner
	}
	if ng.Handle == "" {
		ng.Handle = old.Handle
	}
	return ng
}

// releaseStore releases g. When unsure (a rotation of g may have taken
// effect unseen) and the store answers "not held", it looks the key up and
// releases the record if its owner is g's: owners are unique per lease, so
// that record is g's own under a rotated token.
func (c *Client) releaseStore(ctx context.Context, g driver.Grant, unsure bool) error {
	err := c.releaseOnce(ctx, g)
	if !unsure || !errors.Is(err, ErrNotHeld) {
		return err
	}
	info, ierr := c.b.Inspect(ctx, g.Key)
	if ierr != nil {
		return ierr
	}
	if info.Owner != g.Owner {
		return err
	}
	return c.releaseOnce(ctx, driver.Grant{Key: g.Key, Owner: g.Owner, Token: info.Token})
}

// retryRelease retries a failed release in the background, with capped
// backoff, until the store answers (the record removed, or gone already),
// or the client closes (Close retries it then). A record store expires
// the record in any case, but a session store (ZooKeeper, etcd) keeps it
// alive as long as the client lives: without a retry one failed release
// would block the key until then. One retry loop per lease.
func (l *Lease) retryRelease() {
	l.mu.Lock()
	if l.releaseRetrying {
		l.mu.Unlock()
		return
	}
	l.releaseRetrying = true
	l.mu.Unlock()
	l.c.retryInBackground(func() bool {
		l.mu.Lock()
		pending := l.releasePending
		l.mu.Unlock()
		if pending {
			ctx, cancel := context.WithTimeout(l.c.life, l.c.o.ReleaseTimeout)
			err := l.release(ctx, ErrReleased) // the pending path: a retry
			cancel()
			pending = err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrClosed)
		}
		if !pending {
			l.mu.Lock()
			l.releaseRetrying = false
			l.mu.Unlock()
		}
		return !pending
	})
}

// releaseStart returns the clock reading a release's event measures its
// latency from, or the zero time if no release event reaches anyone
// (neither an Observer nor the Logger at their levels): a clock reading
// is a noticeable part of an uncontended acquire + release, and one that
// nobody sees need not be taken.
func (c *Client) releaseStart() time.Time {
	// EventReleaseFailed's level (Warn) is also a release's with an error.
	if !c.listens(Event{Kind: EventReleased}) && !c.listens(Event{Kind: EventReleaseFailed}) {
		return time.Time{}
	}
	return c.now()
}

// finishRelease records the outcome of a release whose store request
// began at start (zero if not measured) and reports it.
func (l *Lease) finishRelease(ctx context.Context, start time.Time, err error) error {
	l.mu.Lock()
	done := err == nil || errors.Is(err, ErrNotHeld)
	if done {
		l.releasePending = false
	} else {
		l.releaseFailed = true
	}
	l.mu.Unlock()
	l.c.mu.Lock()
	if done {
		delete(l.c.pending, l)
	} else {
		l.c.pending[l] = struct{}{} // Close retries it
	}
	l.c.mu.Unlock()
	if !done {
		l.retryRelease()
	}
	err = l.c.wrap(ctx, "release", cutShort(ctx, err))
	ev := Event{Kind: EventReleased, Key: l.key, Owner: l.owner, Token: l.Token(), Err: err}
	if err != nil && !errors.Is(err, ErrNotHeld) {
		ev.Kind = EventReleaseFailed
	}
	if l.c.listens(ev) {
		now := l.c.now()
		ev.Held = now.Sub(l.acquired)
		if !start.IsZero() {
			ev.Latency = now.Sub(start)
		}
		l.c.emit(ev)
	}
	return err
}

// metaUpdate is a SetMetadata waiting for (or carried by) a renewal.
type metaUpdate struct {
	data      []byte
	done      chan error // buffered: receives the outcome once
	cancelled bool       // SetMetadata returned early (guarded by l.mu)
}

// answer gives a SetMetadata the outcome of the renewal that carried u:
// nil if the store stored it (and the lease is held), else the error
// Release would give for the lease's state.
func (l *Lease) answer(u *metaUpdate, stored bool) {
	if u == nil {
		return
	}
	var err error
	if !stored {
		err = l.notHeldErr()
	}
	u.done <- err
}

// notHeldErr is what a call on an ended lease returns, as Release does:
// ErrNotHeld (or ErrClosed if Client.Close released it) after a release,
// ErrNotHeld joined with the *LostError after a loss; nil while held.
func (l *Lease) notHeldErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.notHeldErrLocked()
}

func (l *Lease) notHeldErrLocked() error {
	switch l.state {
	case lost:
		return fmt.Errorf("%w: %w", ErrNotHeld, l.err)
	case released:
		if errors.Is(l.endCause, ErrClosed) {
			return ErrClosed
		}
		return ErrNotHeld
	}
	return nil
}

func (l *Lease) SetMetadata(ctx context.Context, b []byte) error {
	if err := driver.ValidateMetadata(b); err != nil {
		return err
	}
	if len(b) == 0 {
		b = nil
	} else {
		b = append([]byte(nil), b...)
	}
	l.mu.Lock()
	if l.metaMu == nil {
		l.metaMu = make(chan struct{}, 1)
	}
	metaMu := l.metaMu
	l.mu.Unlock()
	select {
	case metaMu <- struct{}{}:
		defer func() { <-metaMu }()
	case <-ctx.Done():
		return ctx.Err()
	}
	u := &metaUpdate{data: b, done: make(chan error, 1)}
	l.mu.Lock()
	if err := l.notHeldErrLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	l.metaReq = u
	l.mu.Unlock()
	l.c.renewSoon(l)
	var end <-chan struct{} = l.done
	for {
		select {
		case err := <-u.done:
			return err
		case <-end:
			// Ended: if no renewal took the update, it never will.
			l.mu.Lock()
			pending := l.metaReq == u
			if pending {
				l.metaReq = nil
			}
			err := l.notHeldErrLocked()
			l.mu.Unlock()
			if pending {
				return err
			}
			end = nil // the renewal carrying it answers
		case <-ctx.Done():
			l.mu.Lock()
			if l.metaReq == u {
				l.metaReq = nil
			}
			u.cancelled = true
			l.mu.Unlock()
			return ctx.Err()
		}
	}
}
