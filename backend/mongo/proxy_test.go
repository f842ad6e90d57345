package mongo_test

import (
	"net"
	"net/url"
	"sync"
	"testing"
)

// stallProxy is a TCP proxy in front of a test server that can stop
// forwarding (a server that stops answering, as if SIGSTOPped, without
// pausing the shared server) and vanish (a server stopped after Open:
// its listener and connections gone, so new connections are refused).
type stallProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	gate    chan struct{} // closed while forwarding; open while stalled
	held    chan struct{} // receives when a chunk waits at a stalled gate
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
	addr    string
	stopped chan struct{}
}

// newStallProxy starts a proxy to the host of the server URL raw and
// returns it; it is closed when the test ends.
func newStallProxy(t *testing.T, raw string) *stallProxy {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	p := &stallProxy{ln: ln, target: u.Host, gate: open, held: make(chan struct{}, 1),
		conns: map[net.Conn]struct{}{}, addr: ln.Addr().String(), stopped: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.vanish)
	return p
}

// url returns raw with its host replaced by the proxy's.
func (p *stallProxy) url(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.addr
	return u.String()
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

// pipe copies from src to dst, each chunk only while the gate is open.
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pass waits until the gate is open; false if the proxy vanished.
func (p *stallProxy) pass() bool {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	select {
	case <-gate:
		return true
	default:
	}
	select {
	case p.held <- struct{}{}:
	default:
	}
	select {
	case <-gate:
		return true
	case <-p.stopped:
		return false
	}
}

// stall stops forwarding in both directions; data waits in the proxy.
func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default:
	}
	select { // forget a chunk held before this stall
	case <-p.held:
	default:
	}
}

// resume forwards again, the waiting data first.
func (p *stallProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// vanish closes the listener and every connection: new connections to
// the proxy's port are refused, as by a server that was stopped.
func (p *stallProxy) vanish() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.stopped)
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
