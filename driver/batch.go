package driver

import "context"

// AcquireResult is the outcome of one request of an AcquireBatch.
type AcquireResult struct {
	// Grant is the grant when Err is nil.
	Grant Grant
	// Err is nil (granted), an error matching ErrNotAcquired (the key is
	// held, preferably a *HeldError), an *InvalidKeyError or
	// *InvalidOptionError for this request alone (nothing was stored for
	// it), or any other error: the request's outcome is unknown to the
	// caller, exactly as for a failed Acquire.
	Err error
}

// BatchAcquirer is implemented by backends that can make many acquire
// attempts, on different keys, in one round trip (one SQL statement and
// one commit, one Redis pipeline). The engine coalesces a Client's
// concurrent TryAcquire calls, and the single attempts of its waiting
// Acquire calls, into batches (see docs/internals.md, "Coalescing").
//
// AcquireBatch makes one attempt for each request, as Acquire would, and
// returns one result per request, in order. Every result is its
// request's own: one request's refusal, bad input or failure must not
// change another's answer (each is checked with CheckAcquire, and a bad
// one gets its *InvalidKeyError while the others go ahead). A non-nil
// error means the whole batch failed before any answer (ErrClosed, ctx's
// error, a connection failure): the outcome of every request is then
// unknown, as for a failed Acquire, and results is ignored. The engine
// never puts two requests for one key in a batch, but a direct caller
// may: the backend must then answer both correctly (as if made one after
// the other), for example by sending the second on its own.
type BatchAcquirer interface {
	AcquireBatch(ctx context.Context, reqs []AcquireRequest) ([]AcquireResult, error)
}

// BatchReleaser is implemented by backends that can release many grants
// in one round trip. ReleaseBatch returns one error per grant, in order,
// each what Release would have returned for it alone (nil, ErrNotHeld,
// an *InvalidKeyError, or a failure whose outcome is unknown). A non-nil
// error means the whole batch failed and errs is ignored.
type BatchReleaser interface {
	ReleaseBatch(ctx context.Context, grants []Grant) (errs []error, err error)
}
