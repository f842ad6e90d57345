// Package faultproxy is a small in-process TCP proxy that injects network
// faults between one lock client and its store: a blackhole, added
// latency, connection resets, and a reply dropped after its request was
// forwarded (which makes the client's operation ambiguous: it fails, but
// the store acted on it).
//
// A Proxy listens on 127.0.0.1 on a free port (or, with ListenAt, on a
// given address: a store that comes back on its port) and forwards every
// accepted connection to one target address. Its mode applies to every connection,
// existing and new, from the moment it is set:
//
//   - Pass forwards bytes both ways, after the configured latency (if any).
//   - Blackhole forwards nothing in either direction: bytes stay where they
//     are (in the sockets' buffers, as in a network partition TCP has not
//     given up on yet) and flow again, late, when the mode returns to Pass.
//     New connections are accepted and held the same way. Held tells
//     when a blackhole holds something.
//   - Reset aborts every connection with a TCP RST (to the client and to
//     the target) and resets new ones as soon as they are accepted.
//
// Latency delays every chunk of bytes read, in each direction, by the
// given duration before it is written on.
//
// DropNextReply arms a one-shot fault: the next chunk a client sends (on
// any connection) is forwarded to the target; the next chunk the target
// sends back on that connection is discarded and the connection is reset.
//
// The proxy never parses the protocol it carries.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what a Proxy does with the bytes it carries.
type Mode int

// The modes of a Proxy.
const (
	// Pass forwards bytes (after the configured latency).
	Pass Mode = iota
	// Blackhole holds every byte in both directions until the mode changes.
	Blackhole
	// Reset aborts every connection, existing and new, with a TCP RST.
	Reset
)

// String returns the mode's name as ParseMode accepts it.
func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Reset:
		return "reset"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode returns the Mode named s ("pass", "blackhole", "reset").
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{Pass, Blackhole, Reset} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("faultproxy: unknown mode %q", s)
}

// ErrClosed is returned by Close when the proxy was already closed.
var ErrClosed = errors.New("faultproxy: closed")

// dialTimeout bounds the connection to the target.
const dialTimeout = 5 * time.Second

// Proxy forwards TCP connections from its own address to a target and
// injects faults. Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener

	mu      sync.Mutex
	mode    Mode
	latency time.Duration
	changed chan struct{} // closed and replaced whenever mode or latency change
	held    chan struct{} // closed once the blackhole in force (or next) holds something
	hasHeld bool          // held is closed
	conns   map[*conn]struct{}
	drop    *Drop // armed, not yet claimed
	closed  bool
	stats   Stats

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Stats counts what a Proxy did.
type Stats struct {
	// Accepted is the number of client connections accepted.
	Accepted int
	// Resets is the number of connections aborted with a RST (by Reset
	// mode or a dropped reply).
	Resets int
	// DroppedReplies is the number of replies discarded by DropNextReply.
	DroppedReplies int
}

// Listen starts a proxy on 127.0.0.1 (a free port) that forwards to target
// (host:port), in mode Pass with no latency.
func Listen(target string) (*Proxy, error) {
	return ListenAt("127.0.0.1:0", target)
}

// ListenAt is Listen on the address addr (host:port), for instance the
// address of a proxy closed earlier: a store that went away and comes
// back on the same port. It fails if addr is in use; close the proxy
// that listened there first.
func ListenAt(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen on %s: %w", addr, err)
	}
	p := &Proxy{
		target:  target,
		ln:      ln,
		changed: make(chan struct{}),
		held:    make(chan struct{}),
		conns:   make(map[*conn]struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the proxy's listening address (127.0.0.1:PORT).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// SetMode switches every connection, existing and new, to mode m. Setting
// Reset aborts the open connections before SetMode returns.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	if m == Blackhole && p.mode != Blackhole && p.hasHeld {
		// A new blackhole: Held waits for this one to hold something.
		p.held, p.hasHeld = make(chan struct{}), false
	}
	p.mode = m
	p.notifyLocked()
	var victims []*conn
	if m == Reset {
		for c := range p.conns {
			victims = append(victims, c)
		}
	}
	p.mu.Unlock()
	for _, c := range victims {
		c.reset()
	}
}

// SetLatency makes every chunk read from now on wait d before it is
// written on (0 for none).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = max(d, 0)
	p.notifyLocked()
	p.mu.Unlock()
}

// Held returns a channel closed once the blackhole in force (or, in
// another mode, the next one) holds something a peer sent: a chunk of
// bytes read from either side, or a new connection. Select on it to know
// that a request is stuck in the proxy.
func (p *Proxy) Held() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// holding records that the blackhole holds something.
func (p *Proxy) holding() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == Blackhole && !p.hasHeld {
		p.hasHeld = true
		close(p.held)
	}
}

func (p *Proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Drop is an armed drop-the-reply fault (see DropNextReply).
type Drop struct {
	p       *Proxy
	claimed bool          // guarded by p.mu
	done    chan struct{} // closed once the connection that claimed it ended
	dropped bool          // guarded by p.mu: a reply was discarded
}

// DropNextReply arms a one-shot fault: the next chunk any client sends is
// forwarded to the target, the target's next reply on that connection is
// discarded, and the connection is reset, so the client sees its request
// fail although the target acted on it. A drop armed earlier and not yet
// claimed is cancelled.
func (p *Proxy) DropNextReply() *Drop {
	d := &Drop{p: p, done: make(chan struct{})}
	p.mu.Lock()
	if old := p.drop; old != nil {
		p.drop = nil
		close(old.done)
	}
	p.drop = d
	p.mu.Unlock()
	return d
}

// Cancel disarms d if no request has claimed it yet, and reports whether
// it did. Once a request claimed it, Cancel returns false and the reply
// is still dropped.
func (d *Drop) Cancel() bool {
	p := d.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if d.claimed || p.drop != d {
		return false
	}
	p.drop = nil
	close(d.done)
	return true
}

// Claimed reports whether a request has been forwarded under d.
func (d *Drop) Claimed() bool {
	d.p.mu.Lock()
	defer d.p.mu.Unlock()
	return d.claimed
}

// Done is closed when d is settled: cancelled, or the connection that
// claimed it has ended (normally by the reset after the dropped reply).
func (d *Drop) Done() <-chan struct{} { return d.done }

// Dropped reports whether a reply was discarded under d.
func (d *Drop) Dropped() bool {
	d.p.mu.Lock()
	defer d.p.mu.Unlock()
	return d.dropped
}

// Close stops listening, closes every connection (without RST) and waits
// for the proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	p.cancel()
	var all []*conn
	for c := range p.conns {
		all = append(all, c)
	}
	if d := p.drop; d != nil {
		p.drop = nil
		close(d.done)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range all {
		c.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			cc.Close()
			return
		}
		p.stats.Accepted++
		c := &conn{p: p, client: cc}
		c.ctx, c.cancel = context.WithCancel(p.ctx)
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go c.run()
	}
}

// conn is one proxied connection.
type conn struct {
	p      *Proxy
	client net.Conn

	ctx    context.Context // cancelled when the connection is torn down
	cancel context.CancelFunc

	mu       sync.Mutex
	upstream net.Conn // nil until dialled
	ended    bool
	doomed   *Drop // its next reply is to be dropped
}

func (c *conn) run() {
	defer c.p.wg.Done()
	defer c.close()
	// Reset mode: abort at once; Blackhole: hold the connection before
	// anything reaches the target.
	if !c.gate() {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, dialTimeout)
	up, err := (&net.Dialer{}).DialContext(ctx, "tcp", c.p.target)
	cancel()
	if err != nil {
		c.reset()
		return
	}
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		up.Close()
		return
	}
	c.upstream = up
	c.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.pipe(c.client, up, true) }()
	go func() { defer wg.Done(); c.pipe(up, c.client, false) }()
	wg.Wait()
}

// gate holds what the connection has (a chunk read, a half-close, or
// the new connection itself) while the proxy is in Blackhole mode,
// telling Held so. It returns false if the connection ended (or was
// reset because the mode is Reset).
func (c *conn) gate() bool {
	for {
		c.p.mu.Lock()
		mode, changed := c.p.mode, c.p.changed
		c.p.mu.Unlock()
		switch mode {
		case Reset:
			c.reset()
			return false
		case Pass:
			select {
			case <-c.ctx.Done():
				return false
			default:
				return true
			}
		}
		c.p.holding()
		select {
		case <-c.ctx.Done():
			return false
		case <-changed:
		}
	}
}

// delay waits out the proxy's latency, counted from read.
func (c *conn) delay(read time.Time) bool {
	for {
		c.p.mu.Lock()
		lat, changed := c.p.latency, c.p.changed
		c.p.mu.Unlock()
		wait := time.Until(read.Add(lat))
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-c.ctx.Done():
			t.Stop()
			return false
		case <-changed: // latency may have changed: recompute
			t.Stop()
		case <-t.C:
			return true
		}
	}
}

// pipe copies src to dst chunk by chunk; up says the direction is client
// to target.
func (c *conn) pipe(src, dst net.Conn, up bool) {
	buf := make([]byte, 32<<10)
	for {
		// It reads in every mode, a blackhole too: what arrives then is
		// held here, where Held sees it, not left unread in the kernel's
		// buffer (a chunk sent just after a blackhole began, before this
		// loop came back to its read, would be held without a sign).
		n, err := src.Read(buf)
		if n > 0 || err != nil {
			// A chunk, a half-close or a reset read during a blackhole
			// is held until it ends.
			if !c.gate() {
				return
			}
		}
		if n > 0 {
			read := time.Now()
			if !c.delay(read) || !c.gate() {
				return
			}
			if up {
				c.claimDrop()
			} else if c.dropReply() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				c.close()
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// Pass the half-close on; the other direction may still
				// carry a reply.
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				return
			}
			c.close()
			return
		}
	}
}

// claimDrop makes this connection the one whose next reply is dropped, if
// a drop is armed.
func (c *conn) claimDrop() {
	c.mu.Lock() // lock order: c.mu, then p.mu
	defer c.mu.Unlock()
	if c.doomed != nil || c.ended {
		return
	}
	p := c.p
	p.mu.Lock()
	if d := p.drop; d != nil {
		p.drop = nil
		d.claimed = true
		c.doomed = d
	}
	p.mu.Unlock()
}

// dropReply discards a reply if the connection is doomed, and resets it.
func (c *conn) dropReply() bool {
	c.mu.Lock()
	d := c.doomed
	c.mu.Unlock()
	if d == nil {
		return false
	}
	c.p.mu.Lock()
	d.dropped = true
	c.p.stats.DroppedReplies++
	c.p.mu.Unlock()
	c.reset()
	return true
}

// reset aborts the connection with a RST on both sides.
func (c *conn) reset() {
	c.teardown(true)
}

// close closes the connection normally.
func (c *conn) close() {
	c.teardown(false)
}

func (c *conn) teardown(rst bool) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	c.ended = true
	c.cancel()
	up, doomed := c.upstream, c.doomed
	c.mu.Unlock()

	for _, nc := range []net.Conn{c.client, up} {
		if nc == nil {
			continue
		}
		if tc, ok := nc.(*net.TCPConn); ok && rst {
			_ = tc.SetLinger(0) // close sends RST
		}
		nc.Close()
	}
	p := c.p
	p.mu.Lock()
	delete(p.conns, c)
	if rst {
		p.stats.Resets++
	}
	p.mu.Unlock()
	if doomed != nil {
		close(doomed.done)
	}
}
