// Package fence is the fenced resource of the safety harness: a tiny
// storage service, served over a unix socket, that accepts a write only
// from the newest lock holder, the way a real fenced resource (a database
// row with a token column, an object store with conditional writes) would.
//
// Per key the server keeps the highest token it has accepted and an
// append-only log of every write attempt, accepted or not. Each attempt is
// stamped on receipt with the system-wide monotonic clock (safety/mono) and
// logged as a history.Event of kind history.Write, with Proc, Lease, Token,
// Accepted, Reason and Fencing filled in.
//
// The rule is docs/fencing.md's, decided by fencelock.Fence itself. With
// fencing on: accept iff token > highest accepted token of the key, or
// token == highest and the write comes from the same lease that wrote it
// (a holder may write many times with one token). With
// fencing off (a negative control) every write is accepted and logged with
// the reason fencing would have given, so the checker can still see which
// writes were stale.
//
// A read-write lock's resource (a request with Access "read" or "write",
// Client.Access) is judged by recipe.RWFence's rule instead, kept per
// key apart from the lock rule's state: a read is accepted iff its token
// is at least the highest token a write presented (no writer has written
// since the reader's grant entered); a write iff its token is greater
// than every token any read or write presented, or equal to the highest
// from the same lease when that lease wrote it. The logged event carries
// the request's Access.
//
// # Protocol
//
// One JSON object per line in each direction. The client sends
//
//	{"key":"k","lease":"c1-3","proc":"c1","token":7}
//
// and the server answers each request, in order, with
//
//	{"t":123456789,"accepted":true,"reason":"newer"}
//
// or {"err":"..."} for a malformed request. Any number of connections may
// be open at once; the server decides writes one at a time, in the order
// of their receipt time.
package fence

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/mono"
)

// Reasons the server gives for its decision (Decision.Reason and
// history.Event.Reason). With fencing off, a write is accepted whatever
// its reason; the reason then says what fencing would have decided.
const (
	// ReasonNewer: token is higher than every token accepted for the key.
	ReasonNewer = "newer"
	// ReasonSameLease: token equals the highest accepted token and the
	// write comes from the lease that wrote it first.
	ReasonSameLease = "same-lease"
	// ReasonStale: token is lower than the highest accepted token.
	ReasonStale = "stale"
	// ReasonEqualOtherLease: token equals the highest accepted token but
	// the write comes from another lease (a token issued twice).
	ReasonEqualOtherLease = "equal-token-other-lease"
	// ReasonZeroToken: token 0 is never a valid fencing token.
	ReasonZeroToken = "zero-token"
	// ReasonReadCurrent: a read whose token is at least the highest
	// token a write presented (read-write lock resources only; a read
	// below it is ReasonStale).
	ReasonReadCurrent = "read-current"
)

// Access modes of a read-write lock's resource (Client.Access).
const (
	AccessRead  = "read"
	AccessWrite = "write"
)

// ErrClosed is returned by a Client or Server used after Close, and by a
// Client whose connection broke (for example when a Write's ctx ended
// while it waited for the answer: the answer may still be on its way, so
// the connection cannot be reused).
var ErrClosed = errors.New("fence: closed")

// Decision is the server's answer to one write attempt.
type Decision struct {
	// T is the monotonic time (mono.Now) at which the server received the
	// write; it is the T of the logged history.Write event.
	T int64 `json:"t"`
	// Accepted reports whether the write was applied.
	Accepted bool `json:"accepted"`
	// Reason is one of the Reason constants.
	Reason string `json:"reason"`
}

// request is one write attempt on the wire.
type request struct {
	Key   string `json:"key"`
	Lease string `json:"lease"`
	Proc  string `json:"proc"`
	Token uint64 `json:"token"`
	// Access is "" for a lock's write, AccessRead or AccessWrite for a
	// read-write lock's resource.
	Access string `json:"access,omitempty"`
}

// reply is the server's answer on the wire.
type reply struct {
	Decision
	Err string `json:"err,omitempty"`
}

// keyState is what the server remembers per key: the highest accepted
// token and the lease that first wrote with it.
type keyState struct {
	token uint64
	lease string
}

// rwState is what the server remembers per key of a read-write lock's
// resource (recipe.RWFence's marks): the highest token any access
// presented, the highest a write presented and the lease that wrote it.
type rwState struct {
	top, write uint64
	writer     string
}

// maxSocketPath is the longest unix socket path Linux takes
// (sizeof(sun_path) − 1).
const maxSocketPath = 107

// Server is a fenced resource listening on a unix socket. Its methods are
// safe for concurrent use.
type Server struct {
	ln   net.Listener
	path string
	wg   sync.WaitGroup // accept loop and connection goroutines

	mu      sync.Mutex // guards the fields below
	fencing bool
	keys    map[string]keyState
	rw      map[string]rwState
	log     history.History
	conns   map[net.Conn]struct{}
	closed  bool
	// store, if set, decides lock writes (see Store); storeFaults
	// records where it disagreed with the rule or failed.
	store       Store
	storeFaults []string
}

// Listen starts a server on a new unix socket in dir (which must exist,
// e.g. t.TempDir()), with fencing on or off. Close stops it.
//
// The socket's path must fit the kernel's limit of 107 bytes, so dir
// should be short; t.TempDir() and os.MkdirTemp("", …) are.
func Listen(dir string, fencing bool) (*Server, error) {
	path := filepath.Join(dir, "fence.sock")
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("fence: socket path %q is longer than %d bytes; use a shorter dir", path, maxSocketPath)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("fence: listen: %w", err)
	}
	s := &Server{
		ln:      ln,
		path:    path,
		fencing: fencing,
		keys:    make(map[string]keyState),
		conns:   make(map[net.Conn]struct{}),
	}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr returns the socket's path, to be passed to Dial (possibly in
// another process).
func (s *Server) Addr() string { return s.path }

// SetFencing turns fencing on or off for writes received from now on.
func (s *Server) SetFencing(on bool) {
	s.mu.Lock()
	s.fencing = on
	s.mu.Unlock()
}

// Log returns a copy of every write attempt received so far, in order of
// receipt (and so of T). The log is append-only: a later call returns
// the earlier events unchanged, followed by the new ones.
func (s *Server) Log() history.History {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(history.History(nil), s.log...)
}

// Close stops listening, closes every connection and waits for the
// server's goroutines to end. The log stays readable. Close is
// idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("fence: close: %w", err)
	}
	os.Remove(s.path) // Close of a unix listener normally removes it already.
	return nil
}

// accept runs until the listener is closed.
func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed (Accept on a unix socket fails for no other reason we could recover from)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

// serve answers the requests of one connection until it closes or sends
// something that is not a request.
func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 4096), 1<<20)
	w := bufio.NewWriter(c)
	enc := json.NewEncoder(w)
	for sc.Scan() {
		var req request
		var rep reply
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			rep.Err = "malformed request: " + err.Error()
		} else if req.Key == "" || req.Lease == "" {
			rep.Err = "malformed request: key and lease are required"
		} else if req.Access != "" && req.Access != AccessRead && req.Access != AccessWrite {
			rep.Err = "malformed request: unknown access"
		} else {
			rep.Decision = s.decide(req)
		}
		if enc.Encode(rep) != nil || w.Flush() != nil || rep.Err != "" {
			return
		}
	}
}

// decide stamps, judges and logs one write attempt.
func (s *Server) decide(req request) Decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := mono.Now() // under mu, so the log is in T order
	if req.Access != "" {
		return s.decideRW(t, req)
	}
	st := s.keys[req.Key]
	ok, reason := judge(st, req)
	accepted := ok || !s.fencing
	if s.store != nil && s.fencing {
		accepted = s.askStore(req, ok, reason)
	}
	if accepted && req.Token > st.token {
		s.keys[req.Key] = keyState{token: req.Token, lease: req.Lease}
	}
	s.log = append(s.log, history.Event{
		T:        t,
		Proc:     req.Proc,
		Kind:     history.Write,
		Key:      req.Key,
		Lease:    req.Lease,
		Token:    req.Token,
		Accepted: accepted,
		Reason:   reason,
		Fencing:  s.fencing,
	})
	return Decision{T: t, Accepted: accepted, Reason: reason}
}

// judge returns fencelock.Fence's verdict on req, given the key's mark
// st, and the Reason for it. It asks a Fence that holds only st, so the
// server's own mark changes with what it accepted (every write with
// fencing off; the store's answers with a Store), not with the rule's
// verdict.
func judge(st keyState, req request) (ok bool, reason string) {
	var rule fencelock.Fence
	if st.token > 0 {
		// A token above 0 on an empty Fence: always accepted.
		_ = rule.Check(req.Key, fencelock.Token(st.token), st.lease)
	}
	err := rule.Check(req.Key, fencelock.Token(req.Token), req.Lease)
	var stale *fencelock.StaleTokenError
	switch {
	case err == nil && req.Token > st.token:
		return true, ReasonNewer
	case err == nil:
		return true, ReasonSameLease
	case !errors.As(err, &stale):
		panic(fmt.Sprintf("fence: fencelock.Fence.Check returned %v, not a *StaleTokenError", err))
	case req.Token == 0:
		return false, ReasonZeroToken
	case fencelock.Token(req.Token) < stale.Highest:
		return false, ReasonStale
	default:
		return false, ReasonEqualOtherLease
	}
}

// decideRW judges and logs an access to a read-write lock's resource
// (see the package doc); s.mu is held.
func (s *Server) decideRW(t int64, req request) Decision {
	st := s.rw[req.Key]
	var reason string
	ok := false
	switch {
	case req.Token == 0:
		reason = ReasonZeroToken
	case req.Access == AccessRead && req.Token >= st.write:
		reason, ok = ReasonReadCurrent, true
	case req.Access == AccessRead:
		reason = ReasonStale
	case req.Token > st.top:
		reason, ok = ReasonNewer, true
	case req.Token == st.top && req.Token == st.write && req.Lease == st.writer:
		reason, ok = ReasonSameLease, true
	case req.Token == st.top:
		reason = ReasonEqualOtherLease
	default:
		reason = ReasonStale
	}
	accepted := ok || !s.fencing
	if accepted {
		if req.Access == AccessWrite && req.Token >= st.top {
			st.write, st.writer = req.Token, req.Lease
		}
		st.top = max(st.top, req.Token)
		if s.rw == nil {
			s.rw = make(map[string]rwState)
		}
		s.rw[req.Key] = st
	}
	s.log = append(s.log, history.Event{
		T:        t,
		Proc:     req.Proc,
		Kind:     history.Write,
		Key:      req.Key,
		Lease:    req.Lease,
		Token:    req.Token,
		Accepted: accepted,
		Reason:   reason,
		Fencing:  s.fencing,
		Access:   req.Access,
	})
	return Decision{T: t, Accepted: accepted, Reason: reason}
}

// Client is one connection to a Server. It is safe for concurrent use;
// concurrent writes are sent one at a time.
type Client struct {
	mu     sync.Mutex // serialises requests; guards broken
	conn   net.Conn
	r      *bufio.Reader
	broken error
}

// Dial connects to the server listening at addr (Server.Addr).
func Dial(ctx context.Context, addr string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		return nil, fmt.Errorf("fence: dial: %w", err)
	}
	return &Client{conn: c, r: bufio.NewReader(c)}, nil
}

// Write asks the server to apply a write to key on behalf of lease
// (held by contender proc) with fencing token token, and returns the
// server's decision. A rejected write is not an error. If ctx ends before
// the answer arrives, Write returns ctx's error and the Client is broken
// (further calls return ErrClosed): the server may or may not have
// received the write, as with any real resource.
func (c *Client) Write(ctx context.Context, key, lease, proc string, token uint64) (Decision, error) {
	return c.Access(ctx, key, lease, proc, token, "")
}

// Access is Write for a read-write lock's resource: access is AccessRead
// or AccessWrite, and the server judges it by the read-write rule (see
// the package doc). With access "" it is Write.
func (c *Client) Access(ctx context.Context, key, lease, proc string, token uint64, access string) (Decision, error) {
	if access != "" && access != AccessRead && access != AccessWrite {
		return Decision{}, fmt.Errorf("fence: unknown access %q", access)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return Decision{}, c.broken
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	line, err := json.Marshal(request{Key: key, Lease: lease, Proc: proc, Token: token, Access: access})
	if err != nil {
		return Decision{}, fmt.Errorf("fence: write: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	rep, err := c.roundTrip(append(line, '\n'))
	if !stop() {
		// ctx ended while the request was in flight: whatever happened
		// on the connection, its state is unknown.
		c.fail(fmt.Errorf("%w: a write's context ended in flight", ErrClosed))
		return Decision{}, ctx.Err()
	}
	if errors.Is(err, net.ErrClosed) {
		c.fail(ErrClosed)
		return Decision{}, ErrClosed
	}
	if err != nil {
		c.fail(fmt.Errorf("%w: %v", ErrClosed, err))
		return Decision{}, fmt.Errorf("fence: write: %w", err)
	}
	if rep.Err != "" {
		c.fail(fmt.Errorf("%w: server rejected a request", ErrClosed))
		return Decision{}, fmt.Errorf("fence: server: %s", rep.Err)
	}
	return rep.Decision, nil
}

func (c *Client) roundTrip(line []byte) (reply, error) {
	var rep reply
	if _, err := c.conn.Write(line); err != nil {
		return rep, err
	}
	b, err := c.r.ReadBytes('\n')
	if err != nil {
		return rep, err
	}
	err = json.Unmarshal(b, &rep)
	return rep, err
}

// fail marks the client broken and closes its connection; c.mu is held.
func (c *Client) fail(err error) {
	c.broken = err
	c.conn.Close()
}

// Close closes the connection; a Write in flight returns an error at
// once, and later Writes return ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close() // not under mu: it interrupts a Write in flight
	c.mu.Lock()
	if c.broken == nil {
		c.broken = ErrClosed
	}
	c.mu.Unlock()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("fence: close: %w", err)
	}
	return nil
}
