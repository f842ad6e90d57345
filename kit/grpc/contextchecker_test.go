package grpcfence_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/fencelock/fencelock"
	grpcfence "github.com/fencelock/fencelock/kit/grpc"
)

// ctxChecker is a ContextChecker over a Fence that records whether each
// check was given the call's context (its fencing metadata is there), and
// counts calls of its context-free Check.
type ctxChecker struct {
	fence fencelock.Fence

	mu       sync.Mutex
	withCall int // CheckContext calls with the call's context
	plain    int // Check calls
}

func (c *ctxChecker) Check(resource string, token fencelock.Token, holder string) error {
	c.mu.Lock()
	c.plain++
	c.mu.Unlock()
	return c.fence.Check(resource, token, holder)
}

func (c *ctxChecker) CheckContext(ctx context.Context, resource string, token fencelock.Token, holder string) error {
	if tok, h, err := grpcfence.FromIncomingContext(ctx); err == nil && tok == token && h == holder {
		if _, ok := ctx.Deadline(); ok {
			c.mu.Lock()
			c.withCall++
			c.mu.Unlock()
		}
	}
	return c.fence.Check(resource, token, holder)
}

var _ grpcfence.ContextChecker = (*ctxChecker)(nil)

// TestServerChecksWithCallContext: a Checker that has CheckContext is
// asked through it, with the call's context (its metadata and the
// client's deadline, so a check over a store ends with the call), and
// never through Check; its answers are applied as Check's are.
func TestServerChecksWithCallContext(t *testing.T) {
	ctx := ctxFor(t)
	c := &ctxChecker{}
	conn := serve(t, &grpcfence.Server{Checker: c, Resource: kvResource}, &kv{},
		grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)))
	if err := put(grpcfence.WithToken(ctx, 5, "a"), conn, "r", "v"); err != nil {
		t.Fatalf("token 5: %v", err)
	}
	if err := put(grpcfence.WithToken(ctx, 4, "a"), conn, "r", "late"); !grpcfence.IsStale(err) {
		t.Fatalf("token 4 after 5: %v; want a stale refusal", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.withCall != 2 || c.plain != 0 {
		t.Errorf("CheckContext with the call's context %d times, Check %d times; want 2 and 0", c.withCall, c.plain)
	}
}
