// Package httpfence carries fencing tokens over HTTP and applies the
// fencing rule of docs/fencing.md to them at the server, per resource,
// before the handler runs. It uses only the standard library and the
// fencelock core.
//
// Client: Transport is an http.RoundTripper that adds the token and holder
// to every request, as the headers Fencing-Token (decimal, up to 2^64-1)
// and Fencing-Holder, from a *fencelock.Lease or from the request's context
// (WithToken, WithLease). Refusal turns the server's refusal back into a
// *fencelock.StaleTokenError.
//
// Server: Middleware checks every request that writes a fenced resource
// with a Checker — *fencelock.Fence, or a kit over a store — and runs the
// handler only if the rule accepts the write: a missing or malformed token
// or holder is 400 Bad Request, a stale one 409 Conflict with the
// StaleTokenError's text.
//
// Atomicity: the rule protects a write only if the check, the record and
// the write are one step. Middleware holds a lock per resource from the
// check until the handler returns, so in one server process a write
// admitted for a resource completes before the next request for that
// resource is checked, and an older holder's write admitted first cannot
// land after a newer holder's. That holds only if the handler has finished
// its write when it returns (no write left running in the background), and
// only within the process: replicas behind a load balancer each with
// their own Fence do not fence anything. Several replicas need a Checker
// over shared state, and even then the check and the handler's write are
// two steps across replicas: have the handler write through a store kit
// that checks the token in the same transaction, and treat the middleware
// as the early refusal. A check that accepts while the handler then fails
// has still recorded the token; that only refuses older tokens, which is
// safe.
package httpfence

import (
	"context"
	"net/http"
	"strconv"

	"github.com/fencelock/fencelock"
)

// The headers that carry fencing over HTTP.
const (
	// HeaderToken carries the fencing token, in decimal.
	HeaderToken = "Fencing-Token"
	// HeaderHolder carries the holder: the lease's Owner.
	HeaderHolder = "Fencing-Holder"
	// HeaderHighest is set on a 409 refusal to the highest token the
	// resource has accepted, when the Checker says (a StaleTokenError).
	HeaderHighest = "Fencing-Highest"
	// HeaderResource is set on a 409 refusal to the resource refused.
	HeaderResource = "Fencing-Resource"
)

// source gives a request's token and holder.
type source func() (fencelock.Token, string)

type ctxKey struct{}

// WithToken returns a context whose requests, sent through a Transport,
// carry token and holder. It takes precedence over the Transport's Lease.
func WithToken(ctx context.Context, token fencelock.Token, holder string) context.Context {
	return context.WithValue(ctx, ctxKey{}, source(func() (fencelock.Token, string) { return token, holder }))
}

// WithLease returns a context whose requests, sent through a Transport,
// carry l's token and owner as they are when each request is sent (a
// rotated token included). It takes precedence over the Transport's Lease.
func WithLease(ctx context.Context, l *fencelock.Lease) context.Context {
	return context.WithValue(ctx, ctxKey{}, source(func() (fencelock.Token, string) { return l.Token(), l.Owner() }))
}

// Transport is an http.RoundTripper that adds the fencing token and holder
// to every request: those of the request's context (WithToken, WithLease),
// or else Lease's. A request with neither is sent as it is (a read the
// server does not fence, say; a server that fences it refuses it with 400).
type Transport struct {
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Lease, if set, fences every request whose context names no token.
	Lease *fencelock.Lease
}

// RoundTrip implements http.RoundTripper. It sends a copy of req with the
// fencing headers set, leaving req as it was.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	src, _ := req.Context().Value(ctxKey{}).(source)
	if src == nil && t.Lease != nil {
		l := t.Lease
		src = func() (fencelock.Token, string) { return l.Token(), l.Owner() }
	}
	if src == nil {
		return base.RoundTrip(req)
	}
	token, holder := src()
	r := req.Clone(req.Context())
	r.Header.Set(HeaderToken, strconv.FormatUint(uint64(token), 10))
	r.Header.Set(HeaderHolder, holder)
	return base.RoundTrip(r)
}

// Refusal returns a *fencelock.StaleTokenError (matching
// fencelock.ErrStaleToken) if resp is Middleware's refusal of a stale
// token: 409 Conflict with HeaderHighest set. It returns nil for any other
// response, a 409 of the handler's own included. It reads only headers.
func Refusal(resp *http.Response) error {
	if resp.StatusCode != http.StatusConflict {
		return nil
	}
	highest, ok := resp.Header[HeaderHighest]
	if !ok || len(highest) != 1 {
		return nil
	}
	e := &fencelock.StaleTokenError{Resource: resp.Header.Get(HeaderResource)}
	if h, err := strconv.ParseUint(highest[0], 10, 64); err == nil {
		e.Highest = fencelock.Token(h)
	}
	if tok, err := strconv.ParseUint(resp.Header.Get(HeaderToken), 10, 64); err == nil {
		e.Token = fencelock.Token(tok)
	}
	return e
}
