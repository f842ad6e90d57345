package grpcfence_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	grpcfence "github.com/fencelock/fencelock/kit/grpc"
)

// A key-value service fences every Put on the name it writes; a client
// sends its lease's token with every call. The first holder of the lock,
// paused until the next holder has written, is refused.
func Example() {
	ctx := context.Background()

	// Server: the rule in memory (a fencelock.Fence), applied to Put calls
	// before their handler runs. Get is not fenced.
	fs := &grpcfence.Server{
		Checker: &fencelock.Fence{},
		Resource: func(method string, req any) string {
			if method == "/fencetest.KV/Put" {
				return req.(*putRequest).Name
			}
			return ""
		},
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(fs.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(fs.StreamInterceptor()),
	)
	srv.RegisterService(&kvDesc, &kv{})
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	defer srv.Stop()

	// Client: every call carries the token and holder of the lease in its
	// context.
	conn, err := grpc.NewClient("passthrough:///kv",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype("json")),
		grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)),
		grpc.WithChainStreamInterceptor(grpcfence.StreamClientInterceptor(nil)),
	)
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	locks, _ := fencelock.New(memory.New(), nil)
	defer locks.Close()
	first, _ := locks.Acquire(ctx, "accounts/1")
	_ = first.Release(ctx) // as if its lease had run out while it was paused
	next, _ := locks.Acquire(ctx, "accounts/1")

	err = conn.Invoke(grpcfence.WithLease(ctx, next), "/fencetest.KV/Put",
		&putRequest{Name: "accounts/1", Value: "balance=100"}, new(putReply))
	fmt.Println("next holder's write:", err)

	err = conn.Invoke(grpcfence.WithLease(ctx, first), "/fencetest.KV/Put",
		&putRequest{Name: "accounts/1", Value: "balance=0"}, new(putReply))
	fmt.Println("first holder's late write is stale:", grpcfence.IsStale(err))
	if se, ok := grpcfence.AsStale(err); ok {
		fmt.Println(se)
	}
	// Output:
	// next holder's write: <nil>
	// first holder's late write is stale: true
	// fencelock: stale fencing token 1 for "accounts/1" (highest seen 2)
}
