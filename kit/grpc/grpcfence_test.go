package grpcfence_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance/resource"
	grpcfence "github.com/fencelock/fencelock/kit/grpc"
)

// ctxFor bounds a test's calls.
func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// grpcResource is the resource suite's view of the test service: Write is
// a Put carrying the token and holder, through the client interceptor;
// Read is a Get.
type grpcResource struct{ conn *grpc.ClientConn }

func (r grpcResource) Write(ctx context.Context, name string, token fencelock.Token, holder, value string) error {
	err := put(grpcfence.WithToken(ctx, token, holder), r.conn, name, value)
	if se, ok := grpcfence.AsStale(err); ok {
		return se
	}
	return err
}

func (r grpcResource) Read(ctx context.Context, name string) (string, bool, error) {
	return get(ctx, r.conn, name)
}

// TestServerPassesTheResourceSuite runs the resource conformance suite on
// fencetest.KV behind a Server over a fencelock.Fence, every write a gRPC
// call that carries its token and holder in metadata, serialized per
// resource.
func TestServerPassesTheResourceSuite(t *testing.T) {
	fs := &grpcfence.Server{Checker: &fencelock.Fence{}, Resource: kvResource}
	conn := serve(t, fs, &kv{}, grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)))
	r := grpcResource{conn}
	resource.Run(t, resource.Harness{
		Resource: func(*testing.T) resource.Resource { return r },
		Tokens64: true,
	})
}

// leases returns two leases on one key from a memory store, the first
// released before the second was granted, so the second's token is higher.
func leases(t *testing.T, key string) (first, second *fencelock.Lease) {
	ctx := ctxFor(t)
	c, err := fencelock.New(memory.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if first, err = c.Acquire(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if second, err = c.Acquire(ctx, key); err != nil {
		t.Fatal(err)
	}
	if second.Token() <= first.Token() {
		t.Fatalf("second token %d is not above first %d", second.Token(), first.Token())
	}
	return first, second
}

// TestStreamIsFencedBeforeItsHandlerRuns opens PutAll streams through the
// stream client interceptor: the current lease's stream is written, and a
// stream carrying the previous lease's token is refused as stale before
// its handler reads a message.
func TestStreamIsFencedBeforeItsHandlerRuns(t *testing.T) {
	ctx := ctxFor(t)
	first, second := leases(t, "batch-lock")
	k := &kv{}
	fs := &grpcfence.Server{Checker: &fencelock.Fence{}, Resource: kvResource}
	conn := serve(t, fs, k, grpc.WithChainStreamInterceptor(grpcfence.StreamClientInterceptor(second)))

	n, err := putAll(ctx, conn, putRequest{"x", "1"}, putRequest{"y", "2"})
	if err != nil || n != 2 {
		t.Fatalf("stream of the current lease: wrote %d, err %v; want 2 writes, no error", n, err)
	}
	_, err = putAll(grpcfence.WithLease(ctx, first), conn, putRequest{"x", "late"})
	if !grpcfence.IsStale(err) {
		t.Fatalf("stream of the previous lease (token %d after %d): err %v, want a stale refusal", first.Token(), second.Token(), err)
	}
	if got := status.Code(err); got != codes.FailedPrecondition {
		t.Errorf("stale stream: code %v, want FailedPrecondition", got)
	}
	se, ok := grpcfence.AsStale(err)
	if !ok || !errors.Is(se, fencelock.ErrStaleToken) || se.Resource != batchResource || se.Token != first.Token() || se.Highest != second.Token() {
		t.Errorf("AsStale = %+v, %v; want resource %q, token %d, highest %d, matching ErrStaleToken",
			se, ok, batchResource, first.Token(), second.Token())
	}
	if w := k.writes(); w != 2 {
		t.Errorf("the stale stream's handler wrote: %d writes in all, want 2", w)
	}
	if v, _ := k.get("x"); v != "1" {
		t.Errorf("x = %q after the stale stream, want %q", v, "1")
	}
}

// TestFencedCallWithoutValidMetadataIsInvalidArgument sends fenced Puts
// whose fencing metadata is missing or malformed: each is refused with
// InvalidArgument naming the key at fault, is not stale, and its handler
// does not run.
func TestFencedCallWithoutValidMetadataIsInvalidArgument(t *testing.T) {
	ctx := ctxFor(t)
	k := &kv{}
	fence := &fencelock.Fence{}
	conn := serve(t, &grpcfence.Server{Checker: fence, Resource: kvResource}, k)
	for _, c := range []struct {
		name string
		md   []string // key, value pairs
		key  string   // the key the message must name
	}{
		{"no metadata", nil, grpcfence.TokenKey},
		{"no token", []string{grpcfence.HolderKey, "a"}, grpcfence.TokenKey},
		{"no holder", []string{grpcfence.TokenKey, "5"}, grpcfence.HolderKey},
		{"empty token", []string{grpcfence.TokenKey, "", grpcfence.HolderKey, "a"}, grpcfence.TokenKey},
		{"token not a number", []string{grpcfence.TokenKey, "five", grpcfence.HolderKey, "a"}, grpcfence.TokenKey},
		{"negative token", []string{grpcfence.TokenKey, "-5", grpcfence.HolderKey, "a"}, grpcfence.TokenKey},
		{"signed token", []string{grpcfence.TokenKey, "+5", grpcfence.HolderKey, "a"}, grpcfence.TokenKey},
		{"spaces", []string{grpcfence.TokenKey, " 5", grpcfence.HolderKey, "a"}, grpcfence.TokenKey},
		{"float", []string{grpcfence.TokenKey, "5e3", grpcfence.HolderKey, "a"}, grpcfence.TokenKey},
		{"above 2^64-1", []string{grpcfence.TokenKey, "18446744073709551616", grpcfence.HolderKey, "a"}, grpcfence.TokenKey},
		{"two tokens", []string{grpcfence.TokenKey, "5", grpcfence.TokenKey, "6", grpcfence.HolderKey, "a"}, grpcfence.TokenKey},
		{"empty holder", []string{grpcfence.TokenKey, "5", grpcfence.HolderKey, ""}, grpcfence.HolderKey},
		{"two holders", []string{grpcfence.TokenKey, "5", grpcfence.HolderKey, "a", grpcfence.HolderKey, "b"}, grpcfence.HolderKey},
		{"text and binary holder", []string{grpcfence.TokenKey, "5", grpcfence.HolderKey, "a", grpcfence.HolderBinKey, "a"}, grpcfence.HolderKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := put(metadata.AppendToOutgoingContext(ctx, c.md...), conn, "r", "v")
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("err %v, want InvalidArgument", err)
			}
			if !strings.Contains(st.Message(), strconv.Quote(c.key)) {
				t.Errorf("message %q does not name %q", st.Message(), c.key)
			}
			if grpcfence.IsStale(err) {
				t.Errorf("IsStale(%v) = true for malformed metadata", err)
			}
		})
	}
	if w := k.writes(); w != 0 {
		t.Errorf("handlers wrote %d times, want 0", w)
	}
	if h := fence.Highest("r"); h != 0 {
		t.Errorf("the fence recorded token %d, want none", h)
	}
}

// TestUnfencedCallNeedsNoMetadata calls Get, for which the Resource
// function names no resource: it runs without fencing metadata.
func TestUnfencedCallNeedsNoMetadata(t *testing.T) {
	conn := serve(t, &grpcfence.Server{Checker: &fencelock.Fence{}, Resource: kvResource}, &kv{})
	if _, _, err := get(ctxFor(t), conn, "r"); err != nil {
		t.Fatalf("unfenced Get: %v", err)
	}
}

// TestTokenAndHolderTravelExactly sends tokens past 2^53 and up to 2^64-1,
// and a holder that is not ASCII: the handler sees the same token, written
// in decimal exactly as strconv.FormatUint writes it, and the same holder.
func TestTokenAndHolderTravelExactly(t *testing.T) {
	ctx := ctxFor(t)
	type seen struct {
		token  fencelock.Token
		raw    []string
		holder string
	}
	got := make(chan seen, 1)
	k := &kv{onPut: func(ctx context.Context, _, _ string) error {
		token, holder, err := grpcfence.FromIncomingContext(ctx)
		if err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(ctx)
		got <- seen{token, md.Get(grpcfence.TokenKey), holder}
		return nil
	}}
	conn := serve(t, &grpcfence.Server{Checker: &fencelock.Fence{}, Resource: kvResource}, k,
		grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)))
	for i, c := range []struct {
		token  fencelock.Token
		holder string
	}{
		{1<<53 + 1, "worker-a"},
		{math.MaxInt64, "wörker-ü\x00\n"},
		{math.MaxUint64, "worker-b"},
	} {
		// Stale metadata already in the context is replaced, not added to.
		ctx := metadata.AppendToOutgoingContext(ctx, grpcfence.TokenKey, "1", grpcfence.HolderKey, "stale")
		if err := put(grpcfence.WithToken(ctx, c.token, c.holder), conn, "r", strconv.Itoa(i)); err != nil {
			t.Fatalf("write with token %d from %q: %v", c.token, c.holder, err)
		}
		s := <-got
		want := strconv.FormatUint(uint64(c.token), 10)
		if s.token != c.token || len(s.raw) != 1 || s.raw[0] != want || s.holder != c.holder {
			t.Errorf("sent token %d from %q; handler saw token %d (metadata %q) from %q; want metadata [%q]",
				c.token, c.holder, s.token, s.raw, s.holder, want)
		}
	}
}

// TestCallContextLeaseTakesPrecedence builds the client interceptor with
// one lease and calls with another in the context: the call carries the
// context's lease; a call without one carries the interceptor's.
func TestCallContextLeaseTakesPrecedence(t *testing.T) {
	ctx := ctxFor(t)
	first, second := leases(t, "k")
	holders := make(chan string, 1)
	k := &kv{onPut: func(ctx context.Context, _, _ string) error {
		_, holder, err := grpcfence.FromIncomingContext(ctx)
		holders <- holder
		return err
	}}
	conn := serve(t, &grpcfence.Server{Checker: &fencelock.Fence{}, Resource: kvResource}, k,
		grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(first)))
	if err := put(grpcfence.WithLease(ctx, second), conn, "r", "1"); err != nil {
		t.Fatal(err)
	}
	if h := <-holders; h != second.Owner() {
		t.Errorf("call with the second lease in its context carried holder %q, want %q", h, second.Owner())
	}
	err := put(ctx, conn, "r", "2")
	if !grpcfence.IsStale(err) {
		t.Errorf("call with only the interceptor's (first, stale) lease: err %v, want stale", err)
	}
}

// TestHandlerFailedPreconditionIsNotStale has the handler itself answer
// FailedPrecondition: IsStale tells it from a refusal by the rule.
func TestHandlerFailedPreconditionIsNotStale(t *testing.T) {
	ctx := ctxFor(t)
	k := &kv{onPut: func(context.Context, string, string) error {
		return status.Error(codes.FailedPrecondition, "balance too low")
	}}
	conn := serve(t, &grpcfence.Server{Checker: &fencelock.Fence{}, Resource: kvResource}, k,
		grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)))
	err := put(grpcfence.WithToken(ctx, 5, "a"), conn, "r", "v")
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("err %v, want the handler's FailedPrecondition", err)
	}
	if grpcfence.IsStale(err) {
		t.Errorf("IsStale(%v) = true for the handler's own error", err)
	}
	if _, ok := grpcfence.AsStale(err); ok {
		t.Errorf("AsStale(%v) ok for the handler's own error", err)
	}
}

// failingChecker fails every check, as a store that is down does.
type failingChecker struct{}

func (failingChecker) Check(string, fencelock.Token, string) error {
	return errors.New("store unreachable")
}

// TestCheckerFailureIsUnavailable has the Checker fail: the call is
// refused with Unavailable, not as stale, and its handler does not run.
func TestCheckerFailureIsUnavailable(t *testing.T) {
	ctx := ctxFor(t)
	k := &kv{}
	conn := serve(t, &grpcfence.Server{Checker: failingChecker{}, Resource: kvResource}, k,
		grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)))
	err := put(grpcfence.WithToken(ctx, 5, "a"), conn, "r", "v")
	if status.Code(err) != codes.Unavailable || grpcfence.IsStale(err) {
		t.Errorf("err %v (stale %v), want Unavailable, not stale", err, grpcfence.IsStale(err))
	}
	if w := k.writes(); w != 0 {
		t.Errorf("handler wrote %d times after a failed check, want 0", w)
	}
}
