package driver

import (
	"errors"
	"strconv"
	"time"
)

// CheckAcquire checks an AcquireRequest by the rules every backend shares:
// Key by ValidateKey, Owner by the same rules as a key (1 to MaxKeyLen
// bytes of valid UTF-8 without control characters, reported as an
// *InvalidOptionError for "Owner"), TTL by ValidateTTL, LockDelay by
// ValidateLockDelay. Backends call it
// first in Acquire and AcquireWait (see "Validation" in the package doc).
func CheckAcquire(req AcquireRequest) error {
	if err := ValidateKey(req.Key); err != nil {
		return err
	}
	if err := ValidateOwner(req.Owner); err != nil {
		return err
	}
	if err := ValidateTTL(req.TTL); err != nil {
		return err
	}
	if err := ValidateLockDelay(req.LockDelay); err != nil {
		return err
	}
	return ValidateMetadata(req.Metadata)
}

// ValidateLockDelay checks a lock delay (AcquireRequest.LockDelay): 0 (none)
// up to MaxTTL, else an *InvalidOptionError for "LockDelay".
func ValidateLockDelay(d time.Duration) error {
	if d < 0 || d > MaxTTL {
		return &InvalidOptionError{Option: "LockDelay", Value: d.String(), Reason: "must be between 0 (none) and " + MaxTTL.String()}
	}
	return nil
}

// CheckRenew checks a RenewRequest (its TTL, by ValidateTTL, and its
// metadata, by ValidateMetadata). Backends call it first in Renew and
// RenewBatch.
func CheckRenew(req RenewRequest) error {
	if err := ValidateTTL(req.TTL); err != nil {
		return err
	}
	return ValidateMetadata(req.Metadata)
}

// ValidateMetadata checks a metadata payload's size: at most
// MaxMetadataLen bytes, else an *InvalidOptionError for "Metadata" (which
// does not quote the payload).
func ValidateMetadata(md []byte) error {
	if len(md) > MaxMetadataLen {
		return &InvalidOptionError{Option: "Metadata", Value: strconv.Itoa(len(md)) + " bytes",
			Reason: "at most " + strconv.Itoa(MaxMetadataLen) + " bytes"}
	}
	return nil
}

// ValidateOwner checks an owner string by the rules of a key, and reports
// a violation as an *InvalidOptionError for "Owner". The engine's owners
// (host, process and a random suffix) always pass.
func ValidateOwner(owner string) error {
	if err := ValidateKey(owner); err != nil {
		reason := "invalid"
		var ke *InvalidKeyError
		if errors.As(err, &ke) {
			reason = ke.Reason
		}
		return &InvalidOptionError{Option: "Owner", Value: strconv.Quote(owner), Reason: reason}
	}
	return nil
}
