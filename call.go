package fencelock

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// The seam: what a recipe (a primitive built of leases, such as the
// semaphores, read-write locks and elections of package recipe) needs of
// the engine beyond Acquire, TryAcquire, Inspect and List, exported so
// that a third party's recipe can be written the same way. A recipe's
// waiting call runs as a Call:
//
//	k, err := c.Begin(ctx, opts...) // resolves opts, applies WithWait, registers with Close
//	if err != nil {
//		return err
//	}
//	defer func() { err = k.End(err) }() // ErrClosed, ErrNotAcquired for WithWait
//	for {
//		start := time.Now()
//		rctx, cancel := k.Request() // one store request, bounded
//		err := step(rctx)
//		cancel()
//		if err := k.Outcome(start, err); err != nil {
//			return err // an answer that ends the call, or the store failed too long
//		}
//		if done {
//			return nil
//		}
//		if err := k.Pause(k.Context(), err); err != nil { // the one backoff
//			return err
//		}
//	}

// Call is one composite call of a recipe: a wait or attempt made of
// several of the Client's calls and store requests (a semaphore's
// Acquire, a read-write lock's RLock). Begin it with Client.Begin (or
// Client.BeginTry), and End it when it returns. While it runs, Close
// ends its context (with ErrClosed as cause) and waits for it to End, so
// that the recipe's clean-up runs before the backend is closed. A Call
// is used by one goroutine at a time, except Context, its option
// accessors and End's effect on Close, which are safe from any.
type Call struct {
	c      *Client
	parent context.Context // the caller's context
	wctx   context.Context // parent bounded by WithWait
	cfg    callConfig
	wait   bool // WithWait bounds the call (Begin, not BeginTry)
	bound  context.Context
	k      call
	f      failing
	b      backoff
	cancel context.CancelFunc // ends wctx's timer, or nil
	ended  atomic.Bool        // End has run: a second End unregisters nothing
}

// Begin begins a recipe's waiting call on ctx with opts, which are
// resolved over the Client's Options and checked as Client.Acquire checks
// them (an *InvalidOptionError before anything is sent to the store). The
// call's context (Context) is ctx, bounded by WithWait's bound if opts
// set one, and ended by Client.Close. Without a deadline on ctx (and
// without WithWait), the call gives up once the store has failed for the
// call's TTL without an answer (see Outcome), as Acquire does. It returns
// ErrClosed if the Client is closing. End must be called when the call
// returns.
func (c *Client) Begin(ctx context.Context, opts ...AcquireOption) (*Call, error) {
	return c.beginRecipe(ctx, true, opts)
}

// BeginTry is Begin for a call that makes one attempt and never waits
// (a recipe's TryAcquire): WithWait does not bound it (Wait still
// reports the bound opts set), as it does not bound Client.TryAcquire.
func (c *Client) BeginTry(ctx context.Context, opts ...AcquireOption) (*Call, error) {
	return c.beginRecipe(ctx, false, opts)
}

func (c *Client) beginRecipe(ctx context.Context, wait bool, opts []AcquireOption) (*Call, error) {
	cfg, err := c.resolveCall(opts)
	if err != nil {
		return nil, err
	}
	k := &Call{c: c, parent: ctx, wctx: ctx, cfg: cfg, wait: wait}
	if wait && cfg.wait > 0 {
		k.wctx, k.cancel = context.WithTimeoutCause(ctx, cfg.wait, errWaitBound)
	}
	bound, reg, err := c.beginCall(k.wctx, false)
	if err != nil {
		if k.cancel != nil {
			k.cancel()
		}
		return nil, err
	}
	k.bound, k.k = bound, reg
	if _, ok := bound.Deadline(); !ok {
		k.f.limit = cfg.ttl
	}
	k.b = c.newBackoff()
	return k, nil
}

// Context returns the call's context: the caller's, bounded by WithWait
// (Begin) and ended by Client.Close (its cause then matches ErrClosed).
// The call's requests and the Client calls it makes run on it or on a
// context derived from it.
func (k *Call) Context() context.Context { return k.bound }

// TTL returns the call's lease TTL: WithTTL's, or the Client's
// Options.TTL. Each of the call's requests (Request) is bounded by it.
func (k *Call) TTL() time.Duration { return k.cfg.ttl }

// Wait returns WithWait's bound on the call; 0 if none.
func (k *Call) Wait() time.Duration { return k.cfg.wait }

// MinHold returns the minimum hold of the leases the call hands out:
// WithMinHold's, or the Client's Options.MinHold.
func (k *Call) MinHold() time.Duration { return k.cfg.minHold }

// Label returns the owner label of the call's leases: WithLabel's, or
// the Client's Options.Owner.
func (k *Call) Label() string { return k.cfg.label }

// LockDelay returns the lock delay of the call's leases: WithLockDelay's,
// or the Client's Options.LockDelay. A recipe passes it on to the leases
// it takes (WithLockDelay), as it does the TTL and the minimum hold.
func (k *Call) LockDelay() time.Duration { return k.cfg.lockDelay }

// Metadata returns a copy of WithMetadata's payload; nil if none.
func (k *Call) Metadata() []byte {
	if len(k.cfg.meta) == 0 {
		return nil
	}
	return append([]byte(nil), k.cfg.meta...)
}

// Request returns the context of one store request of the call (a List,
// an Inspect): Context bounded by the call's TTL, and by the end of the
// store's failure window once the store has begun to fail (see Outcome).
// A request cut off by that bound fails with an error matching
// context.DeadlineExceeded that says the store did not answer. Call
// cancel when the request returns.
func (k *Call) Request() (context.Context, context.CancelFunc) {
	return k.c.requestCtx(k.bound, k.cfg.ttl, k.f.until())
}

// Outcome records the outcome err of one request (or one Client call)
// of the call, begun at start, and returns nil if the call may go on:
// err is nil, or the store answered that a key is held (an error
// matching ErrNotAcquired: wait with Pause, and try again), or err is a
// failure of the store (a transient error, no answer) within the call's
// failure window. It returns what the call should return otherwise: err
// itself for an answer that ends it (ErrInvalidKey, ErrClosed, …); the
// end of Context joined with the store's failure when Context has ended;
// and, once the store has failed continuously for the call's TTL (Begin
// on a context without a deadline), an error wrapping its last failure
// (a *BackendError). A request that succeeded (err nil) also ends the
// current wait: the next Pause starts again from Options.MinBackoff.
func (k *Call) Outcome(start time.Time, err error) error {
	switch {
	case err == nil:
		k.f.answered()
		k.b.reset()
		return nil
	case definite(err) && !errors.Is(err, ErrNotAcquired):
		return err
	case k.bound.Err() != nil:
		return k.c.ended(k.bound, err)
	case errors.Is(err, ErrNotAcquired):
		k.f.answered()
		return nil
	}
	if k.f.failed(start, err); k.f.over(k.c.now()) {
		return k.c.gaveUp(k.bound, &k.f)
	}
	return nil
}

// Pause waits before the call's next attempt: a capped, jittered
// exponential backoff from Options.MinBackoff to Options.MaxBackoff
// (doubling at every Pause), shortened to just after the soonest expiry
// of the holders that hint's *HeldErrors name (Info.Remaining), and to
// the end of the store's failure window. ctx is the call's Context, or a
// context derived from it (a recipe's wait that ends sooner); a nil ctx
// is taken as the call's Context. Pause returns nil when the wait is
// over; ctx's error (joined with hint when hint is a failure of the
// store, so that a caller learns why) when ctx ended first; and the
// call's outcome, as Outcome's, when the pause ran to the end of the
// store's failure window: a request sent then could not be answered
// within it, so the call ends on the store's last failure instead.
func (k *Call) Pause(ctx context.Context, hint error) error {
	if ctx == nil {
		ctx = k.bound
	}
	d := k.f.wait(k.c.now(), k.b.next(hint))
	if err := k.c.sleep(ctx, d); err != nil {
		return k.c.ended(ctx, hint)
	}
	if k.f.over(k.c.now()) {
		return k.c.gaveUp(k.bound, &k.f)
	}
	k.b.grow()
	return nil
}

// End ends the call with its result err and returns what the call should
// return: ErrClosed when Client.Close ended it (and not the caller's
// context), an error matching ErrNotAcquired (joined with the store's
// last failure, if any) when WithWait's bound passed first, else err.
// Close no longer waits for the call once End returned. End must be
// called once; a second End maps err the same way and has no other
// effect (it does not end the registration of another call with Close).
func (k *Call) End(err error) error {
	err = closedErr(k.parent, k.bound, err)
	if k.wait {
		err = waitBoundErr(k.parent, k.wctx, k.cfg.wait, err)
	}
	if k.ended.Swap(true) {
		return err
	}
	k.k.end()
	if k.cancel != nil {
		k.cancel()
	}
	return err
}

// Go runs f on a goroutine that Client.Close waits for (a recipe's
// watcher, or its clean-up after a grant ended), and returns nil; or
// ErrClosed, without running f, once Close has begun. f's context is
// cancelled when Close begins: f must return soon after, and its store
// requests must be bounded (a release with an ended context is bounded
// by Options.ReleaseTimeout and by Close's budget).
func (c *Client) Go(f func(ctx context.Context)) error {
	if !c.track() {
		return ErrClosed
	}
	go func() {
		defer c.wg.Done()
		f(c.life)
	}()
	return nil
}

// track registers a goroutine that Close waits for: it must end once
// c.life is cancelled, and call c.wg.Done. It reports false, registering
// nothing, if the client is closing.
func (c *Client) track() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped || c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

// ReleaseNow releases the lease as Release does, but at once, whatever
// its minimum hold (WithMinHold, Options.MinHold): for a lease that a
// recipe took as part of a grant and never handed out (a semaphore's
// permit it did not keep, a read-write lock's gate a reader passed, the
// parts of a grant that failed), whose key must not stay closed to
// everyone for the window.
func (l *Lease) ReleaseNow(ctx context.Context) error {
	l.mu.Lock()
	l.unheld = true
	l.mu.Unlock()
	return l.Release(ctx)
}

// RestartMinHold makes the lease's minimum hold count from at (a reading
// of Options.Clock) instead of from when the store's grant arrived: for
// a recipe's grant made of several leases (a read-write lock's write
// grant: the gate, then every slot, the last perhaps long after the
// first), which is handed out when its last lease arrived, so that every
// lease of it keeps its record until at plus MinHold (see MinHoldEnd).
func (l *Lease) RestartMinHold(at time.Time) {
	l.mu.Lock()
	l.granted = at
	l.mu.Unlock()
}

// OnEnd registers f to run when the lease ends (released, lost, or
// released by Client.Close), with its context's cause (see Context): at
// once if it has ended. f runs before Done is closed and before the
// engine gives the key up, under the lease's lock: it must not call the
// lease's methods or block (start a goroutine, or Client.Go, for more).
// A recipe's grant made of several leases uses it to end with any of
// them, synchronously. A later OnEnd replaces f.
func (l *Lease) OnEnd(f func(cause error)) {
	l.mu.Lock()
	if l.state == held {
		l.onEnd = f
		l.mu.Unlock()
		return
	}
	cause := l.endCause
	l.mu.Unlock()
	f(cause)
}

// backoff is the engine's one waiting schedule: capped, jittered
// exponential backoff from Options.MinBackoff to Options.MaxBackoff,
// shortened to a holder's expiry. Acquire's waits and Call.Pause use it.
type backoff struct {
	min, max, cur time.Duration
}

func (c *Client) newBackoff() backoff {
	return backoff{min: c.o.MinBackoff, max: c.o.MaxBackoff, cur: c.o.MinBackoff}
}

// next returns the next wait: jitter of the current backoff, shortened
// to just after the soonest expiry (or end of a lock delay) that hint's
// *HeldErrors name.
func (b *backoff) next(hint error) time.Duration {
	wait := jitter(b.cur)
	if d := soonestExpiry(hint); d > 0 && d < wait {
		wait = d + time.Millisecond
	}
	return wait
}

// grow doubles the backoff, up to its cap.
func (b *backoff) grow() { b.cur = min(2*b.cur, b.max) }

// reset starts the backoff again from its minimum.
func (b *backoff) reset() { b.cur = b.min }

// soonestExpiry returns the shortest Remaining among the holders that
// the *HeldErrors wrapped in err name, or the shortest lock delay left
// they report, whichever is sooner (0 if none is known).
func soonestExpiry(err error) time.Duration {
	var soonest time.Duration
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *HeldError:
			// A lock delay's end is announced by no release: wake then
			// too.
			for _, r := range []time.Duration{e.Holder.Remaining, e.LockDelay} {
				if r > 0 && (soonest == 0 || r < soonest) {
					soonest = r
				}
			}
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := e.Unwrap(); e != nil {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return soonest
}
