package grpcfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/grpc/metadata"

	"github.com/fencelock/fencelock"
)

// Metadata keys of the fencing token and holder. gRPC metadata keys are
// lower case; over HTTP/2 they are the headers of the same names.
const (
	// TokenKey carries the fencing token in decimal, 0 to 2^64-1: the
	// client writes it as strconv.FormatUint does; the server takes
	// digits only (no sign, no spaces) and parses them exactly, never
	// through a floating-point number.
	TokenKey = "fencing-token"
	// HolderKey carries the holder (the lease's Owner) when it is
	// printable ASCII, as gRPC requires of a text metadata value.
	HolderKey = "fencing-holder"
	// HolderBinKey carries the holder when it is not printable ASCII; gRPC
	// base64-encodes "-bin" values on the wire. A call carries one of
	// HolderKey and HolderBinKey, never both.
	HolderBinKey = "fencing-holder-bin"
)

// ErrMetadata is matched by every *MetadataError.
var ErrMetadata = errors.New("grpcfence: missing or malformed fencing metadata")

// MetadataError reports a fenced call whose fencing metadata is missing or
// malformed. It matches ErrMetadata. The server interceptors answer it with
// codes.InvalidArgument and its text.
type MetadataError struct {
	// Key is the metadata key at fault.
	Key string
	// Problem says what is wrong with it.
	Problem string
}

// Error implements error.
func (e *MetadataError) Error() string {
	return fmt.Sprintf("grpcfence: fenced call: metadata %q %s: send the lease's token and holder "+
		"(grpcfence.UnaryClientInterceptor or StreamClientInterceptor, with grpcfence.WithLease(ctx, lease))",
		e.Key, e.Problem)
}

// Is reports whether target is ErrMetadata.
func (e *MetadataError) Is(target error) bool { return target == ErrMetadata }

// setOutgoing returns ctx with md's fencing keys replaced by token and
// holder, and the rest of its outgoing metadata kept.
func setOutgoing(ctx context.Context, token fencelock.Token, holder string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(TokenKey, strconv.FormatUint(uint64(token), 10))
	md.Delete(HolderKey)
	md.Delete(HolderBinKey)
	if printable(holder) {
		md.Set(HolderKey, holder)
	} else {
		md.Set(HolderBinKey, holder)
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// printable reports whether s can be a text metadata value: every byte in
// [0x20, 0x7E].
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// FromIncomingContext returns the fencing token and holder of the call
// whose server-side context is ctx, as a handler needs them to apply the
// rule inside its store. It returns a *MetadataError if either is missing,
// given more than once, or malformed (a token that is not a decimal
// integer from 0 to 2^64-1; an empty holder).
func FromIncomingContext(ctx context.Context) (fencelock.Token, string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	toks := md.Get(TokenKey)
	switch len(toks) {
	case 0:
		return 0, "", &MetadataError{Key: TokenKey, Problem: "is missing"}
	case 1:
	default:
		return 0, "", &MetadataError{Key: TokenKey, Problem: fmt.Sprintf("is given %d times, want once", len(toks))}
	}
	token, err := parseToken(toks[0])
	if err != nil {
		return 0, "", err
	}
	text, bin := md.Get(HolderKey), md.Get(HolderBinKey)
	var holders []string
	key := HolderKey
	switch {
	case len(text) > 0 && len(bin) > 0:
		return 0, "", &MetadataError{Key: HolderKey, Problem: "is given together with " + strconv.Quote(HolderBinKey) + ", want one of them"}
	case len(bin) > 0:
		holders, key = bin, HolderBinKey
	default:
		holders = text
	}
	switch len(holders) {
	case 0:
		return 0, "", &MetadataError{Key: HolderKey, Problem: "is missing"}
	case 1:
	default:
		return 0, "", &MetadataError{Key: key, Problem: fmt.Sprintf("is given %d times, want once", len(holders))}
	}
	if holders[0] == "" {
		return 0, "", &MetadataError{Key: key, Problem: "is empty"}
	}
	return token, holders[0], nil
}

// parseToken parses a token in decimal (as strconv.FormatUint writes it):
// digits only, no sign or spaces, at most 2^64-1. It never goes through a
// floating-point number.
func parseToken(s string) (fencelock.Token, error) {
	bad := func(why string) error {
		q := s
		if len(q) > 40 {
			q = q[:40] + "..."
		}
		return &MetadataError{Key: TokenKey, Problem: fmt.Sprintf("is %q, %s", q, why)}
	}
	if s == "" {
		return 0, bad("want a decimal token")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, bad("want a decimal token (digits only)")
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, bad("above 2^64-1")
	}
	return fencelock.Token(v), nil
}
