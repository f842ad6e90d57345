package zookeeper

import (
	"errors"
	"fmt"
	"sync"

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

// conn is the backend's ZooKeeper connection. On a connection Open made
// (r not nil) its requests fail fast while the servers are down, and its
// errors name the cause of a lost connection (see reach).
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

// Children is zk.Conn's, failing fast (see reach).
func (c conn) Children(path string) ([]string, *zk.Stat, error) {
	if err := c.fast(); err != nil {
		return nil, nil, err
	}
	names, st, err := c.Conn.Children(path)
	return names, st, c.why(err)
}

// ChildrenW is zk.Conn's, failing fast (see reach).
func (c conn) ChildrenW(path string) ([]string, *zk.Stat, <-chan zk.Event, error) {
	if err := c.fast(); err != nil {
		return nil, nil, nil, err
	}
	names, st, ch, err := c.Conn.ChildrenW(path)
	return names, st, ch, c.why(err)
}

// Get is zk.Conn's, failing fast (see reach).
func (c conn) Get(path string) ([]byte, *zk.Stat, error) {
	if err := c.fast(); err != nil {
		return nil, nil, err
	}
	data, st, err := c.Conn.Get(path)
	return data, st, c.why(err)
}

// GetW is zk.Conn's, failing fast (see reach).
func (c conn) GetW(path string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	if err := c.fast(); err != nil {
		return nil, nil, nil, err
	}
	data, st, ch, err := c.Conn.GetW(path)
	return data, st, ch, c.why(err)
}

// Set is zk.Conn's, failing fast (see reach).
func (c conn) Set(path string, data []byte, version int32) (*zk.Stat, error) {
	if err := c.fast(); err != nil {
		return nil, err
	}
	st, err := c.Conn.Set(path, data, version)
	return st, c.why(err)
}

// Create is zk.Conn's, failing fast (see reach).
func (c conn) Create(path string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	if err := c.fast(); err != nil {
		return "", err
	}
	p, err := c.Conn.Create(path, data, flags, acl)
	return p, c.why(err)
}

// CreateContainer is zk.Conn's, failing fast (see reach).
func (c conn) CreateContainer(path string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	if err := c.fast(); err != nil {
		return "", err
	}
	p, err := c.Conn.CreateContainer(path, data, flags, acl)
	return p, c.why(err)
}

// Delete is zk.Conn's, failing fast (see reach).
func (c conn) Delete(path string, version int32) error {
	if err := c.fast(); err != nil {
		return err
	}
	return c.why(c.Conn.Delete(path, version))
}

// Exists is zk.Conn's, failing fast (see reach).
func (c conn) Exists(path string) (bool, *zk.Stat, error) {
	if err := c.fast(); err != nil {
		return false, nil, err
	}
	ok, st, err := c.Conn.Exists(path)
	return ok, st, c.why(err)
}

// ExistsW is zk.Conn's, failing fast (see reach).
func (c conn) ExistsW(path string) (bool, *zk.Stat, <-chan zk.Event, error) {
	if err := c.fast(); err != nil {
		return false, nil, nil, err
	}
	ok, st, ch, err := c.Conn.ExistsW(path)
	return ok, st, ch, c.why(err)
}

// SetACL is zk.Conn's, failing fast (see reach).
func (c conn) SetACL(path string, acl []zk.ACL, version int32) (*zk.Stat, error) {
	if err := c.fast(); err != nil {
		return nil, err
	}
	st, err := c.Conn.SetACL(path, acl, version)
	return st, c.why(err)
}

// Sync is zk.Conn's, failing fast (see reach).
func (c conn) Sync(path string) (string, error) {
	if err := c.fast(); err != nil {
		return "", err
	}
	p, err := c.Conn.Sync(path)
	return p, c.why(err)
}

// Multi is zk.Conn's, failing fast (see reach).
func (c conn) Multi(ops ...any) ([]zk.MultiResponse, error) {
	if err := c.fast(); err != nil {
		return nil, err
	}
	rs, err := c.Conn.Multi(ops...)
	return rs, c.why(err)
}
