package etcd

import (
	"context"
	"errors"
	"io"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The client Open makes fails fast: a request to a cluster it cannot
// reach returns gRPC's error (Unavailable, naming the cause: "connection
// refused") within milliseconds, instead of waiting for the connection to
// be ready until its context ends and then reporting only "context
// deadline exceeded". clientv3's defaults do the latter: every request
// waits for ready (grpc.WaitForReady(true)), a read is retried up to 100
// times 25ms apart, and KeepAliveOnce retries an unavailable cluster for
// as long as its context lasts, without a pause (with
// context.Background(), for ever). The engine retries what failed, with
// its backoff, within the call's bound; a backend does not retry (package
// driver).
const (
	// unaryAttempts is clientv3's MaxUnaryRetries: one retry, so that a
	// request rejected for an expired auth token is sent again with a
	// fresh one; an unreachable cluster costs one more failed pick.
	unaryAttempts = 2

	// reconnectBase and reconnectMax bound gRPC's pause between attempts
	// to reconnect to an endpoint (its defaults: 1s, growing to 120s).
	// While it pauses, requests fail at once with the last connection
	// error; a cluster that comes back is used again within
	// reconnectMax.
	reconnectBase = 50 * time.Millisecond
	reconnectMax  = time.Second

	// keepAliveTime and keepAliveTimeout: a connection whose server has
	// not answered a ping for keepAliveTime+keepAliveTimeout (a stopped
	// process, a network that drops everything) is closed, failing the
	// requests on it with Unavailable, and a new one is dialled. 10s is
	// gRPC's minimum, above etcd's default --grpc-keepalive-min-time of
	// 5s.
	keepAliveTime    = 10 * time.Second
	keepAliveTimeout = 5 * time.Second
)

// failFast sets the fields of cfg, the configuration of a client Open
// makes, that make its requests fail fast (see unaryAttempts).
func failFast(cfg *clientv3.Config) {
	cfg.MaxUnaryRetries = unaryAttempts
	cfg.DialKeepAliveTime = keepAliveTime
	cfg.DialKeepAliveTimeout = keepAliveTimeout
	cfg.DialOptions = append(cfg.DialOptions,
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: reconnectBase, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMax},
			MinConnectTimeout: cfg.DialTimeout,
		}),
		// clientv3 adds grpc.WaitForReady(true) to every request; this
		// interceptor runs after it (and after clientv3's retries) and
		// has the last word.
		grpc.WithChainUnaryInterceptor(noWaitForReady),
	)
}

// noWaitForReady sends a unary request without waiting for a ready
// connection: with none (an endpoint refusing connections, or gRPC
// pausing between reconnection attempts) it fails at once with the
// connection's error.
func noWaitForReady(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(ctx, method, req, reply, cc, append(opts, grpc.WaitForReady(false))...)
}

// oneShotLease is the Lease of a client Open makes: its KeepAliveOnce
// sends one keep-alive, without waiting for a ready connection, and
// returns its answer or its failure. clientv3's retries an unavailable
// cluster until ctx ends.
type oneShotLease struct {
	clientv3.Lease
	remote pb.LeaseClient
}

// withOneShotKeepAlive replaces cli's Lease by a oneShotLease.
func withOneShotKeepAlive(cli *clientv3.Client) {
	cli.Lease = oneShotLease{Lease: cli.Lease, remote: pb.NewLeaseClient(cli.ActiveConnection())}
}

// KeepAliveOnce renews lease id once. A lease etcd no longer has is
// rpctypes.ErrLeaseNotFound, as from clientv3's; a context error is ctx's
// error, as from clientv3's.
func (l oneShotLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream
	stream, err := l.remote.LeaseKeepAlive(sctx, grpc.WaitForReady(false))
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	// On a failure of the stream Send returns io.EOF, and Recv the
	// stream's status.
	if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil && !errors.Is(err, io.EOF) {
		return nil, clientv3.ContextError(ctx, err)
	}
	resp, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			// Closed by the server without an answer or a status.
			err = status.Error(codes.Unavailable, "etcd closed the keep-alive stream without an answer")
		}
		return nil, clientv3.ContextError(ctx, err)
	}
	_ = stream.CloseSend()
	if resp.TTL <= 0 {
		return nil, rpctypes.ErrLeaseNotFound
	}
	return &clientv3.LeaseKeepAliveResponse{ResponseHeader: resp.GetHeader(), ID: clientv3.LeaseID(resp.ID), TTL: resp.TTL}, nil
}
