package grpcfence_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencelock/fencelock"
	grpcfence "github.com/fencelock/fencelock/kit/grpc"
)

// pausedWriter is a test service whose Put of the value "A" pauses in its
// handler, after the check, until released: a holder paused between the
// check and its write.
type pausedWriter struct {
	kv
	enteredA, releaseA, enteredB chan struct{}
}

func newPausedWriter() *pausedWriter {
	p := &pausedWriter{enteredA: make(chan struct{}), releaseA: make(chan struct{}), enteredB: make(chan struct{})}
	p.onPut = func(ctx context.Context, _, value string) error {
		switch value {
		case "A":
			close(p.enteredA)
			select {
			case <-p.releaseA:
			case <-ctx.Done():
				return ctx.Err()
			}
		case "B":
			close(p.enteredB)
		}
		return nil
	}
	return p
}

// await waits for ch, at most until ctx ends.
func await(t *testing.T, ctx context.Context, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("gave up waiting for %s: %v", what, ctx.Err())
	}
}

// TestServerHoldsResourceAcrossHandler pauses holder A (token 5) in its
// handler after its check and sends holder B's write (token 9) to the
// same resource: B waits for A's call to end before it is checked, so A's
// write lands first and B's last, and the resource ends with B's value.
func TestServerHoldsResourceAcrossHandler(t *testing.T) {
	ctx := ctxFor(t)
	p := newPausedWriter()
	fs := &grpcfence.Server{Checker: &fencelock.Fence{}, Resource: kvResource}
	waiting := make(chan struct{}, 1)
	grpcfence.SetWaitHooks(fs, func(string) { waiting <- struct{}{} }, nil)
	conn := serve(t, fs, &p.kv, grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)))

	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { errA <- put(grpcfence.WithToken(ctx, 5, "a"), conn, "r", "A") }()
	await(t, ctx, p.enteredA, "A's handler")
	go func() { errB <- put(grpcfence.WithToken(ctx, 9, "b"), conn, "r", "B") }()
	select {
	case <-waiting:
	case <-p.enteredB:
		t.Fatal("B's handler ran while A's call, checked first, had not written yet")
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	close(p.releaseA)
	if err := <-errA; err != nil {
		t.Fatalf("A: %v", err)
	}
	if err := <-errB; err != nil {
		t.Fatalf("B: %v", err)
	}
	if v, _ := p.get("r"); v != "B" {
		t.Errorf("r = %q, want %q: the lower token's write landed last", v, "B")
	}
}

// TestConcurrentServerLetsALateWriteLand is the atomicity limit that the
// per-resource lock closes, shown with Concurrent set: A (token 5) is
// checked and pauses, B (token 9) is checked and writes, then A's handler
// writes over B's value. A handler under Concurrent must apply the rule in
// its store itself.
func TestConcurrentServerLetsALateWriteLand(t *testing.T) {
	ctx := ctxFor(t)
	p := newPausedWriter()
	fs := &grpcfence.Server{Checker: &fencelock.Fence{}, Resource: kvResource, Concurrent: true}
	conn := serve(t, fs, &p.kv, grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)))

	errA := make(chan error, 1)
	go func() { errA <- put(grpcfence.WithToken(ctx, 5, "a"), conn, "r", "A") }()
	await(t, ctx, p.enteredA, "A's handler")
	if err := put(grpcfence.WithToken(ctx, 9, "b"), conn, "r", "B"); err != nil {
		t.Fatalf("B: %v", err)
	}
	close(p.releaseA)
	if err := <-errA; err != nil {
		t.Fatalf("A: %v", err)
	}
	if v, _ := p.get("r"); v != "A" {
		t.Errorf("r = %q; with Concurrent, A's late write lands over B's (%q)", v, "A")
	}
}

// TestWaitForResourceEndsWithCallContext cancels a call while it waits
// for the resource's lock: it ends Canceled, and its token was never
// checked, so the fence still holds the earlier call's.
func TestWaitForResourceEndsWithCallContext(t *testing.T) {
	ctx := ctxFor(t)
	p := newPausedWriter()
	fence := &fencelock.Fence{}
	fs := &grpcfence.Server{Checker: fence, Resource: kvResource}
	waiting, gaveUp := make(chan struct{}, 1), make(chan struct{}, 1)
	grpcfence.SetWaitHooks(fs, func(string) { waiting <- struct{}{} }, func(string) { gaveUp <- struct{}{} })
	conn := serve(t, fs, &p.kv, grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)))

	errA := make(chan error, 1)
	go func() { errA <- put(grpcfence.WithToken(ctx, 5, "a"), conn, "r", "A") }()
	await(t, ctx, p.enteredA, "A's handler")
	bctx, cancelB := context.WithCancel(ctx)
	errB := make(chan error, 1)
	go func() { errB <- put(grpcfence.WithToken(bctx, 9, "b"), conn, "r", "B") }()
	select {
	case <-waiting:
	case <-p.enteredB:
		t.Fatal("B's handler ran while A's call, checked first, had not written yet")
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	cancelB()
	if err := <-errB; status.Code(err) != codes.Canceled {
		t.Errorf("B cancelled while waiting: err %v, want Canceled", err)
	}
	await(t, ctx, gaveUp, "the server to end B's wait")
	close(p.releaseA)
	if err := <-errA; err != nil {
		t.Fatalf("A: %v", err)
	}
	if h := fence.Highest("r"); h != 5 {
		t.Errorf("fence holds token %d, want 5: the cancelled call was checked", h)
	}
}
