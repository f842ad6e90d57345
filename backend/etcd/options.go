package etcd

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fencelock/fencelock/driver"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// DefaultPrefix is the etcd key prefix used when Options.Prefix is empty.
const DefaultPrefix = "/fencelock/"

// maxPrefixLen bounds Options.Prefix.
const maxPrefixLen = 256

// Options configures a Backend. A nil *Options, and every zero field, means
// the documented default.
type Options struct {
	// Prefix is the etcd key prefix under which every lock queue lives.
	// Default DefaultPrefix ("/fencelock/"). It must be 1 to 256 bytes of
	// printable UTF-8 and end with '/'. Backends that share a prefix
	// share locks; give unrelated applications different prefixes.
	Prefix string

	// CleanupTimeout bounds the clean-up requests that run on a fresh
	// context after the caller's context ended: removal of a cancelled
	// waiter's queue entry, and revocation of the backend's leases in
	// Close. Default 5s.
	CleanupTimeout time.Duration
}

// Validate reports the first option out of range as a
// *driver.InvalidOptionError.
func (o *Options) Validate() error {
	_, err := o.resolve()
	return err
}

func (o *Options) resolve() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Prefix == "" {
		r.Prefix = DefaultPrefix
	}
	if err := validatePrefix(r.Prefix); err != nil {
		return r, err
	}
	if r.CleanupTimeout == 0 {
		r.CleanupTimeout = 5 * time.Second
	}
	if r.CleanupTimeout < 0 {
		return r, &driver.InvalidOptionError{Option: "CleanupTimeout", Value: r.CleanupTimeout.String(), Reason: "must be positive"}
	}
	return r, nil
}

func validatePrefix(p string) error {
	bad := func(reason string) error {
		return &driver.InvalidOptionError{Option: "Prefix", Value: strconv.Quote(p), Reason: reason}
	}
	switch {
	case len(p) > maxPrefixLen:
		return bad(fmt.Sprintf("must be at most %d bytes", maxPrefixLen))
	case !utf8.ValidString(p):
		return bad("must be valid UTF-8")
	case !strings.HasSuffix(p, "/"):
		return bad("must end with '/'")
	}
	for _, r := range p {
		if !unicode.IsPrint(r) {
			return bad(fmt.Sprintf("must be printable (found %U)", r))
		}
	}
	return nil
}

// isLeaseNotFound reports whether err says a lease no longer exists.
func isLeaseNotFound(err error) bool {
	return errors.Is(err, errLeaseGone) || errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}
