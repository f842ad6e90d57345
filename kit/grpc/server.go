package grpcfence

import (
	"context"
	"sync"

	"google.golang.org/grpc"

	"github.com/fencelock/fencelock"
)

// Checker applies the fencing rule of docs/fencing.md to one write: it
// accepts, and records, token from holder for resource, or returns an
// error matching fencelock.ErrStaleToken and records nothing.
// *fencelock.Fence is a Checker. Check must be safe for concurrent use.
type Checker interface {
	Check(resource string, token fencelock.Token, holder string) error
}

var _ Checker = (*fencelock.Fence)(nil)

// ContextChecker is a Checker that can also take the call's context, as a
// kit's checker over a store can (kit/postgres's Checker): a Server calls
// CheckContext, with the call's context, instead of Check when its
// Checker has it, so that a check ends with the call's deadline or when
// the client goes away.
type ContextChecker interface {
	Checker
	CheckContext(ctx context.Context, resource string, token fencelock.Token, holder string) error
}

// ResourceFunc names the resource a call writes, from its full method
// ("/package.Service/Method") and its request; "" means the call is not
// fenced and runs without a check. For a stream, req is nil: the stream's
// messages are not read before its handler runs, so a stream's resource
// comes from its method (or fence each message in the handler, with
// FromIncomingContext and the Checker).
type ResourceFunc func(fullMethod string, req any) string

// Server is the server side of fencing over gRPC: its interceptors apply
// the rule through Checker to every call that Resource names a resource
// for, before the handler runs (see the package documentation for the
// status codes a refused call gets). Set the fields before first use; a
// Server is safe for concurrent use. Use one Server for both interceptors,
// so that its per-resource lock covers unary calls and streams together.
type Server struct {
	// Checker applies the rule; *fencelock.Fence in memory, or a kit's
	// checker over a store (kit/postgres's Checker). A ContextChecker is
	// asked with the call's context. Required.
	Checker Checker
	// Resource names the resource each call writes; "" for calls that are
	// not fenced. Required.
	Resource ResourceFunc
	// Concurrent, if true, lets fenced calls on one resource run at once.
	// By default (false) a Server holds a per-resource lock from before a
	// call's check until its handler returns (for a stream, until the
	// stream ends), so that fenced calls on one resource run one after the
	// other and a call's check and its handler's write are one atomic step
	// with respect to the other calls through this Server: an older
	// holder's call checked first cannot write after a newer holder's. A
	// call waits for the lock at most until its context ends (its
	// deadline, or the client going away), and is then answered with the
	// context's code without being checked. The lock does not cover
	// writes that bypass this Server, nor other server processes, nor a
	// write the handler leaves running after it returns. Set Concurrent
	// only when the handler applies the rule inside its store itself, in
	// the same transaction as its write (FromIncomingContext).
	Concurrent bool

	mu    sync.Mutex
	locks map[string]*resourceLock

	testHookWait   func(resource string) // called when a call waits for a held lock
	testHookGaveUp func(resource string) // called when a call gave up waiting
}

// resourceLock is a lock on one resource; refs counts the calls holding
// or waiting for it, and the entry goes when it reaches 0.
type resourceLock struct {
	ch   chan struct{} // holds one token while locked
	refs int
}

// lock takes resource's lock, waiting at most until ctx ends, and returns
// its unlock.
func (s *Server) lock(ctx context.Context, resource string) (func(), error) {
	s.mu.Lock()
	if s.locks == nil {
		s.locks = make(map[string]*resourceLock)
	}
	l := s.locks[resource]
	if l == nil {
		l = &resourceLock{ch: make(chan struct{}, 1)}
		s.locks[resource] = l
	}
	l.refs++
	waits := l.refs > 1
	s.mu.Unlock()
	if waits && s.testHookWait != nil {
		s.testHookWait(resource)
	}
	release := func() {
		s.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(s.locks, resource)
		}
		s.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		if ctx.Err() == nil {
			return func() { <-l.ch; release() }, nil
		}
		<-l.ch // the lock came free as ctx ended: don't run the call
	case <-ctx.Done():
	}
	release()
	if s.testHookGaveUp != nil {
		s.testHookGaveUp(resource)
	}
	return nil, ctx.Err()
}

// admit applies the rule to a call on resource under ctx; on success it
// returns the unlock to call when the handler is done (a no-op if
// Concurrent).
func (s *Server) admit(ctx context.Context, resource string) (func(), error) {
	token, holder, err := FromIncomingContext(ctx)
	if err != nil {
		return nil, checkStatus(err)
	}
	unlock := func() {}
	if !s.Concurrent {
		if unlock, err = s.lock(ctx, resource); err != nil {
			return nil, checkStatus(err)
		}
	}
	check := s.Checker.Check
	if cc, ok := s.Checker.(ContextChecker); ok {
		check = func(resource string, token fencelock.Token, holder string) error {
			return cc.CheckContext(ctx, resource, token, holder)
		}
	}
	if err := check(resource, token, holder); err != nil {
		unlock()
		return nil, checkStatus(err)
	}
	return unlock, nil
}

func (s *Server) mustBeSet() {
	if s.Checker == nil {
		panic("grpcfence: Server.Checker is nil: set it to a *fencelock.Fence or a kit's checker")
	}
	if s.Resource == nil {
		panic("grpcfence: Server.Resource is nil: set it to a function naming the resource each call writes")
	}
}

// UnaryInterceptor returns the server interceptor for unary calls: for a
// call Resource names a resource for, it reads the token and holder from
// the call's metadata, applies the rule through Checker and only then runs
// the handler. It panics if Checker or Resource is nil.
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor {
	s.mustBeSet()
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resource := s.Resource(info.FullMethod, req)
		if resource == "" {
			return handler(ctx, req)
		}
		unlock, err := s.admit(ctx, resource)
		if err != nil {
			return nil, err
		}
		defer unlock()
		return handler(ctx, req)
	}
}

// StreamInterceptor returns the server interceptor for streams: it names
// the resource from the stream's method (Resource gets a nil request),
// applies the rule to the token and holder of the stream's metadata, and
// only then runs the handler. The whole stream is one fenced write: the
// resource stays locked until the handler returns (unless Concurrent). It panics
// if Checker or Resource is nil.
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor {
	s.mustBeSet()
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		resource := s.Resource(info.FullMethod, nil)
		if resource == "" {
			return handler(srv, ss)
		}
		unlock, err := s.admit(ss.Context(), resource)
		if err != nil {
			return err
		}
		defer unlock()
		return handler(srv, ss)
	}
}
