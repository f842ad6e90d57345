package grpcfence

import (
	"context"

	"google.golang.org/grpc"

	"github.com/fencelock/fencelock"
)

// ctxKey keys the per-call fencing in a context.
type ctxKey struct{}

// callFence is what WithLease and WithToken put in a context.
type callFence struct {
	lease  *fencelock.Lease // nil: token and holder are given
	token  fencelock.Token
	holder string
}

// WithLease returns a context under which calls through the client
// interceptors carry l's token and holder (read when each call starts).
// It takes precedence over the interceptor's own lease.
func WithLease(ctx context.Context, l *fencelock.Lease) context.Context {
	return context.WithValue(ctx, ctxKey{}, callFence{lease: l})
}

// WithToken returns a context under which calls through the client
// interceptors carry token and holder: for a process that was handed them
// rather than a lease (a job under `fencelock run` reads
// $FENCELOCK_TOKEN and $FENCELOCK_OWNER). It takes precedence over the
// interceptor's own lease.
func WithToken(ctx context.Context, token fencelock.Token, holder string) context.Context {
	return context.WithValue(ctx, ctxKey{}, callFence{token: token, holder: holder})
}

// fenceOf returns the token and holder a call under ctx carries: from
// WithLease or WithToken, else from l; ok is false if there are none.
func fenceOf(ctx context.Context, l *fencelock.Lease) (fencelock.Token, string, bool) {
	if f, ok := ctx.Value(ctxKey{}).(callFence); ok {
		if f.lease == nil {
			return f.token, f.holder, true
		}
		l = f.lease
	}
	if l == nil {
		return 0, "", false
	}
	return l.Token(), l.Owner(), true
}

// outgoing returns ctx with the fencing metadata of the call added, if the
// call carries any.
func outgoing(ctx context.Context, l *fencelock.Lease) context.Context {
	if token, holder, ok := fenceOf(ctx, l); ok {
		return setOutgoing(ctx, token, holder)
	}
	return ctx
}

// UnaryClientInterceptor returns a client interceptor that puts the
// fencing token and holder into every unary call's outgoing metadata:
// those of the call's context (WithLease, WithToken) if it has any, else
// l's. l may be nil: then only calls whose context carries a lease or
// token are fenced, and the others are sent unchanged. Fencing metadata
// already in the outgoing context is replaced, so a call carries exactly
// one token and one holder.
func UnaryClientInterceptor(l *fencelock.Lease) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(outgoing(ctx, l), method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor is UnaryClientInterceptor for streams: the
// stream's metadata, sent when it opens, carries the token and holder.
func StreamClientInterceptor(l *fencelock.Lease) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(outgoing(ctx, l), desc, cc, method, opts...)
	}
}
