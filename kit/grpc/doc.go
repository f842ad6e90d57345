// Package grpcfence carries fencelock's fencing tokens over gRPC and applies
// the fencing rule of docs/fencing.md at the server, per resource, before a
// handler runs.
//
// The rule: a write carrying token T from holder H is accepted if T is
// greater than the highest token the resource has accepted, or if T equals
// that highest token and H is the holder that presented it; an accepted
// write records T and H; anything else is refused and changes nothing.
// Token 0 is never accepted.
//
// # Client
//
// UnaryClientInterceptor and StreamClientInterceptor put a lease's token
// and holder into every call's outgoing metadata, under the keys
// "fencing-token" (the token in decimal, exactly as strconv.FormatUint
// writes it) and "fencing-holder" (the lease's Owner; a holder that is not
// printable ASCII travels as "fencing-holder-bin" instead, which gRPC
// base64-encodes). The lease comes from the call's context (WithLease,
// WithToken) or, failing that, from the lease the interceptor was built
// with; a call with neither is sent without fencing metadata.
//
//	conn, err := grpc.NewClient(target,
//		grpc.WithChainUnaryInterceptor(grpcfence.UnaryClientInterceptor(nil)),
//		...)
//	...
//	_, err = client.Put(grpcfence.WithLease(ctx, lease), req)
//	if grpcfence.IsStale(err) {
//		// the lease was lost and the next holder has written: stop
//	}
//
// # Server
//
// A Server holds a Checker (a *fencelock.Fence, or a kit's checker) and a
// Resource function that names the resource a call writes ("" for calls
// that are not fenced). Its UnaryInterceptor and StreamInterceptor read the
// token and holder of every fenced call, apply the rule through the
// Checker, and only then run the handler:
//
//   - missing or malformed fencing metadata: codes.InvalidArgument, and the
//     handler does not run;
//   - a token the rule refuses: codes.FailedPrecondition, with the
//     *fencelock.StaleTokenError's text as the message and an ErrorInfo
//     detail (reason StaleReason, domain Domain) that IsStale and AsStale
//     recognise on the client; the handler does not run.
//
// FailedPrecondition, not Aborted: a refused token never becomes good on a
// retry (gRPC's guidance for Aborted is "retry at a higher level"; for
// FailedPrecondition "do not retry until the system state has been
// explicitly fixed"). The fix is a new lease, with a new token, and a read
// of what the next holder wrote; a retry policy that retries Aborted calls
// must not resend a stale write.
//
// # Atomicity
//
// The rule only protects a write if the check, the record and the write
// are one atomic step. The interceptors check and record the token before
// the handler runs; the handler's write comes after. Two fenced calls on
// one resource can interleave between those steps: a holder with token 5
// is checked, pauses, the next holder with token 9 is checked and writes,
// and then token 5's handler writes over it, late. Two ways to close that
// gap:
//
//   - A Server holds a per-resource lock from before the check until the
//     handler returns (for a stream, until the stream ends), so fenced
//     calls on one resource run one at a time, in the order they were
//     checked. This holds within one process only, only for writes that go
//     through this Server, and only if the handler has finished its write
//     when it returns. Replicas behind a load balancer, each with its own
//     Fence, fence nothing; several replicas need a Checker over shared
//     state, and even then check and write are two steps across replicas.
//   - With several server processes, or other writers to the same store,
//     apply the rule inside the store, in the same transaction as the
//     write (the store kits: kit/postgres, ...), and use the token and
//     holder of the call there: FromIncomingContext gives them to the
//     handler. The interceptor's check is then an early refusal, and the
//     store's check is the one that makes the write safe; set
//     Server.Concurrent to let such calls run at once.
//
// A check that accepts while the handler then fails has still recorded the
// token; that only refuses older tokens, which is safe.
package grpcfence
