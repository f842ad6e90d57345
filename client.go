package fencelock

import (
	"container/heap"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// Client acquires leases from one Backend. It is safe for concurrent use by
// any number of goroutines. Close it to release what it holds and stop its
// goroutines.
type Client struct {
	b    Backend
	name string
	o    Options

	// Optional capabilities, discovered once.
	waiter  driver.Waiter
	watcher driver.Watcher
	batch   driver.BatchRenewer
	loss    driver.LossNotifier
	forcer  driver.ForceReleaser
	co      coalescing // lanes of coalesced acquires and releases

	ownerSuffix string // "/" + a random nonce + ".", after a lease's label
	seq         atomic.Uint64

	life    context.Context // cancelled when Close begins
	endLife context.CancelFunc
	// drain bounds every clean-up request (abandon, releaseGrant, the
	// releases of Close): it ends when Close's budget,
	// Options.ReleaseTimeout after Close began, has passed.
	drain    context.Context
	endDrain context.CancelCauseFunc

	mu      sync.Mutex
	closed  bool                // no new leases
	stopped bool                // no new background work
	leases  map[*Lease]*renewal // held leases, with their scheduler entries
	pending map[*Lease]struct{} // released leases whose store release failed
	calls   sync.WaitGroup      // Acquire and TryAcquire calls in flight
	calling map[uint64]callEnds // how Close ends each, by call number
	callSeq uint64              // the last call number
	queue   renewalQueue        // entries of held leases not being renewed, by due time
	armed   time.Time           // when the scheduler's timer fires; zero if unset
	wake    chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup

	pokes atomic.Uint64 // wakes sent to the scheduler (tests read it)

	ttlBound *requestBound // the cause of a request bounded by Options.TTL, made once
	rtBound  *requestBound // the cause of one bounded by Options.ReleaseTimeout
}

// New returns a Client that acquires leases from b. The Client owns b: its
// Close closes b. A nil opts means defaults; invalid options return an
// *InvalidOptionError. With Options.Require, New measures the required
// guarantees on b's server (within Options.ReleaseTimeout) and returns an
// *driver.UnmetGuaranteeError if any is not met; b is then left open for the
// caller to close.
func New(b Backend, opts *Options) (*Client, error) {
	return newClient(nil, b, opts)
}

// newClient is New, measuring Options.Require within ctx (nil: within
// ReleaseTimeout).
func newClient(ctx context.Context, b Backend, opts *Options) (*Client, error) {
	if b == nil {
		return nil, errors.New("fencelock: New: nil Backend")
	}
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if err := requireAtOpen(ctx, b, &o); err != nil {
		return nil, err
	}
	var nonce [6]byte
	_, _ = crand.Read(nonce[:])
	c := &Client{
		b:           b,
		name:        "backend",
		o:           o,
		ownerSuffix: "/" + hex.EncodeToString(nonce[:]) + ".",
		leases:      make(map[*Lease]*renewal),
		pending:     make(map[*Lease]struct{}),
		calling:     make(map[uint64]callEnds),
		wake:        make(chan struct{}, 1),
		stop:        make(chan struct{}),
	}
	c.ttlBound = &requestBound{ttl: o.TTL}
	c.rtBound = &requestBound{ttl: o.ReleaseTimeout, what: "Options.ReleaseTimeout"}
	c.life, c.endLife = context.WithCancel(context.Background())
	c.drain, c.endDrain = context.WithCancelCause(context.Background())
	c.waiter, _ = b.(driver.Waiter)
	c.watcher, _ = driver.Watches(b)
	c.batch, _ = b.(driver.BatchRenewer)
	c.loss, _ = b.(driver.LossNotifier)
	c.forcer, _ = b.(driver.ForceReleaser)
	c.setUpCoalescing(b)
	if d, ok := b.(driver.Describer); ok {
		if n := d.Describe().Name; n != "" {
			c.name = n
		}
	}
	c.wg.Add(1)
	go c.schedule()
	return c, nil
}

// Options returns the client's options with every default filled in.
func (c *Client) Options() Options { return c.o }

// Backend returns the backend the client was created with.
func (c *Client) Backend() Backend { return c.b }

// Describe returns the backend's description of its guarantees, or one
// with only a Name if the backend does not describe itself.
func (c *Client) Describe() driver.Description {
	if d, ok := c.b.(driver.Describer); ok {
		return d.Describe()
	}
	return driver.Description{Name: c.name}
}

// newOwner returns a fresh owner string for one call: label, the client's
// nonce and a call number (see driver.OwnerLabel). A call whose grant it
// released (a late grant, errLateGrant) takes a fresh one for its next
// attempt: owners are unique per lease (Lease.Owner, Leader.Owner), and
// the store's next grant is another lease, which an observer that saw the
// released one go must be able to tell from it.
func (c *Client) newOwner(label string) string {
	return label + c.ownerSuffix + strconv.FormatUint(c.seq.Add(1), 10)
}

func (c *Client) now() time.Time { return c.o.Clock.Now() }

// definite reports whether err is an answer rather than a failure.
func definite(err error) bool {
	return errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrNotHeld) ||
		errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrInvalidOption) ||
		errors.Is(err, ErrUnsupported) || errors.Is(err, ErrClosed)
}

// wrap wraps a backend failure once; answers pass through unchanged. A
// context error after ctx ended is ctx's error, joined with the store's
// cause if the engine cut the request short (see cutShort).
func (c *Client) wrap(ctx context.Context, op string, err error) error {
	if err == nil || definite(err) {
		return err
	}
	if ctx.Err() != nil && isCtxErr(err) {
		if ctxOnly(err) {
			return ctx.Err()
		}
		return errors.Join(ctx.Err(), c.wrap(context.Background(), op, err))
	}
	var be *BackendError
	if errors.As(err, &be) {
		return err
	}
	return &BackendError{Backend: c.name, Op: op, Err: err}
}

// call is a call registered by beginCall; end must be called when it
// returns.
type call struct {
	c    *Client
	id   uint64
	ends callEnds
	stop func() bool // stops the watch of the caller's context, or nil
}

// callEnds is how a call is ended: its bound context at once, its
// attempts' context (if any) Options.ReleaseTimeout later.
type callEnds struct {
	bound          context.CancelCauseFunc
	attempts       context.Context // the backend requests' context (see attempt), or nil
	cancelAttempts context.CancelCauseFunc
}

// end ends the call with cause: its bound context at once, and its
// attempts' context once the call's overrun budget, Options.ReleaseTimeout,
// has passed: the budget an attempt in flight has to be answered and the
// clean-up after it share (see cleanUp). The call's own end (call.end)
// cancels the attempts' context sooner; the grace timer is then stopped,
// so that a cancelled call does not keep its contexts (and the caller's
// values) alive for the rest of ReleaseTimeout.
//
// Close ends its calls with three quarters of its budget, overrun: their
// clean-up has the last quarter before Close's budget ends (see
// Client.Close).
func (e callEnds) end(cause error, overrun time.Duration) {
	e.bound(cause)
	if e.cancelAttempts != nil {
		t := time.AfterFunc(overrun, func() { e.cancelAttempts(errOverrun) })
		context.AfterFunc(e.attempts, func() { t.Stop() })
	}
}

// cancel releases both contexts at once.
func (e callEnds) cancel() {
	e.bound(nil)
	if e.cancelAttempts != nil {
		e.cancelAttempts(nil)
	}
}

// beginCall is begin without a closure to allocate: Close finds the
// call's ends in c.calling (instead of a callback on c.life for every
// call) and ends it with ErrClosed. With attempts, the call also gets the
// context its backend requests run on (see attempt): ctx's values without
// its cancellation, ended Options.ReleaseTimeout after ctx ends or Close
// begins.
func (c *Client) beginCall(ctx context.Context, attempts bool) (context.Context, call, error) {
	bound, cancel := context.WithCancelCause(ctx)
	k := call{c: c, ends: callEnds{bound: cancel}}
	if attempts {
		k.ends.attempts, k.ends.cancelAttempts = context.WithCancelCause(context.WithoutCancel(ctx))
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		k.ends.cancel()
		return nil, call{}, ErrClosed
	}
	c.calls.Add(1)
	c.callSeq++
	k.id = c.callSeq
	c.calling[k.id] = k.ends
	c.mu.Unlock()
	if attempts && ctx.Done() != nil {
		ends := k.ends
		k.stop = context.AfterFunc(ctx, func() { ends.end(context.Cause(ctx), c.o.ReleaseTimeout) })
	}
	return bound, k, nil
}

// end unregisters the call and releases its contexts.
func (k call) end() {
	if k.stop != nil {
		k.stop()
	}
	k.c.mu.Lock()
	delete(k.c.calling, k.id)
	k.c.mu.Unlock()
	k.ends.cancel()
	k.c.calls.Done()
}

// closedErr turns the error of a call whose bound context ctx ended
// because the client was closed (and not because the caller's parent
// context ended) into ErrClosed.
func closedErr(parent, ctx context.Context, err error) error {
	if err != nil && parent.Err() == nil && errors.Is(context.Cause(ctx), ErrClosed) {
		return ErrClosed
	}
	return err
}

// ended returns the error for a wait whose context ended: ctx's error,
// joined with the last failure of the store, if any, so that a caller
// whose deadline passed while the store was unreachable learns why
// (errors.Is matches both). A last that is already ctx's error joined
// with a failure (a recipe's Call.Outcome given what its Pause returned)
// is returned as it is, its failure kept.
func (c *Client) ended(ctx context.Context, last error) error {
	err := ctx.Err()
	if last == nil || definite(last) {
		return err
	}
	if j, ok := last.(interface{ Unwrap() []error }); ok && slices.Contains(j.Unwrap(), err) {
		return last
	}
	if ctxOnly(last) {
		return err
	}
	return errors.Join(err, c.wrap(context.Background(), "acquire", last))
}

// TryAcquire makes one attempt to take key. If the key is held by someone
// else it returns an error matching ErrNotAcquired (a *HeldError that names
// the holder where the backend knows it). The attempt is bounded by the
// call's TTL: a store that has not answered by then is reported as a
// failure matching context.DeadlineExceeded. If ctx ends while the
// attempt is in flight, TryAcquire waits for the store's answer (a server
// may apply a request after its sender gave up) and releases a grant that
// comes after ctx ended. If the attempt's outcome is unknown (no answer,
// or the backend failed mid-request), TryAcquire removes any record it
// may have left. The wait for the answer and that clean-up share one
// budget, Options.ReleaseTimeout, after ctx ends: TryAcquire returns
// within the TTL plus ReleaseTimeout, and by ctx's deadline plus
// ReleaseTimeout; clean-up still unfinished then goes on in the
// background (Close waits for it). After ctx ended, the error is ctx's,
// joined with the store's failure if any. opts override the Client's
// Options for this call (WithWait does not apply: TryAcquire never
// waits).
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	cfg, err := c.resolveCall(opts)
	if err != nil {
		return nil, err
	}
	parent := ctx
	ctx, k, err := c.beginCall(ctx, true)
	if err != nil {
		return nil, err
	}
	defer k.end()
	req := cfg.request(key, c.newOwner(cfg.label))
	start := c.now()
	g, err := c.attempt(ctx, &k, req, time.Time{})
	if err == nil {
		var l *Lease
		if l, err = c.newLease(parent, &k, start, start, false, &cfg, req, g); err == nil || errors.Is(err, ErrClosed) {
			return l, err
		}
	}
	if !definite(err) {
		c.abandonFor(&k, req)
	}
	err = closedErr(parent, ctx, c.wrap(ctx, "acquire", err))
	kind := EventAcquireFailed
	if errors.Is(err, ErrNotAcquired) {
		kind = EventNotAcquired
	}
	c.emit(Event{Kind: kind, Key: key, Owner: req.Owner, Wait: c.now().Sub(start), Err: err})
	return nil, err
}

// Acquire takes key, waiting while someone else holds it, until it is held
// or ctx ends. It waits with the backend's queue (etcd, ZooKeeper) or
// notifications (PostgreSQL, Redis) where available, and otherwise polls
// with capped exponential backoff and jitter, never longer than until the
// holder's record is due to expire. Transient backend failures are retried;
// every request is bounded by the call's TTL. If ctx has no deadline (and
// no WithWait applies), Acquire gives up once the store has failed
// (errors, requests without an answer) continuously for the call's TTL,
// and returns a *BackendError that wraps the store's last failure. When
// ctx ends first, Acquire returns ctx's error (joined with the store's
// last failure, if the store was failing) and leaves nothing behind in the
// backend: an attempt in flight then is answered first (as in TryAcquire),
// and records or queue entries of its attempts are removed, all within
// one budget, Options.ReleaseTimeout, after ctx ends (clean-up still
// unfinished then goes on in the background; Close waits for it). opts
// override the Client's Options for this call; with WithWait, Acquire
// gives up when the bound passes, with an error matching ErrNotAcquired.
func (c *Client) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lease, error) {
	cfg, err := c.resolveCall(opts)
	if err != nil {
		return nil, err
	}
	parent := ctx
	if cfg.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, cfg.wait, errWaitBound)
		defer cancel()
	}
	ctx, k, err := c.beginCall(ctx, true)
	if err != nil {
		return nil, err
	}
	defer k.end()
	req := cfg.request(key, c.newOwner(cfg.label))
	var f failing
	if _, ok := ctx.Deadline(); !ok {
		f.limit = cfg.ttl
	}
	begin := c.now()
	g, err := c.attempt(ctx, &k, req, time.Time{})
	if err == nil {
		l, lerr := c.newLease(parent, &k, begin, begin, false, &cfg, req, g)
		if !errors.Is(lerr, errLateGrant) {
			return l, lerr
		}
		err = lerr // released; wait and try again, as another lease
		req.Owner = c.newOwner(cfg.label)
	}
	var l *Lease
	contended := errors.Is(err, ErrNotAcquired)
	if contended && ctx.Err() == nil {
		c.emit(Event{Kind: EventWaiting, Key: key, Owner: req.Owner, Err: err})
	}
	if !definite(err) {
		f.failed(begin, err)
	}
	switch {
	case definite(err) && !errors.Is(err, ErrNotAcquired):
	case ctx.Err() != nil:
		c.abandonFor(&k, req)
		err = c.ended(ctx, err)
	case f.over(c.now()):
		c.abandonFor(&k, req)
		err = c.gaveUp(ctx, &f)
	default:
		if c.waiter != nil {
			l, err = c.acquireQueued(ctx, parent, &k, begin, &cfg, req, &f)
		} else {
			l, err = c.acquirePolling(ctx, parent, &k, begin, &cfg, req, err, &f)
		}
	}
	err = waitBoundErr(parent, ctx, cfg.wait, closedErr(parent, ctx, err))
	if err != nil {
		c.emit(Event{Kind: EventAcquireFailed, Key: key, Owner: req.Owner, Wait: c.now().Sub(begin), Contended: contended, Err: err})
	}
	return l, err
}

// acquireQueued waits in the backend's queue. parent is the caller's
// context, whose values the lease carries. The confirmation of a grant
// runs on k's attempt context, as an attempt does (see attempt). Each
// wait in the queue is bounded by the call's TTL, like any request: a
// wait that ends so is followed by one Inspect, which tells a key held
// that long (the store answers: queue again at once) from a store that
// fell silent (a failure, as f counts them).
func (c *Client) acquireQueued(ctx, parent context.Context, k *call, begin time.Time, cfg *callConfig, req driver.AcquireRequest, f *failing) (*Lease, error) {
	b := c.newBackoff()
	last := f.last // the first attempt's failure, if it failed
	// endOfWait reports whether the call ends before queueing again:
	// the caller's context ended, or (without a deadline) the store
	// failed for the whole window; waitErr abandons the call and
	// returns its error.
	endOfWait := func() bool { return ctx.Err() != nil || f.over(c.now()) }
	waitErr := func() error {
		c.abandonFor(k, req)
		if ctx.Err() != nil {
			return c.ended(ctx, last)
		}
		return c.gaveUp(ctx, f)
	}
	for {
		wstart := c.now()
		wctx, cancel := c.requestCtx(ctx, cfg.ttl, f.until())
		g, err := c.waiter.AcquireWait(wctx, req)
		err = cutShort(wctx, err)
		cancel()
		if err == nil {
			// Confirm the grant so the local-validity clock starts
			// before a request the store answered.
			start := c.now()
			rctx, cancel := c.requestCtx(k.ends.attempts, cfg.ttl, f.until())
			g2, err := c.b.Renew(rctx, g, driver.RenewRequest{TTL: req.TTL})
			err = cutShort(rctx, err)
			cancel()
			if err == nil && ctx.Err() != nil {
				// The caller gave up while the confirmation was on its
				// way: the lease is never handed out.
				c.abandonFor(k, req)
				return nil, c.ended(ctx, last)
			}
			if err == nil {
				l, err := c.newLease(parent, k, begin, start, true, cfg, req, g2)
				if !errors.Is(err, errLateGrant) {
					return l, err
				}
				last = err // released by newLease; queue again
				f.failed(start, err)
				// The next grant is another lease: another owner.
				req.Owner = c.newOwner(cfg.label)
			} else if !errors.Is(err, ErrNotHeld) {
				// The confirmation's outcome is unknown: it may have
				// re-put our entry under a new token (etcd). Remove it
				// by its provisional grant and, if the store shows us
				// as the holder under another token, by owner.
				owner := req
				c.cleanUp(k, func() {
					c.releaseGrant(g)
					c.abandon(owner)
				})
				last = err
				f.failed(start, err)
				// If that clean-up failed it goes on in the
				// background, by owner: a grant under this owner
				// handed out later would be removed by it. Queue
				// again as a new contender.
				req.Owner = c.newOwner(cfg.label)
			} else {
				f.answered()
			}
			if endOfWait() {
				return nil, waitErr()
			}
			continue
		}
		var na *noAnswerError
		if !ctxOnly(err) && !errors.As(err, &na) {
			// A wait cut at its bound is no failure by itself (the
			// key may be held that long): the Inspect below tells,
			// and sets the cause. A caller's end at the same
			// instant must not report it.
			last = err
		}
		if ctx.Err() != nil {
			// AcquireWait removed its own queue entry; an earlier
			// attempt with an unknown outcome (a lost reply) may have
			// left a record that a session keeps alive: by owner.
			c.abandonFor(k, req)
			return nil, c.ended(ctx, last)
		}
		if definite(err) && !errors.Is(err, ErrNotAcquired) {
			return nil, err
		}
		switch {
		case errors.Is(err, ErrNotAcquired):
			f.answered()
		case errors.As(err, &na):
			// The wait's bound passed without a grant: the key is
			// held that long, or the store fell silent. Ask, with
			// a bound of its own: a store that answers ends a run
			// of failures, even one that began before this wait.
			pstart := c.now()
			pctx, cancel := c.requestCtx(ctx, cfg.ttl, time.Time{})
			info, perr := c.b.Inspect(pctx, req.Key)
			perr = cutShort(pctx, perr)
			cancel()
			if perr != nil && definite(perr) || perr == nil && info.Locked() {
				// The store answers, the key is held: queue again.
				// The wait's bound passing was no failure, so it
				// is no cause to report if the caller's end comes
				// next.
				f.answered()
				last = nil
				continue
			}
			if perr == nil {
				// The store answers reads, but its queue did not
				// grant a free key for a whole bound (a watch or
				// session that stopped working): a failure (the
				// run's start, if no run is under way). A run as
				// long as the call's TTL ends a call without a
				// deadline (the next wait is cut to the window),
				// so that such a queue cannot keep it waiting
				// forever; a key freed just as the bound passed
				// costs one failure, which the next grant ends.
				f.failed(pstart, err)
				last = err
				if endOfWait() {
					return nil, waitErr()
				}
				continue
			}
			if ctx.Err() != nil {
				// An Inspect the caller's end cut short says no more
				// than that: the cause is the wait's (last).
				if !ctxOnly(perr) {
					last = perr
				}
				c.abandonFor(k, req)
				return nil, c.ended(ctx, last)
			}
			err = perr
			f.failed(pstart, err)
		default:
			f.failed(wstart, err)
		}
		last = err
		if f.over(c.now()) {
			c.abandonFor(k, req)
			return nil, c.gaveUp(ctx, f)
		}
		c.emit(Event{Kind: EventAcquireRetry, Key: req.Key, Owner: req.Owner, Err: err})
		// err may name a lock delay: no release announces its end, so
		// the backoff wakes when it does (see soonestExpiry).
		if err := c.sleep(ctx, f.wait(c.now(), b.next(err))); err != nil {
			c.abandonFor(k, req)
			return nil, c.ended(ctx, last)
		}
		b.grow()
	}
}

// acquirePolling retries Acquire, woken by the backend's notifications when
// it has them, with capped exponential backoff as the safety net. f
// counts the store's failures (see failing).
func (c *Client) acquirePolling(ctx, parent context.Context, k *call, begin time.Time, cfg *callConfig, req driver.AcquireRequest, last error, f *failing) (*Lease, error) {
	var notify <-chan struct{}
	if c.watcher != nil {
		// The subscription lives as long as the call; subscribing is a
		// request, bounded as one: the subscription is cancelled if
		// Watch has not returned by then.
		wctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		bound := &requestBound{ttl: cfg.ttl}
		t := time.AfterFunc(f.wait(c.now(), cfg.ttl), func() { cancel(bound) })
		ch, err := c.watcher.Watch(wctx, req.Key)
		err = cutShort(wctx, err)
		t.Stop()
		if err == nil {
			notify = ch
		} else {
			c.emit(Event{Kind: EventAcquireRetry, Key: req.Key, Owner: req.Owner, Err: c.wrap(ctx, "watch", err)})
		}
	}
	b := c.newBackoff()
	ambiguous := !errors.Is(last, ErrNotAcquired)
	contended := !ambiguous
	// With a fresh subscription, try again at once: the key may have been
	// released between the first attempt and the subscription.
	immediate := notify != nil
	// woke: this attempt follows a notification. quiet: the last one
	// followed a notification and brought no news: it found a holder this
	// call had seen before (or one the store did not name), so the
	// notification was about a change that did not free the key (a
	// composite backend such as migrate.Dual taking and giving back one
	// side, maybe this waiter's own attempt, or another waiter's, whose
	// brief grant it then found), or it came late, about a release the
	// attempt before had already seen past. While quiet, a notification
	// leads to an attempt only after a pause (pause, doubled at every such
	// wake-up, back to MinBackoff when an attempt finds a holder not seen
	// before, or after a whole backoff round without any notification):
	// waiters woken by their own or each other's attempts do not spin the
	// store, and a late notification does not make the waiter miss the
	// release that comes next for longer than the pause. Owners are unique
	// per lease, so a new holder is a new owner.
	woke, quiet := false, false
	pause := c.o.MinBackoff
	var seen holdersSeen
	seen.fresh(last)
	for {
		if !immediate {
			wait := f.wait(c.now(), b.next(last))
			t := time.NewTimer(wait)
			deadline := time.Now().Add(wait)
			wake, paused := notify, false
			for done := false; !done; {
				select {
				case <-ctx.Done():
					t.Stop()
					if ambiguous {
						c.abandonFor(k, req)
					}
					return nil, c.ended(ctx, last)
				case _, ok := <-wake:
					switch {
					case !ok:
						// The watch ended: try at once, then poll.
						notify = nil
						woke, done = false, true
					case quiet:
						// Maybe a change that did not free the key:
						// try after the pause (or the timer, if
						// sooner), listening no more this round.
						if p := jitter(pause); p < time.Until(deadline) {
							t.Reset(p)
						}
						pause = min(2*pause, c.o.MaxBackoff)
						wake, paused = nil, true
					default:
						// Try at once; the safety-net backoff keeps
						// growing, so a waiter that loses the race
						// does not poll hard.
						woke, done = true, true
					}
				case <-t.C:
					b.grow()
					if !paused && wake != nil {
						// A whole round without a notification:
						// the next one is worth an attempt soon.
						pause = c.o.MinBackoff
					}
					woke, done = paused, true
				}
			}
			t.Stop()
		}
		immediate = false
		if f.over(c.now()) {
			if ambiguous {
				c.abandonFor(k, req)
			}
			return nil, c.gaveUp(ctx, f)
		}
		start := c.now()
		g, err := c.attempt(ctx, k, req, f.until())
		if err == nil {
			l, err := c.newLease(parent, k, begin, start, contended, cfg, req, g)
			if !errors.Is(err, errLateGrant) {
				return l, err
			}
			last, ambiguous = err, false // newLease released the grant
			f.failed(start, err)
			// The next grant is another lease: another owner.
			req.Owner = c.newOwner(cfg.label)
			continue
		}
		if definite(err) && !errors.Is(err, ErrNotAcquired) {
			return nil, err
		}
		if ctxOnly(err) && ctx.Err() != nil {
			// The caller's end came before this attempt was sent (or
			// before its grant was handed out: released): it says
			// nothing of the store, whose last failure is the cause.
			c.abandonFor(k, req)
			return nil, c.ended(ctx, last)
		}
		last = err
		ambiguous = !errors.Is(err, ErrNotAcquired)
		if ambiguous {
			f.failed(start, err)
		} else {
			f.answered()
		}
		if !contended && !ambiguous {
			c.emit(Event{Kind: EventWaiting, Key: req.Key, Owner: req.Owner, Err: err})
		}
		contended = contended || !ambiguous
		fresh := seen.fresh(err)
		quiet = woke && !fresh
		if fresh {
			pause = c.o.MinBackoff
		}
		if ctx.Err() != nil {
			if ambiguous {
				c.abandonFor(k, req)
			}
			return nil, c.ended(ctx, last)
		}
		if f.over(c.now()) {
			if ambiguous {
				c.abandonFor(k, req)
			}
			return nil, c.gaveUp(ctx, f)
		}
		if ambiguous {
			c.emit(Event{Kind: EventAcquireRetry, Key: req.Key, Owner: req.Owner, Err: c.wrap(ctx, "acquire", err)})
		}
	}
}

// attempt makes one Backend.Acquire for call k, whose bound context is
// ctx. The request runs on k's attempt context (see beginCall), which the
// end of ctx does not cut short: a store may apply a request after its
// sender stopped waiting for the reply, and a record that lands after the
// clean-up (abandon) looked for it would stay until its TTL. So the
// request runs until the store answers, for at most the call's overrun
// budget after ctx ended (an answer still missing then is an unknown
// outcome, which the caller abandons), and in any case for at most the
// call's TTL, or until until if that is sooner (and not zero). A grant
// that arrives after ctx ended is released, and ctx's error returned.
func (c *Client) attempt(ctx context.Context, k *call, req driver.AcquireRequest, until time.Time) (driver.Grant, error) {
	if err := ctx.Err(); err != nil {
		return driver.Grant{}, err
	}
	rctx, cancel := c.requestCtx(k.ends.attempts, req.TTL, until)
	g, err := c.acquireOnce(rctx, req)
	err = cutShort(rctx, err)
	cancel()
	if err == nil && ctx.Err() != nil {
		c.releaseGrantFor(k, g)
		return driver.Grant{}, ctx.Err()
	}
	return g, err
}

// errWaitBound is the cancellation cause of an Acquire whose WithWait
// bound passed.
var errWaitBound = errors.New("fencelock: wait bound passed")

// waitBoundErr turns the error of an Acquire whose WithWait bound passed
// (before the caller's ctx ended: ctx's cause says which came first) into
// one matching ErrNotAcquired, joined with the store's last failure, if
// any. parent is the caller's context (unused: the cause of ctx tells
// which came first).
func waitBoundErr(_, ctx context.Context, wait time.Duration, err error) error {
	if err == nil || wait <= 0 || !errors.Is(context.Cause(ctx), errWaitBound) {
		return err
	}
	e := fmt.Errorf("%w within the wait bound (%v)", ErrNotAcquired, wait)
	var be *BackendError
	if errors.As(err, &be) {
		return errors.Join(e, be)
	}
	return e
}

// holdersSeen is the set of holders (by owner) one waiting call has found.
type holdersSeen map[string]struct{}

// maxHoldersSeen bounds holdersSeen: past it the set starts again (a long
// wait through many hand-offs; a composite backend's herd of waiters is
// a handful of owners).
const maxHoldersSeen = 64

// fresh reports whether err names a holder not seen before, and records
// it. A holder the store does not name is never fresh.
func (s *holdersSeen) fresh(err error) bool {
	var held *HeldError
	if !errors.As(err, &held) || held.Holder.Owner == "" {
		return false
	}
	if _, ok := (*s)[held.Holder.Owner]; ok {
		return false
	}
	if *s == nil || len(*s) >= maxHoldersSeen {
		*s = make(holdersSeen)
	}
	(*s)[held.Holder.Owner] = struct{}{}
	return true
}

func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// jitter returns a duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// abandon removes a record that an acquire attempt with an unknown outcome
// may have left, using a fresh context bounded by Options.ReleaseTimeout
// (and by Close's budget, see Client.drain), and retries in the background if that fails. A call uses abandonFor,
// which bounds its wait by the call's overrun budget.
func (c *Client) abandon(req driver.AcquireRequest) {
	if c.abandonOnce(c.drain, req) {
		return
	}
	// The clean-up failed: a session store (ZooKeeper) would keep the
	// record as long as this client lives.
	c.retryInBackground(func() bool { return c.abandonOnce(c.life, req) })
}

// retryInBackground calls attempt with capped, jittered backoff until it
// reports done or the client begins to close. A record store expires what
// a failed clean-up left, but a session store (ZooKeeper, etcd) keeps it
// alive as long as the client lives: these retries free the key sooner.
func (c *Client) retryInBackground(attempt func() (done bool)) {
	c.goBackground(func() {
		backoff := c.o.MinBackoff
		for {
			t := time.NewTimer(jitter(backoff))
			select {
			case <-c.life.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, c.o.RenewInterval)
			if attempt() {
				return
			}
		}
	})
}

// abandonOnce makes one attempt at abandon's clean-up; it reports whether
// the store answered (the record removed, or not ours, or a key the
// backend refuses, under which it cannot have stored anything).
func (c *Client) abandonOnce(parent context.Context, req driver.AcquireRequest) bool {
	ctx, cancel := context.WithTimeout(parent, c.o.ReleaseTimeout)
	defer cancel()
	info, err := c.b.Inspect(ctx, req.Key)
	if err != nil {
		if errors.Is(err, ErrInvalidKey) {
			return true
		}
		c.emit(Event{Kind: EventCleanupFailed, Key: req.Key, Owner: req.Owner, Err: c.wrap(ctx, "inspect", err)})
		return errors.Is(err, ErrClosed)
	}
	if info.Owner != req.Owner {
		return true
	}
	err = c.releaseOnce(ctx, driver.Grant{Key: req.Key, Owner: req.Owner, Token: info.Token})
	if err != nil && !errors.Is(err, ErrNotHeld) {
		c.emit(Event{Kind: EventCleanupFailed, Key: req.Key, Owner: req.Owner, Err: c.wrap(ctx, "release", err)})
		return errors.Is(err, ErrClosed)
	}
	return true
}

// releaseGrant releases g with a fresh context bounded by
// Options.ReleaseTimeout (and by Close's budget), and if that fails,
// retries by owner in the background as abandon does: a session store
// (ZooKeeper) would keep the record as long as this client lives. Only
// for a grant whose owner no call of this client uses any more (owners
// are unique per lease; a call that gives a grant back and goes on
// acquiring takes a new owner): a retry by owner would remove the record
// of a later grant to the same owner.
func (c *Client) releaseGrant(g driver.Grant) {
	if c.releaseGrantOnce(g) {
		return
	}
	req := driver.AcquireRequest{Key: g.Key, Owner: g.Owner}
	c.retryInBackground(func() bool { return c.abandonOnce(c.life, req) })
}

// releaseGrantOnce releases g once, best effort, as releaseGrant does; it
// reports whether that is settled: released, not held, or the client
// closed.
func (c *Client) releaseGrantOnce(g driver.Grant) bool {
	ctx, cancel := context.WithTimeout(c.drain, c.o.ReleaseTimeout)
	defer cancel()
	err := c.releaseOnce(ctx, g)
	if err == nil || errors.Is(err, ErrNotHeld) {
		return true
	}
	c.emit(Event{Kind: EventCleanupFailed, Key: g.Key, Owner: g.Owner, Token: g.Token, Err: c.wrap(ctx, "release", err)})
	return errors.Is(err, ErrClosed)
}

// Do acquires key (waiting as Acquire does), runs fn with a context that is
// cancelled the moment the lease is lost (or ctx ends), and releases the
// lease when fn returns. It returns fn's error, joined with the
// *LostError if the lease was lost while fn ran: in that case fn's work
// may not have been exclusive, even if fn itself returned nil. opts
// apply as to Acquire; with a minimum hold (WithMinHold), the release
// keeps the key for the rest of the window, as Lease.Release does, and
// Do returns fn's error alone.
func (c *Client) Do(ctx context.Context, key string, fn func(ctx context.Context, l *Lease) error, opts ...AcquireOption) error {
	l, err := c.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	// fn's context is a child of the lease's, which the engine cancels
	// before it gives the key up (a callback on it, as AfterFunc would
	// run, can come after the next holder has started); ctx's end
	// cancels it too.
	fctx, cancel := context.WithCancelCause(l.Context())
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	release := func() error {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.ReleaseTimeout)
		defer rcancel()
		return l.Release(rctx)
	}
	panicked := true
	defer func() {
		if panicked {
			// fn panicked: end the lease before the panic goes on, so
			// a recovered panic (an HTTP handler's) leaves no lock held.
			stop()
			cancel(nil)
			_ = release()
		}
	}()
	ferr := fn(fctx, l)
	panicked = false
	stop()
	cancel(nil)
	if lost := l.Err(); lost != nil {
		<-l.Done() // closed right after the loss is reported
		return errors.Join(ferr, lost)
	}
	rerr := release()
	if errors.Is(context.Cause(l.Context()), ErrClosed) {
		// Close released the lease (and cancelled fn's context),
		// before or while fn returned: fn may not have run
		// exclusively after that.
		return errors.Join(ferr, ErrClosed)
	}
	if errors.Is(rerr, ErrNotHeld) {
		// The store no longer had our record: the lease had been lost
		// without our noticing yet, so fn may not have run exclusively.
		return errors.Join(ferr, &LostError{Key: key, Token: l.Token(), Cause: rerr})
	}
	return errors.Join(ferr, rerr)
}

// Inspect reports the current holder of key as the store sees it; the
// returned Info's Owner is empty if the key is free. Without a deadline on
// ctx, the request is bounded by Options.TTL.
func (c *Client) Inspect(ctx context.Context, key string) (Info, error) {
	rctx, cancel := boundCtx(ctx, c.o.TTL)
	defer cancel()
	info, err := c.b.Inspect(rctx, key)
	return info, c.wrap(ctx, "inspect", cutShort(rctx, err))
}

// List reports every held key that starts with prefix ("" for all), across
// every client of the store, sorted by key. Without a deadline on ctx,
// the request is bounded by Options.TTL.
func (c *Client) List(ctx context.Context, prefix string) ([]Info, error) {
	rctx, cancel := boundCtx(ctx, c.o.TTL)
	defer cancel()
	infos, err := c.b.List(rctx, prefix)
	if err != nil {
		return nil, c.wrap(ctx, "list", cutShort(rctx, err))
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Key < infos[j].Key })
	return infos, nil
}

// ForceRelease removes key's lock whoever holds it, and returns what it
// removed (Owner empty if the key was free). It is an administrator's tool:
// the holder learns of the loss at its next renewal (at once on backends
// that push loss). Tokens stay monotonic. It returns ErrUnsupported on
// backends without the capability. Without a deadline on ctx, the
// request is bounded by Options.TTL.
func (c *Client) ForceRelease(ctx context.Context, key string) (Info, error) {
	if c.forcer == nil {
		return Info{}, ErrUnsupported
	}
	rctx, cancel := boundCtx(ctx, c.o.TTL)
	defer cancel()
	info, err := c.forcer.ForceRelease(rctx, key)
	return info, c.wrap(ctx, "force-release", cutShort(rctx, err))
}

// Holding returns the keys this client holds leases on, sorted, each once.
func (c *Client) Holding() []string {
	c.mu.Lock()
	seen := make(map[string]struct{}, len(c.leases))
	for l := range c.leases {
		seen[l.key] = struct{}{}
	}
	c.mu.Unlock()
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Close releases every lease the client holds (and retries releases
// that failed), makes waiting Acquire calls return ErrClosed, waits for
// the clean-up those calls left to the background, stops every goroutine
// the client started, and closes the backend. Calls after the first
// return nil.
//
// Close returns within Options.ReleaseTimeout (RT), plus a grace of at
// most a tenth of RT, whatever the store does: the end of the calls in
// flight, the releases and the background clean-up share one budget of
// RT from the moment Close began (instead of taking one RT each in
// turn), and every request they make is cut off when that budget ends. An acquire attempt in
// flight gets the first three quarters of the budget for its answer, so
// that the clean-up after it has the last quarter. The backend's own Close gets
// what is left of the budget (at least the grace); if it has not returned
// by then (a driver that waits on an unreachable store), Close returns an
// error matching context.DeadlineExceeded and the backend's Close goes on
// in a goroutine of its own. So do the client's goroutines still running
// then (requests of a backend that ignores its context's end).
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	begun := time.Now()
	budget := time.AfterFunc(c.o.ReleaseTimeout, func() { c.endDrain(errCloseBudget) })
	c.endLife()
	for _, e := range c.calling {
		e.end(ErrClosed, c.o.ReleaseTimeout*3/4)
	}
	c.mu.Unlock()

	// Every wait of Close ends by half the grace after the budget; the
	// backend's Close gets the rest of the budget, at least half the
	// grace.
	grace := closeGrace(c.o.ReleaseTimeout)
	by := time.NewTimer(time.Until(begun.Add(c.o.ReleaseTimeout + grace/2)))
	defer by.Stop()
	var (
		errMu sync.Mutex
		errs  []error
	)
	fail := func(err error) {
		errMu.Lock()
		errs = append(errs, err)
		errMu.Unlock()
	}
	// The calls in flight end first (within three quarters of the
	// budget), and clean up after themselves while the backend is open:
	// a call that holds leases (a read-write lock's, a semaphore's)
	// releases them itself before it returns. Then the held leases,
	// and released ones whose release failed: their records would
	// otherwise stay until the TTL. Every request of theirs ends with
	// the budget.
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		c.calls.Wait()
		c.mu.Lock()
		leases := make([]*Lease, 0, len(c.leases)+len(c.pending))
		for l := range c.leases {
			leases = append(leases, l)
		}
		for l := range c.pending {
			leases = append(leases, l)
		}
		c.mu.Unlock()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for _, l := range leases {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeoutCause(c.drain, c.o.ReleaseTimeout, c.releaseBound())
				defer cancel()
				if err := l.release(ctx, errReleasedByClose); err != nil && !errors.Is(err, ErrNotHeld) {
					fail(err)
				}
			}()
		}
		wg.Wait()
	}()
	late := false
	select {
	case <-settled:
	case <-by.C:
		late = true
	}

	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	close(c.stop)
	stopped := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(stopped)
	}()
	if !late {
		select {
		case <-stopped:
			// Nothing is left that uses the budget.
			budget.Stop()
			c.endDrain(ErrClosed)
		case <-by.C:
		}
	}

	closed := make(chan error, 1)
	go func() { closed <- c.b.Close() }()
	t := time.NewTimer(max(time.Until(begun.Add(c.o.ReleaseTimeout+grace/2)), grace/2))
	defer t.Stop()
	select {
	case err := <-closed:
		if err != nil {
			fail(c.wrap(context.Background(), "close", err))
		}
	case <-t.C:
		fail(&BackendError{Backend: c.name, Op: "close", Err: errBackendCloseLate})
	}
	errMu.Lock()
	defer errMu.Unlock()
	return errors.Join(errs...)
}

// goBackground runs f on a tracked goroutine unless the client has
// stopped; it reports whether it did.
func (c *Client) goBackground(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
	return true
}

// forget removes l from the client's held leases; pending keeps it among
// those whose release Close must see through.
func (c *Client) forget(l *Lease, pending bool) {
	c.mu.Lock()
	if r, ok := c.leases[l]; ok && r.idx >= 0 {
		heap.Remove(&c.queue, r.idx)
	}
	delete(c.leases, l)
	if pending {
		c.pending[l] = struct{}{} // until its release is confirmed
	}
	c.mu.Unlock()
}

// poke wakes the scheduler.
func (c *Client) poke() {
	select {
	case c.wake <- struct{}{}:
		c.pokes.Add(1)
	default:
	}
}
