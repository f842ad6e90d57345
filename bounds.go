package fencelock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// The call-bound contract (docs/design.md, "Bounds"): every backend
// request of an Acquire or TryAcquire runs on a context whose deadline is
// at most the call's bound, so no call waits on the store without one,
// whatever the store does:
//
//   - one request lasts at most the call's TTL (and, once the store has
//     begun to fail, no longer than the failure window: see failing);
//   - once the caller's context has ended (or Close has begun), an
//     attempt in flight and the clean-up after it share one overrun
//     budget, Options.ReleaseTimeout (see callEnds.end and cleanUp);
//   - the clean-up still unfinished when that budget ends goes on in the
//     background, bounded by ReleaseTimeout, and Close waits for it;
//   - Close has one budget of ReleaseTimeout for all it waits for (the
//     calls in flight, the releases, the background clean-up, at once):
//     every clean-up request runs on Client.drain, which ends with that
//     budget, and the backend's own Close is waited for only until the
//     budget (and closeGrace) ends.

// errOverrun is the cancellation cause of a call's attempts' context: the
// call's overrun budget passed after its context ended or Close began.
var errOverrun = errors.New("Options.ReleaseTimeout after the call's context ended (its overrun budget)")

// errCloseBudget is the cancellation cause of the clean-up requests still
// in flight when Close's budget (Options.ReleaseTimeout after Close
// began) ends.
var errCloseBudget = errors.New("Options.ReleaseTimeout after Client.Close began (its budget)")

// errBackendCloseLate is the error of a Close whose backend's own Close
// had not returned when Close's budget and grace ended.
var errBackendCloseLate = fmt.Errorf("%w: the backend's Close had not returned within Options.ReleaseTimeout after Client.Close began; it goes on in the background (is the store reachable?)", context.DeadlineExceeded)

// closeGrace is the time Client.Close may take past its budget, RT: a
// tenth of RT, at most half a second (the time for goroutines to see the
// end of their requests, and for the backend's own Close).
func closeGrace(rt time.Duration) time.Duration { return min(rt/10, 500*time.Millisecond) }

// cleanupCtx returns the context of a clean-up request with values's
// values (not its cancellation): bounded by Options.ReleaseTimeout, and
// by Close's budget.
func (c *Client) cleanupCtx(values context.Context) (context.Context, context.CancelFunc) {
	ctx, end := context.WithCancelCause(context.WithoutCancel(values))
	ctx, cancel := context.WithTimeoutCause(ctx, c.o.ReleaseTimeout, c.releaseBound())
	stop := context.AfterFunc(c.drain, func() { end(context.Cause(c.drain)) })
	return ctx, func() {
		stop()
		cancel()
		end(nil)
	}
}

// requestBound is the cancellation cause of one backend request that ran
// for its whole bound: the call's TTL, or (what set) another bound such
// as Options.ReleaseTimeout.
type requestBound struct {
	ttl  time.Duration
	what string // the bound's name; "": the call's TTL
}

func (b *requestBound) Error() string {
	if b.what != "" {
		return fmt.Sprintf("%s (%v)", b.what, b.ttl)
	}
	return fmt.Sprintf("the request's bound (the call's TTL, %v)", b.ttl)
}

// releaseBound returns the cause of a clean-up or release request bounded
// by Options.ReleaseTimeout.
func (c *Client) releaseBound() *requestBound { return c.rtBound }

// noAnswerError reports a backend request that the engine cut short
// because the store had not answered within the request's bound (the
// call's TTL) or the call's overrun budget. It matches
// context.DeadlineExceeded, and unwraps to what the backend returned.
type noAnswerError struct {
	within string // the bound that passed
	err    error  // the backend's own error
}

func (e *noAnswerError) Error() string {
	msg := "no answer from the store within " + e.within
	if e.err != nil && e.err != context.Canceled && e.err != context.DeadlineExceeded {
		msg += ": " + e.err.Error()
	}
	return msg + " (is the store reachable?)"
}

func (e *noAnswerError) Unwrap() error { return e.err }

func (e *noAnswerError) Is(target error) bool { return target == context.DeadlineExceeded }

// isCtxErr reports whether err is (or wraps) a context's error.
func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// ctxOnly reports whether err says no more than that a context ended: a
// context's error that is not the engine's report of a store that did not
// answer.
func ctxOnly(err error) bool {
	var na *noAnswerError
	return isCtxErr(err) && !errors.As(err, &na)
}

// requestCtx returns the context of one backend request: parent with a
// deadline ttl from now, or at until if that is sooner (and not zero).
func (c *Client) requestCtx(parent context.Context, ttl time.Duration, until time.Time) (context.Context, context.CancelFunc) {
	d := ttl
	if !until.IsZero() {
		d = min(d, max(0, until.Sub(c.now())))
	}
	cause := c.ttlBound
	if ttl != cause.ttl {
		cause = &requestBound{ttl: ttl}
	}
	return context.WithTimeoutCause(parent, d, cause)
}

// boundCtx returns ctx, with a deadline d from now if it has none: the
// context of a one-request call (Inspect, List, ForceRelease).
func boundCtx(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, d, &requestBound{ttl: d})
}

// cutShort returns err, the outcome of a request on rctx, as a
// *noAnswerError if the engine's bound on rctx (its request bound, the
// call's overrun budget, Close's budget) ended the request, or if the
// backend gave up with a context's error while rctx was still live: its
// driver's own timeout (one that a driver sets from rctx's deadline can
// fire a moment before rctx's timer does). Call it before cancelling
// rctx.
func cutShort(rctx context.Context, err error) error {
	if err == nil || !isCtxErr(err) {
		return err
	}
	var na *noAnswerError
	if errors.As(err, &na) {
		return err
	}
	if rctx.Err() == nil {
		return &noAnswerError{within: "the driver's own timeout", err: err}
	}
	switch cause := context.Cause(rctx); {
	case cause == errOverrun || cause == errCloseBudget:
		return &noAnswerError{within: cause.Error(), err: err}
	default:
		var b *requestBound
		if errors.As(cause, &b) {
			return &noAnswerError{within: b.Error(), err: err}
		}
	}
	return err
}

// failing tracks one Acquire's run of store failures (transient errors,
// requests without an answer, late grants). Without a caller's deadline,
// the call gives up once the store has failed for its whole window: from
// the start of the first failed request after the store's last answer,
// for the call's TTL. With a deadline (the caller's, or WithWait's) there
// is no window (limit 0): the call tries until its deadline.
type failing struct {
	since time.Time     // when the first failed request of the run began; zero while the store answers
	limit time.Duration // the window's length; 0: none
	last  error         // the run's last failure
}

// answered ends the run: the store gave an answer.
func (f *failing) answered() { f.since, f.last = time.Time{}, nil }

// failed records a request, begun at start, that failed with err.
func (f *failing) failed(start time.Time, err error) {
	if f.since.IsZero() {
		f.since = start
	}
	f.last = err
}

// until returns when the window ends, or zero if there is none (yet).
func (f *failing) until() time.Time {
	if f.limit == 0 || f.since.IsZero() {
		return time.Time{}
	}
	return f.since.Add(f.limit)
}

// over reports whether the window has ended by now.
func (f *failing) over(now time.Time) bool {
	u := f.until()
	return !u.IsZero() && !now.Before(u)
}

// wait returns d, cut to the rest of the window.
func (f *failing) wait(now time.Time, d time.Duration) time.Duration {
	if u := f.until(); !u.IsZero() {
		d = min(d, max(0, u.Sub(now)))
	}
	return d
}

// storeFailedError is the cause of an Acquire without a deadline that
// gave up because the store failed for the whole of its TTL.
type storeFailedError struct {
	ttl  time.Duration
	last error
}

func (e *storeFailedError) Error() string {
	return fmt.Sprintf("the store failed for %v (the call's TTL) without an answer; give the call a deadline to wait longer; last failure: %v", e.ttl, e.last)
}

func (e *storeFailedError) Unwrap() error { return e.last }

// gaveUp is the error of an Acquire whose failure window ended. If ctx
// has ended meanwhile, the call's outcome is that (see ended): the
// caller's end of the call is what it asked for.
func (c *Client) gaveUp(ctx context.Context, f *failing) error {
	if ctx.Err() != nil {
		return c.ended(ctx, f.last)
	}
	return c.wrap(ctx, "acquire", &storeFailedError{ttl: f.limit, last: f.last})
}

// cleanUp runs f, a clean-up after call k that bounds its own requests by
// Options.ReleaseTimeout, on a goroutine that Close waits for, and waits
// for it while k's overrun budget lasts: ReleaseTimeout from now, and no
// later than the end of k's attempts' context (ReleaseTimeout after the
// caller's context ended or Close began), so that an answer awaited in
// flight and the clean-up after it share that one budget. What f has not
// finished by then goes on in the background.
func (c *Client) cleanUp(k *call, f func()) {
	done := make(chan struct{})
	if !c.goBackground(func() {
		defer close(done)
		f()
	}) {
		f()
		return
	}
	t := time.NewTimer(c.o.ReleaseTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-k.ends.attempts.Done():
	case <-t.C:
	}
}

// abandonFor is abandon for call k, within its overrun budget (see
// cleanUp).
func (c *Client) abandonFor(k *call, req driver.AcquireRequest) {
	c.cleanUp(k, func() { c.abandon(req) })
}

// releaseGrantFor is releaseGrant for call k, within its overrun budget
// (see cleanUp).
func (c *Client) releaseGrantFor(k *call, g driver.Grant) {
	if k == nil {
		c.releaseGrant(g)
		return
	}
	c.cleanUp(k, func() { c.releaseGrant(g) })
}
