package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// A request of go-zookeeper made while its connection is down waits in its
// send queue, whatever the caller's context says, until the connection is
// back or a whole round of the server list has failed; then it fails with
// zk.ErrNoServer ("could not connect to a server"), which does not say
// why. Between rounds go-zookeeper pauses for a second. So an unreachable
// server made every request wait up to a round and a pause, and reported
// no cause: a refused connection surfaced after 5-10 s as "no session" or
// "could not connect".
//
// On a connection Open made, the backend fails fast instead: once a round
// has failed to dial every server (and until a connection has a session
// again), a request fails at once with zk.ErrNoServer, as go-zookeeper's
// own would a moment later; and every error of a request that the
// connection's loss ended (zk.ErrNoServer, zk.ErrConnectionClosed) names
// the cause: the last dial's error ("connect: connection refused") or how
// the connection was lost.

// reach is what a connection Open made knows of its servers' reachability.
type reach struct {
	mu     sync.Mutex
	cause  error         // the last failure to dial or keep a connection; nil once a session is back
	dialed bool          // a dial failed since the last connection with a session
	down   bool          // a whole round failed to dial since the last connection with a session
	round  chan struct{} // closed when down is set; replaced when a session is back
}

func newReach() *reach { return &reach{round: make(chan struct{})} }

// failed records a failure to dial or keep a connection.
func (r *reach) failed(err error, dial bool) {
	r.mu.Lock()
	r.cause = err
	r.dialed = r.dialed || dial
	r.mu.Unlock()
}

// roundStart is go-zookeeper starting another round of its server list
// (after the pause): the round that ended failed.
func (r *reach) roundStart() {
	r.mu.Lock()
	if r.dialed && !r.down {
		r.down = true
		close(r.round)
	}
	r.mu.Unlock()
}

// connected records a connection with a session.
func (r *reach) connected() {
	r.mu.Lock()
	r.cause, r.dialed = nil, false
	if r.down {
		r.down = false
		r.round = make(chan struct{})
	}
	r.mu.Unlock()
}

// state returns the last cause, whether the servers are down (a whole
// round failed to dial), and a channel closed once they are.
func (r *reach) state() (cause error, down bool, round <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cause, r.down, r.round
}

// unreachableError is an error of go-zookeeper that the loss of the
// connection caused (zk.ErrNoServer, zk.ErrConnectionClosed) with that
// cause. errors.Is matches both.
type unreachableError struct {
	err   error
	cause error
}

func (e *unreachableError) Error() string   { return e.err.Error() + ": " + e.cause.Error() }
func (e *unreachableError) Unwrap() []error { return []error{e.err, e.cause} }

// hosts is go-zookeeper's default host provider, reporting the rounds of
// the server list and the connections that got a session to a reach.
type hosts struct {
	*zk.DNSHostProvider
	r *reach
}

// Next implements zk.HostProvider.
func (h hosts) Next() (string, bool) {
	s, retryStart := h.DNSHostProvider.Next()
	if retryStart {
		h.r.roundStart()
	}
	return s, retryStart
}

// Connected implements zk.HostProvider.
func (h hosts) Connected() {
	h.DNSHostProvider.Connected()
	h.r.connected()
}

// conn is the backend's ZooKeeper connection. Every request takes the
// caller's context and returns when it ends (see call); on a connection
// Open made (r not nil) its requests also fail fast while the servers are
// down, and its errors name the cause of a lost connection (see reach).
type conn struct {
	*zk.Conn
	r *reach
}

// fast returns the error of a request made while the servers are down, or
// nil.
func (c conn) fast() error {
	if c.r == nil {
		return nil
	}
	if cause, down, _ := c.r.state(); down && cause != nil {
		return &unreachableError{zk.ErrNoServer, cause}
	}
	return nil
}

// why adds the cause to err if the connection's loss caused it.
func (c conn) why(err error) error {
	if err == nil || c.r == nil || !(errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrConnectionClosed)) {
		return err
	}
	var ue *unreachableError
	if errors.As(err, &ue) {
		return err
	}
	cause, _, _ := c.r.state()
	if cause == nil {
		return err
	}
	return &unreachableError{err, cause}
}

// lostError is how a connection was lost: the error its read returned.
func lostError(server string, err error) error {
	return fmt.Errorf("connection to %s lost: %w", server, err)
}

// ErrNoAnswer is the cause joined to the context's error of a request that
// the ZooKeeper server had not answered when the caller's context ended:
// a server that stopped answering (a frozen process, a network that drops
// packets), a connection being re-established, or a deadline too short
// for the server's latency. errors.Is(err, ErrNoAnswer) and
// errors.Is(err, context.DeadlineExceeded) both hold for such an error.
// Check that the servers in the URL are up and reachable from this host,
// or give the call a longer deadline.
var ErrNoAnswer = errors.New("zookeeper: no answer from the server")

// noAnswerError is ErrNoAnswer for one request: what it was, the server
// and the connection's state, and the last failure of the connection, if
// any.
type noAnswerError struct {
	op, path string
	server   string
	state    zk.State
	sent     bool  // false: the context had ended before the request
	cause    error // the connection's last failure (see reach), or nil
}

func (e *noAnswerError) Error() string {
	var sb strings.Builder
	sb.WriteString(ErrNoAnswer.Error())
	if e.server != "" {
		sb.WriteString(" " + e.server)
	}
	if e.sent {
		fmt.Fprintf(&sb, " to %s %s before the context ended", e.op, e.path)
	} else {
		fmt.Fprintf(&sb, " in time: %s %s not sent, the context had ended", e.op, e.path)
	}
	fmt.Fprintf(&sb, " (connection %s)", strings.TrimPrefix(e.state.String(), "State"))
	if e.cause != nil {
		sb.WriteString(": " + e.cause.Error())
	}
	return sb.String()
}

func (e *noAnswerError) Unwrap() []error {
	if e.cause != nil {
		return []error{ErrNoAnswer, e.cause}
	}
	return []error{ErrNoAnswer}
}

// noAnswer is the error of a request abandoned (sent true) or not sent
// because ctx ended: a *noAnswerError joined with ctx's error (errors.Is
// matches ErrNoAnswer, ctx's error and the connection's last failure).
func (c conn) noAnswer(ctx context.Context, op, path string, sent bool) error {
	e := &noAnswerError{op: op, path: path, sent: sent, server: c.Server(), state: c.State()}
	if c.r != nil {
		e.cause, _, _ = c.r.state()
	}
	return fmt.Errorf("%w: %w", e, ctx.Err())
}

// call runs f, one request of go-zookeeper, and returns its result, or,
// if ctx ends first, ctx's error joined with a *noAnswerError. go-zookeeper
// v1.0.4 takes no context: a request waits for its reply, or, while the
// connection is down, in go-zookeeper's send queue, for up to two thirds
// of a session timeout (more while it reconnects), whatever the caller's
// deadline. So f runs on a goroutine of its own, which a caller whose ctx
// ended leaves behind: the request carries on and may still be executed
// by the server, as when its reply is lost. The callers treat both alike
// (an error that is not definiteZK: the outcome is unknown). late, if not
// nil, gets the result of an abandoned request when it comes (enqueue
// uses it to account for a create that landed after all). A request is
// not sent if ctx has already ended.
//
// A write (write true) whose ctx ends is given answerGrace more for its
// answer before it is abandoned: a server that answers at all answers
// within it, and a definite outcome is worth that much (the driver
// contract asks for one where the store allows): a cancelled acquire,
// say, then leaves no contender znode behind for a clean-up to find.
func call[T any](ctx context.Context, c conn, op, path string, write bool, f func() (T, error), late func(T, error)) (T, error) {
	var zero T
	if err := c.fast(); err != nil {
		return zero, err
	}
	if ctx.Err() != nil {
		return zero, c.noAnswer(ctx, op, path, false)
	}
	if ctx.Done() == nil { // never ends: no need for a goroutine
		v, err := f()
		return v, c.why(err)
	}
	var (
		mu        sync.Mutex
		abandoned bool
		v         T
		err       error
	)
	done := make(chan struct{})
	go func() {
		rv, rerr := f()
		rerr = c.why(rerr)
		mu.Lock()
		if abandoned {
			mu.Unlock()
			if late != nil {
				late(rv, rerr)
			}
			return
		}
		v, err = rv, rerr
		mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
		return v, err
	case <-ctx.Done():
	}
	if write {
		t := time.NewTimer(answerGrace)
		select {
		case <-done:
		case <-t.C:
		}
		t.Stop()
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case <-done: // answered as ctx ended: take the answer
		return v, err
	default:
	}
	abandoned = true
	return zero, c.noAnswer(ctx, op, path, true)
}

// nothing is the value of a request that returns only an error.
type nothing struct{}

// stat is a request's znode Stat with its data, children or watch.
type stat[T any] struct {
	v  T
	st *zk.Stat
	ch <-chan zk.Event
}

// Children is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) Children(ctx context.Context, path string) ([]string, *zk.Stat, error) {
	r, err := call(ctx, c, "list children of", path, false, func() (stat[[]string], error) {
		names, st, err := c.Conn.Children(path)
		return stat[[]string]{v: names, st: st}, err
	}, nil)
	return r.v, r.st, err
}

// ChildrenW is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) ChildrenW(ctx context.Context, path string) ([]string, *zk.Stat, <-chan zk.Event, error) {
	r, err := call(ctx, c, "watch children of", path, false, func() (stat[[]string], error) {
		names, st, ch, err := c.Conn.ChildrenW(path)
		return stat[[]string]{v: names, st: st, ch: ch}, err
	}, nil)
	return r.v, r.st, r.ch, err
}

// Get is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) Get(ctx context.Context, path string) ([]byte, *zk.Stat, error) {
	r, err := call(ctx, c, "get", path, false, func() (stat[[]byte], error) {
		data, st, err := c.Conn.Get(path)
		return stat[[]byte]{v: data, st: st}, err
	}, nil)
	return r.v, r.st, err
}

// GetW is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) GetW(ctx context.Context, path string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	r, err := call(ctx, c, "watch", path, false, func() (stat[[]byte], error) {
		data, st, ch, err := c.Conn.GetW(path)
		return stat[[]byte]{v: data, st: st, ch: ch}, err
	}, nil)
	return r.v, r.st, r.ch, err
}

// Set is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) Set(ctx context.Context, path string, data []byte, version int32) (*zk.Stat, error) {
	return call(ctx, c, "set", path, true, func() (*zk.Stat, error) { return c.Conn.Set(path, data, version) }, nil)
}

// Create is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) Create(ctx context.Context, path string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	return call(ctx, c, "create", path, true, func() (string, error) { return c.Conn.Create(path, data, flags, acl) }, nil)
}

// CreateContainer is zk.Conn's, bounded by ctx (see call) and failing fast
// (see reach).
func (c conn) CreateContainer(ctx context.Context, path string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	return call(ctx, c, "create", path, true, func() (string, error) { return c.Conn.CreateContainer(path, data, flags, acl) }, nil)
}

// Delete is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) Delete(ctx context.Context, path string, version int32) error {
	_, err := call(ctx, c, "delete", path, true, func() (nothing, error) { return nothing{}, c.Conn.Delete(path, version) }, nil)
	return err
}

// Exists is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) Exists(ctx context.Context, path string) (bool, *zk.Stat, error) {
	r, err := call(ctx, c, "check", path, false, func() (stat[bool], error) {
		ok, st, err := c.Conn.Exists(path)
		return stat[bool]{v: ok, st: st}, err
	}, nil)
	return r.v, r.st, err
}

// ExistsW is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) ExistsW(ctx context.Context, path string) (bool, *zk.Stat, <-chan zk.Event, error) {
	r, err := call(ctx, c, "watch", path, false, func() (stat[bool], error) {
		ok, st, ch, err := c.Conn.ExistsW(path)
		return stat[bool]{v: ok, st: st, ch: ch}, err
	}, nil)
	return r.v, r.st, r.ch, err
}

// SetACL is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) SetACL(ctx context.Context, path string, acl []zk.ACL, version int32) (*zk.Stat, error) {
	return call(ctx, c, "set the ACL of", path, true, func() (*zk.Stat, error) { return c.Conn.SetACL(path, acl, version) }, nil)
}

// Sync is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach).
func (c conn) Sync(ctx context.Context, path string) (string, error) {
	return call(ctx, c, "sync", path, false, func() (string, error) { return c.Conn.Sync(path) }, nil)
}

// Multi is zk.Conn's, bounded by ctx (see call) and failing fast (see
// reach). late, if not nil, gets the result of a multi abandoned because
// ctx ended (see call).
func (c conn) Multi(ctx context.Context, late func([]zk.MultiResponse, error), ops ...any) ([]zk.MultiResponse, error) {
	return call(ctx, c, "multi on", pathOf(ops), true, func() ([]zk.MultiResponse, error) { return c.Conn.Multi(ops...) }, late)
}

// pathOf names a multi's first operation's path, for errors.
func pathOf(ops []any) string {
	if len(ops) == 0 {
		return ""
	}
	switch op := ops[0].(type) {
	case *zk.CreateRequest:
		return op.Path
	case *zk.SetDataRequest:
		return op.Path
	case *zk.DeleteRequest:
		return op.Path
	case *zk.CheckVersionRequest:
		return op.Path
	}
	return ""
}
