package generative

import (
	"context"
	"net"
	"os"
	"sync"
	"time"
)

// Staller dials connections that a test can stall all at once, as a
// store paused with SIGSTOP stalls them: while stalled, nothing written
// reaches the store and nothing it sent is read, until the stall ends
// or the connection's deadline passes (then the call fails with a
// timeout, as on a real connection). What was held flows when the stall
// ends: the store applies a request late, as a paused one does.
//
// A backend's generative test dials its store through a Staller (its
// driver's dialer option), one per stream of programs, and returns its
// Stall as the Stream's Stall (Options.PerStream).
// MongoDB's backend, which estimates the server's clock from hello
// round trips, needs it: a stall at the driver boundary never reaches
// those. A Staller is safe for concurrent use; its zero value dials with
// a net.Dialer.
type Staller struct {
	mu    sync.Mutex
	until time.Time     // end of the current stall
	wake  chan struct{} // closed and replaced when a stall ends or changes
}

// DialContext dials address like net.Dialer.DialContext, returning a
// connection that stalls with the Staller.
func (s *Staller) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	if err := s.wait(ctx.Done(), time.Time{}); err != nil {
		return nil, err
	}
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, s: s}, nil
}

// Stall stalls every connection of s for d from now (extending a stall
// under way), and returns at once.
func (s *Staller) Stall(_ context.Context, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until := time.Now().Add(d); until.After(s.until) {
		s.until = until
	}
	s.signal()
	time.AfterFunc(d, func() {
		s.mu.Lock()
		s.signal()
		s.mu.Unlock()
	})
}

// signal wakes every waiter to look at the stall again. Called with s.mu
// held.
func (s *Staller) signal() {
	if s.wake != nil {
		close(s.wake)
	}
	s.wake = make(chan struct{})
}

// wait returns once no stall is under way, or with a timeout error once
// deadline (if not zero) passes, or ctx's error once done is closed.
func (s *Staller) wait(done <-chan struct{}, deadline time.Time) error {
	for {
		s.mu.Lock()
		until := s.until
		if s.wake == nil {
			s.wake = make(chan struct{})
		}
		wake := s.wake
		s.mu.Unlock()
		now := time.Now()
		if !now.Before(until) {
			return nil
		}
		var timeout <-chan time.Time
		if !deadline.IsZero() {
			if !now.Before(deadline) {
				return os.ErrDeadlineExceeded
			}
			t := time.NewTimer(deadline.Sub(now))
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-wake:
		case <-timeout:
			return os.ErrDeadlineExceeded
		case <-done:
			return context.Canceled
		}
	}
}

// stallConn is a connection of a Staller.
type stallConn struct {
	net.Conn
	s *Staller

	mu            sync.Mutex
	rdl, wdl      time.Time
	held          []byte // read from Conn during a stall whose deadline passed: the next Read's
	closed        chan struct{}
	closeOnce     sync.Once
	closedChannel sync.Once
}

func (c *stallConn) done() <-chan struct{} {
	c.closedChannel.Do(func() { c.closed = make(chan struct{}) })
	return c.closed
}

func (c *stallConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	held := c.held
	c.mu.Unlock()
	var n int
	var err error
	if len(held) > 0 {
		n = copy(p, held)
	} else {
		n, err = c.Conn.Read(p)
	}
	c.mu.Lock()
	dl := c.rdl
	c.mu.Unlock()
	if werr := c.s.wait(c.done(), dl); werr != nil {
		// The deadline passed during the stall: nothing was read, as
		// on a real connection, whose socket keeps what arrived for
		// the next read. Drivers that keep a connection after a read
		// timed out (MongoDB's reads the rest of the reply before
		// reusing it) must find those bytes there.
		if len(held) == 0 && n > 0 {
			c.mu.Lock()
			c.held = append([]byte(nil), p[:n]...)
			c.mu.Unlock()
		}
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: werr}
	}
	if len(held) > 0 {
		c.mu.Lock()
		c.held = c.held[n:]
		c.mu.Unlock()
	}
	return n, err
}

func (c *stallConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	dl := c.wdl
	c.mu.Unlock()
	if err := c.s.wait(c.done(), dl); err != nil {
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: err}
	}
	return c.Conn.Write(p)
}

func (c *stallConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.rdl, c.wdl = t, t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *stallConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.rdl = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *stallConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.wdl = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *stallConn) Close() error {
	c.done()
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
