package fencelock

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/fencelock/fencelock/driver"
)

// Token is a fencing token, issued by the store, strictly increasing per
// key across holders, takeovers, release and re-acquire, and rotation.
type Token = driver.Token

// Info describes the holder of a key as the store sees it; see Client.Inspect.
type Info = driver.Info

// Backend is the interface a lock store's adapter implements. Its contract
// is documented in package driver, together with the optional capabilities
// the engine discovers (Waiter, Watcher, BatchRenewer, BatchAcquirer,
// BatchReleaser, LossNotifier, ForceReleaser, Describer).
type Backend = driver.Backend

// Errors shared with backends; test for them with errors.Is.
var (
	// ErrNotAcquired: TryAcquire found the key held by someone else. The
	// error is usually a *HeldError naming the holder.
	ErrNotAcquired = driver.ErrNotAcquired
	// ErrNotHeld: a release or renewal of a lease that is no longer held
	// (already released, lost, expired, or taken over).
	ErrNotHeld = driver.ErrNotHeld
	// ErrInvalidKey: the key breaks a rule; the error is an *InvalidKeyError.
	ErrInvalidKey = driver.ErrInvalidKey
	// ErrInvalidOption: an option is out of range; the error is an
	// *InvalidOptionError naming the bound.
	ErrInvalidOption = driver.ErrInvalidOption
	// ErrUnsupported: the backend does not offer the operation.
	ErrUnsupported = driver.ErrUnsupported
	// ErrClosed: the client (or backend) has been closed.
	ErrClosed = driver.ErrClosed
	// ErrGuaranteeUnmet: the store does not meet a guarantee of
	// Options.Require; the error is a *driver.UnmetGuaranteeError naming
	// each one, what was observed and the setting that would meet it.
	ErrGuaranteeUnmet = driver.ErrGuaranteeUnmet
)

// Errors of the engine; test for them with errors.Is.
var (
	// ErrLeaseLost is matched by the *LostError that Lease.Err returns
	// after the lease ended without Release.
	ErrLeaseLost = errors.New("fencelock: lease lost")
	// ErrLocalExpiry is the cause of a loss when the lease's local validity
	// ran out without a successful renewal.
	ErrLocalExpiry = errors.New("fencelock: local validity expired without a successful renewal")
	// ErrTokenRegressed is the cause of a loss when the backend answered a
	// renewal with a lower token than the lease already had. The engine
	// never hands out a token that goes backwards for a live lease.
	ErrTokenRegressed = errors.New("fencelock: backend returned a lower fencing token for a live lease")
	// ErrReleased is the context cause (see context.Cause) of a lease's
	// Context after Release.
	ErrReleased = errors.New("fencelock: lease released")
	// ErrUnknownScheme: Open was given a URL whose scheme no backend has
	// registered. The error message lists the known schemes.
	ErrUnknownScheme = errors.New("fencelock: unknown URL scheme")
	// ErrHeldForMinimum is the context cause (see context.Cause) of a
	// lease released before its minimum hold (WithMinHold,
	// Options.MinHold) had passed: the lease has ended for its holder,
	// but the store keeps the record until the window ends. The cause
	// also matches ErrReleased.
	ErrHeldForMinimum = errors.New("fencelock: lease released; the store keeps the key for the rest of its minimum hold")
	// ErrStaleToken is matched by every *StaleTokenError.
	ErrStaleToken = errors.New("fencelock: stale fencing token")
)

// HeldError reports that a key is held by someone else; it matches
// ErrNotAcquired.
type HeldError = driver.HeldError

// InvalidKeyError reports a key that cannot be used; it matches ErrInvalidKey.
type InvalidKeyError = driver.InvalidKeyError

// InvalidOptionError reports an option out of range; it matches
// ErrInvalidOption.
type InvalidOptionError = driver.InvalidOptionError

// LostError is what Lease.Err returns after a lease ended without Release.
// It matches ErrLeaseLost, and unwraps to the cause: ErrNotHeld (the store
// said the lease is no longer ours), ErrLocalExpiry, ErrTokenRegressed,
// ErrClosed, or an error pushed by the backend.
type LostError struct {
	// Key is the lease's key.
	Key string
	// Token is the last token the lease held.
	Token Token
	// Cause says why the lease ended.
	Cause error
}

// Error implements error.
func (e *LostError) Error() string {
	return fmt.Sprintf("fencelock: lease on %s (token %d) lost: %v", strconv.Quote(e.Key), e.Token, e.Cause)
}

// Is reports whether target is ErrLeaseLost.
func (e *LostError) Is(target error) bool { return target == ErrLeaseLost }

// Unwrap returns the cause.
func (e *LostError) Unwrap() error { return e.Cause }

// BackendError wraps a failure reported by a backend (a network error, a
// database error) exactly once, naming the backend and the operation.
// Definite answers (ErrNotAcquired, ErrNotHeld, invalid input) and context
// errors are returned without this wrapper.
type BackendError struct {
	// Backend is the backend's name (from driver.Describer), or "backend".
	Backend string
	// Op is the operation: "acquire", "renew", "release", "inspect", "list",
	// "force-release", "watch".
	Op string
	// Err is the backend's error.
	Err error
}

// Error implements error.
func (e *BackendError) Error() string {
	return "fencelock: " + e.Backend + ": " + e.Op + ": " + e.Err.Error()
}

// Unwrap returns the backend's error.
func (e *BackendError) Unwrap() error { return e.Err }
