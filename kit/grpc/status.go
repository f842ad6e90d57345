package grpcfence

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencelock/fencelock"
)

// The ErrorInfo detail of a refusal by the rule: its Reason and Domain.
const (
	// StaleReason is the ErrorInfo reason of a call refused by the rule.
	StaleReason = "STALE_FENCING_TOKEN"
	// Domain is the ErrorInfo domain of grpcfence's reasons.
	Domain = "github.com/fencelock/fencelock"
)

// staleStatus is the status of a call whose token the rule refused: code
// FailedPrecondition, err's text, and an ErrorInfo detail carrying the
// resource, the refused token and the highest one, in decimal.
func staleStatus(err error) *status.Status {
	st := status.New(codes.FailedPrecondition, err.Error())
	info := &errdetails.ErrorInfo{Reason: StaleReason, Domain: Domain}
	var se *fencelock.StaleTokenError
	if errors.As(err, &se) {
		info.Metadata = map[string]string{
			"resource": se.Resource,
			"token":    strconv.FormatUint(uint64(se.Token), 10),
			"highest":  strconv.FormatUint(uint64(se.Highest), 10),
		}
	}
	if d, derr := st.WithDetails(info); derr == nil {
		return d
	}
	return st
}

// checkStatus is the status a server interceptor answers for err, an
// error from reading the call's metadata (InvalidArgument), from waiting
// for the resource's lock (the context's code) or from the Checker
// (FailedPrecondition if stale, else Unavailable).
func checkStatus(err error) error {
	var me *MetadataError
	switch {
	case errors.As(err, &me):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, fencelock.ErrStaleToken):
		return staleStatus(err).Err()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	// The error's text is not sent: it may describe the store.
	return status.Error(codes.Unavailable, "grpcfence: the fencing check failed, so nothing was written; retry later")
}

// staleInfo returns the ErrorInfo detail of a refusal by the rule in err,
// if it has one.
func staleInfo(err error) (*errdetails.ErrorInfo, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return nil, false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == StaleReason && info.GetDomain() == Domain {
			return info, true
		}
	}
	return nil, false
}

// IsStale reports whether err, returned by a gRPC call (or wrapping such an
// error), is a refusal by a grpcfence server: the call's fencing token was
// stale (lower than the highest the resource accepted, or equal to it from
// another holder, or 0) and the handler did not run. Other
// FailedPrecondition errors, such as a handler's own, are not stale.
//
// A gRPC status error does not match fencelock.ErrStaleToken itself; use
// IsStale, or AsStale for an error that does.
func IsStale(err error) bool {
	_, ok := staleInfo(err)
	return ok
}

// AsStale returns the *fencelock.StaleTokenError of a refusal by a
// grpcfence server (see IsStale), with the resource, the refused token and
// the highest token the server reported; it matches
// fencelock.ErrStaleToken. ok is false if err is not such a refusal.
func AsStale(err error) (se *fencelock.StaleTokenError, ok bool) {
	info, ok := staleInfo(err)
	if !ok {
		return nil, false
	}
	md := info.GetMetadata()
	se = &fencelock.StaleTokenError{Resource: md["resource"]}
	if v, err := strconv.ParseUint(md["token"], 10, 64); err == nil {
		se.Token = fencelock.Token(v)
	}
	if v, err := strconv.ParseUint(md["highest"], 10, 64); err == nil {
		se.Highest = fencelock.Token(v)
	}
	return se, true
}
