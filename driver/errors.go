package driver

import (
	"fmt"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// HeldError reports that a key is held by someone else. It matches
// ErrNotAcquired with errors.Is.
type HeldError struct {
	// Holder describes the current holder as far as the store told.
	Holder Info
	// LockDelay, when positive, says the key has no holder but is in its
	// lock delay (AcquireRequest.LockDelay): a previous holder's record
	// ended without a release, and the key stays refused for LockDelay
	// more, by the clock that judges expiry. Holder then names only the
	// key (and, where the store knows, the previous holder's token).
	LockDelay time.Duration
}

// Error implements error.
func (e *HeldError) Error() string {
	s := "fencelock: not acquired: key " + strconv.Quote(e.Holder.Key)
	if e.LockDelay > 0 && e.Holder.Owner == "" {
		return s + " is in its lock delay: " + e.LockDelay.Round(time.Millisecond).String() +
			" left (its last holder's lease ended without a release; a released key is free at once)"
	}
	if e.Holder.Owner == "" {
		return s + " is held"
	}
	s += " held by " + strconv.Quote(e.Holder.Owner)
	if e.Holder.Token != 0 {
		s += " (token " + strconv.FormatUint(uint64(e.Holder.Token), 10)
		if e.Holder.Remaining > 0 {
			s += ", " + e.Holder.Remaining.Round(time.Millisecond).String() + " left"
		}
		s += ")"
	}
	return s
}

// Is reports whether target is ErrNotAcquired.
func (e *HeldError) Is(target error) bool { return target == ErrNotAcquired }

// InvalidKeyError reports a key that cannot be used. It matches
// ErrInvalidKey with errors.Is.
type InvalidKeyError struct {
	// Key is the offending key (possibly truncated for display by Error).
	Key string
	// Reason says which rule the key breaks.
	Reason string
}

// Error implements error.
func (e *InvalidKeyError) Error() string {
	k := e.Key
	if len(k) > 64 {
		k = k[:64] + "…"
	}
	return fmt.Sprintf("fencelock: invalid key %q: %s", k, e.Reason)
}

// Is reports whether target is ErrInvalidKey.
func (e *InvalidKeyError) Is(target error) bool { return target == ErrInvalidKey }

// InvalidOptionError reports an option or configuration value out of range.
// It matches ErrInvalidOption with errors.Is.
type InvalidOptionError struct {
	// Option names the option, e.g. "TTL" or "table".
	Option string
	// Value is the offending value as text.
	Value string
	// Reason names the bound or rule it violates.
	Reason string
}

// Error implements error.
func (e *InvalidOptionError) Error() string {
	return fmt.Sprintf("fencelock: invalid %s %s: %s", e.Option, e.Value, e.Reason)
}

// Is reports whether target is ErrInvalidOption.
func (e *InvalidOptionError) Is(target error) bool { return target == ErrInvalidOption }

// MaxKeyLen is the longest key, in bytes, that every backend accepts.
const MaxKeyLen = 512

// ValidateKey checks the rules every backend shares: a key is 1 to
// MaxKeyLen bytes of valid UTF-8 without control characters. Backends may
// add rules of their own and report them with *InvalidKeyError.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return &InvalidKeyError{Key: key, Reason: "empty"}
	case len(key) > MaxKeyLen:
		return &InvalidKeyError{Key: key, Reason: fmt.Sprintf("%d bytes, longer than %d", len(key), MaxKeyLen)}
	case !utf8.ValidString(key):
		return &InvalidKeyError{Key: key, Reason: "not valid UTF-8"}
	}
	for i, r := range key {
		if unicode.IsControl(r) {
			return &InvalidKeyError{Key: key, Reason: fmt.Sprintf("control character %U at byte %d", r, i)}
		}
	}
	return nil
}

// ValidatePrefix checks a List prefix: empty (everything) or a string that
// ValidateKey would accept.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return ValidateKey(prefix)
}

// Bounds on a lease's TTL that every backend accepts. The engine's
// Options.TTL is checked against the same bounds.
const (
	MinTTL = 10 * time.Millisecond
	MaxTTL = 24 * time.Hour
)

// ValidateTTL checks a requested TTL against the bounds every backend
// shares. The engine's own minimum (MinTTL) is not enforced here: a
// backend accepts any positive TTL up to MaxTTL, and rounds up what is
// finer than its store's granularity.
func ValidateTTL(ttl time.Duration) error {
	switch {
	case ttl <= 0:
		return &InvalidOptionError{Option: "TTL", Value: ttl.String(), Reason: "must be positive"}
	case ttl > MaxTTL:
		return &InvalidOptionError{Option: "TTL", Value: ttl.String(), Reason: "must be at most " + MaxTTL.String()}
	}
	return nil
}

// UnsupportedError reports a feature a backend does not offer. It matches
// ErrUnsupported with errors.Is.
type UnsupportedError struct {
	// Backend names the backend, e.g. "etcd".
	Backend string
	// Feature names what was asked, e.g. "LockDelay".
	Feature string
	// Instead says what to use instead.
	Instead string
}

// Error implements error.
func (e *UnsupportedError) Error() string {
	s := "fencelock: " + e.Feature + " is not supported by the " + e.Backend + " backend"
	if e.Instead != "" {
		s += "; " + e.Instead
	}
	return s
}

// Is reports whether target is ErrUnsupported.
func (e *UnsupportedError) Is(target error) bool { return target == ErrUnsupported }

// LockDelayUnsupported is the error of a backend that cannot keep a lock
// delay (AcquireRequest.LockDelay > 0): an *UnsupportedError naming the
// backend and what to use instead.
func LockDelayUnsupported(backend string) error {
	return &UnsupportedError{Backend: backend, Feature: "LockDelay",
		Instead: "use a backend that keeps it (every backend of fencelock does), or leave the lock delay at 0 and fence the resource with the lease's token"}
}
