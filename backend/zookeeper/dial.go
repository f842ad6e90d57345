package zookeeper

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// errCrashed is what the dialer of a crashed backend returns (tests only).
var errCrashed = errors.New("zookeeper: connection cut off (simulated crash)")

// dialer is the zk.Dialer of a connection that Open owns. It reads the
// server's answer to each session handshake, to learn the session timeout
// the server actually negotiated (go-zookeeper does not expose it), bounds
// that handshake (see handshakeTimeout), and lets tests cut the connection
// off the way a dead process would: the TCP connection dies and no
// reconnect follows, so the server expires the session after its timeout
// instead of closing it.
type dialer struct {
	requested time.Duration // the session timeout asked for
	servers   int           // how many servers the connection string names

	timeout atomic.Int64 // negotiated session timeout in ms; 0 until known
	session atomic.Int64 // session id of the last handshake
	passwd  atomic.Pointer[[]byte]

	dropAfter atomic.Int32 // tests: opcode of a request whose reply is to be lost

	r *reach // what the connection knows of its servers' reachability

	mu      sync.Mutex
	refused bool
	conns   map[*sniffConn]struct{}
}

func newDialer(requested time.Duration, servers int) *dialer {
	return &dialer{requested: requested, servers: max(servers, 1), conns: make(map[*sniffConn]struct{}), r: newReach()}
}

// handshakeTimeout is how long a server may take to answer the session
// handshake of a new connection: the session timeout (the negotiated one
// once known) divided by the number of servers, as ZooKeeper's Java client
// (and so Curator) bounds it, so that one round of the server list fits in
// a session timeout; never less than minHandshake, since a session
// timeout asked for below the server's minimum is raised only by the
// server's answer.
//
// go-zookeeper itself waits 10 × its receive timeout (6⅔ session
// timeouts) for the answer, and nothing else happens meanwhile: every
// request made while it reconnects (a waiter's re-read of its queue, a
// release, an acquire) sits in its send queue, neither sent nor failed,
// whatever the caller's context says. A server that accepts connections
// but does not answer them (a process frozen or starting up, a proxy
// whose upstream is gone) thus held every waiter long after the server
// served again; the fault-injection suite (safety/) measured it as a
// progress failure after a server restart or an ensemble's leader kill.
// With the bound, go-zookeeper gives up on the silent server, fails what
// it queued (zk.ErrNoServer once it has tried every server) and dials
// again, so the callers see an error promptly and retry on the server
// that serves.
func (d *dialer) handshakeTimeout() time.Duration {
	st := d.requested
	if ms := d.timeout.Load(); ms > 0 {
		st = time.Duration(ms) * time.Millisecond
	}
	return max(st/time.Duration(d.servers), minHandshake)
}

// minHandshake is the least time a server is given to answer a session
// handshake (see dialer.handshakeTimeout).
const minHandshake = 250 * time.Millisecond

func (d *dialer) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	d.mu.Lock()
	refused := d.refused
	d.mu.Unlock()
	if refused {
		d.r.failed(errCrashed, true)
		return nil, errCrashed
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		d.r.failed(err, true)
		return nil, err
	}
	sc := &sniffConn{Conn: c, d: d, addr: addr, handshakeBy: time.Now().Add(d.handshakeTimeout())}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refused {
		c.Close()
		return nil, errCrashed
	}
	d.conns[sc] = struct{}{}
	return sc, nil
}

// cut kills every connection and refuses new ones (refuse true), or allows
// connecting again (refuse false).
func (d *dialer) cut(refuse bool) {
	d.mu.Lock()
	d.refused = refuse
	var cs []*sniffConn
	if refuse {
		for c := range d.conns {
			cs = append(cs, c)
		}
	}
	d.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// sniffConn passes everything through and parses the first frame the
// server sends: the ConnectResponse {len, protocolVersion int32, timeOut
// int32, sessionId int64, passwd []byte}.
type sniffConn struct {
	net.Conn
	d           *dialer
	addr        string      // the server's
	handshakeBy time.Time   // the server must have answered the handshake by then
	hdr         []byte      // only touched by the connection's single reader
	done        atomic.Bool // the handshake's answer has been read
	dropping    atomic.Bool // tests: deliver nothing more
	closed      atomic.Bool // closed by go-zookeeper or the dialer
	once        sync.Once
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.dropping.Load() {
		c.Close()
		return 0, errCrashed
	}
	if err != nil && !c.closed.Load() {
		// The server closed the connection, or did not answer in
		// time: the cause of the requests this loss fails.
		c.d.r.failed(lostError(c.addr, err), false)
	}
	if !c.done.Load() && n > 0 {
		c.hdr = append(c.hdr, p[:n]...)
		c.parse()
	}
	return n, err
}

// SetDeadline, SetReadDeadline and SetWriteDeadline cap every deadline
// go-zookeeper sets (none included) at handshakeBy until the server has
// answered the handshake (see dialer.handshakeTimeout).
func (c *sniffConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.capped(t)) }

func (c *sniffConn) SetReadDeadline(t time.Time) error { return c.Conn.SetReadDeadline(c.capped(t)) }

func (c *sniffConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.capped(t))
}

func (c *sniffConn) capped(t time.Time) time.Time {
	if c.done.Load() || (!t.IsZero() && t.Before(c.handshakeBy)) {
		return t
	}
	return c.handshakeBy
}

// Write passes p on. In tests, if p is a request with the opcode in
// dropAfter, the request is sent but the connection delivers nothing more:
// its reply is lost while the server may well execute the request.
func (c *sniffConn) Write(p []byte) (int, error) {
	if op := c.d.dropAfter.Load(); op != 0 && len(p) >= 12 && int32(binary.BigEndian.Uint32(p[8:12])) == op {
		if c.d.dropAfter.CompareAndSwap(op, 0) {
			c.dropping.Store(true)
		}
	}
	return c.Conn.Write(p)
}

func (c *sniffConn) parse() {
	h := c.hdr
	if len(h) < 24 {
		return
	}
	frame := int(binary.BigEndian.Uint32(h[0:4]))
	timeout := int32(binary.BigEndian.Uint32(h[8:12]))
	session := int64(binary.BigEndian.Uint64(h[12:20]))
	plen := int(int32(binary.BigEndian.Uint32(h[20:24])))
	if plen < 0 {
		plen = 0
	}
	if len(h) < 24+plen && len(h) < 4+frame {
		return
	}
	c.done.Store(true)
	c.hdr = nil
	if session == 0 || timeout <= 0 {
		return // the server said the session expired
	}
	c.d.timeout.Store(int64(timeout))
	c.d.session.Store(session)
	if len(h) >= 24+plen {
		pw := append([]byte(nil), h[24:24+plen]...)
		c.d.passwd.Store(&pw)
	}
}

func (c *sniffConn) Close() error {
	var err error
	c.once.Do(func() {
		c.closed.Store(true)
		c.d.mu.Lock()
		delete(c.d.conns, c)
		c.d.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}

// crash makes the backend behave as if its process died (tests only): the
// connection is cut and never re-established, nothing is released, and the
// server expires the session after its timeout.
func (b *Backend) crash() {
	if b.d != nil {
		b.d.cut(true)
	}
}

func dial(ctx context.Context, servers []string, sessTO, connTO time.Duration, o Options) (*Backend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d := newDialer(sessTO, len(servers))
	ready := make(chan struct{})
	var readyOnce sync.Once
	var b *Backend
	var bmu sync.Mutex
	cb := func(ev zk.Event) {
		if ev.Type != zk.EventSession {
			bmu.Lock()
			bb := b
			bmu.Unlock()
			if bb != nil && ev.Path != "" {
				bb.nodeEvent(ev.Path)
			}
			return
		}
		if ev.State == zk.StateHasSession {
			readyOnce.Do(func() { close(ready) })
			bmu.Lock()
			bb := b
			bmu.Unlock()
			if bb != nil {
				bb.reconnected()
			}
		}
		o.Logger.Debug("zookeeper: session state", "state", ev.State.String(), "server", ev.Server)
	}
	conn, _, err := zk.Connect(servers, sessTO, zk.WithDialer(d.dial), zk.WithHostProvider(hosts{zk.NewDNSHostProvider(), d.r}),
		zk.WithLogger(zkLogger{o.Logger}), zk.WithLogInfo(false), zk.WithEventCallback(cb))
	if err != nil {
		return nil, fmt.Errorf("zookeeper: connect: %w", err)
	}
	t := time.NewTimer(connTO)
	defer t.Stop()
	_, _, down := d.r.state()
	// withCause adds the last failure to connect, if any, to err.
	withCause := func(err error) error {
		if cause, _, _ := d.r.state(); cause != nil {
			return fmt.Errorf("%w: %w", err, cause)
		}
		return err
	}
	all := strings.Join(servers, ",")
	select {
	case <-ready:
	case <-down:
		// Every server refused (or failed to answer) the connection:
		// no need to wait for connect_timeout to say so.
		conn.Close()
		cause, _, _ := d.r.state()
		return nil, fmt.Errorf("zookeeper: cannot connect to %s: %w", all, &unreachableError{zk.ErrNoServer, cause})
	case <-ctx.Done():
		conn.Close()
		return nil, withCause(fmt.Errorf("zookeeper: no session with %s: %w", all, ctx.Err()))
	case <-t.C:
		conn.Close()
		return nil, withCause(fmt.Errorf("zookeeper: no session with %s within connect_timeout %v", all, connTO))
	}
	bb := newBackend(conn, o)
	bb.owned, bb.d, bb.reqTO, bb.evented = true, d, sessTO, true
	bb.conn.r = d.r
	bmu.Lock()
	b = bb
	bmu.Unlock()
	if err := bb.ensurePath(ctx, bb.root); err != nil {
		bb.Close()
		return nil, fmt.Errorf("zookeeper: creating root %s: %w", bb.root, err)
	}
	return bb, nil
}

type zkLogger struct{ l *slog.Logger }

func (z zkLogger) Printf(format string, args ...any) {
	z.l.Debug("zookeeper: go-zookeeper: " + fmt.Sprintf(format, args...))
}
