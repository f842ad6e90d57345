package faultproxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes every line back and reports each line it received.
type echoServer struct {
	ln   net.Listener
	got  chan string
	wg   sync.WaitGroup
	mu   sync.Mutex
	conn []net.Conn
}

func newEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln, got: make(chan string, 100)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conn = append(s.conn, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					s.got <- line
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conn {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes line and reads the echo within d.
func roundTrip(c net.Conn, line string, d time.Duration) (string, error) {
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte(line)); err != nil {
		return "", err
	}
	buf := make([]byte, len(line))
	_, err := io.ReadFull(c, buf)
	return string(buf), err
}

func readLine(t *testing.T, c net.Conn, d time.Duration) (string, error) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// quiet is how long a test watches for bytes that must not flow.
const quiet = 300 * time.Millisecond

// TestPass: bytes flow both ways unchanged.
func TestPass(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p)
	for _, line := range []string{"a\n", "hello world\n"} {
		got, err := roundTrip(c, line, 5*time.Second)
		if err != nil || got != line {
			t.Fatalf("round trip %q: got %q, %v", line, got, err)
		}
	}
	if s := p.Stats(); s.Accepted != 1 || s.Resets != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestLatency: each direction adds the configured latency, so a round
// trip takes at least twice as long; setting 0 removes it.
func TestLatency(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p)
	const lat = 100 * time.Millisecond
	p.SetLatency(lat)
	start := time.Now()
	if got, err := roundTrip(c, "x\n", 5*time.Second); err != nil || got != "x\n" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	if d := time.Since(start); d < 2*lat {
		t.Fatalf("round trip with %v latency each way took %v", lat, d)
	}
	p.SetLatency(0)
	start = time.Now()
	if _, err := roundTrip(c, "y\n", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= lat {
		t.Fatalf("round trip without latency took %v", d)
	}
}

// TestBlackhole: nothing reaches the target or the client, on an existing
// connection and on one opened during the blackhole; the held bytes flow
// when the mode returns to Pass.
func TestBlackhole(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	old := dial(t, p)
	if _, err := roundTrip(old, "before\n", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	<-e.got

	p.SetMode(Blackhole)
	if _, err := old.Write([]byte("held-old\n")); err != nil {
		t.Fatal(err)
	}
	fresh := dial(t, p)
	if _, err := fresh.Write([]byte("held-new\n")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []net.Conn{old, fresh} {
		if got, err := readLine(t, c, quiet); !isTimeout(err) {
			t.Fatalf("read during blackhole: %q, %v (want a timeout)", got, err)
		}
	}
	select {
	case line := <-e.got:
		t.Fatalf("target received %q during the blackhole", line)
	default:
	}

	p.SetMode(Pass)
	for c, want := range map[net.Conn]string{old: "held-old\n", fresh: "held-new\n"} {
		got, err := readLine(t, c, 5*time.Second)
		if err != nil || got != want {
			t.Fatalf("after healing: %q, %v; want %q", got, err, want)
		}
	}
}

// TestBlackholeHoldsReply: a reply already on its way when the blackhole
// starts is held too.
func TestBlackholeHoldsReply(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	p.SetLatency(200 * time.Millisecond)
	c := dial(t, p)
	if _, err := c.Write([]byte("late\n")); err != nil {
		t.Fatal(err)
	}
	<-e.got // the request is through; its reply waits out the latency
	p.SetMode(Blackhole)
	if got, err := readLine(t, c, quiet+200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("read during blackhole: %q, %v", got, err)
	}
	p.SetMode(Pass)
	if got, err := readLine(t, c, 5*time.Second); err != nil || got != "late\n" {
		t.Fatalf("after healing: %q, %v", got, err)
	}
}

// TestReset: existing connections are aborted with a RST, and so is a new
// one; Pass makes new connections work again.
func TestReset(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	old := dial(t, p)
	if _, err := roundTrip(old, "a\n", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetMode(Reset)
	if _, err := readLine(t, old, 5*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("existing connection after Reset: %v, want ECONNRESET", err)
	}
	// A new connection is reset as soon as it is accepted: the dial
	// itself may see the RST, or else the first exchange does.
	fresh, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err == nil {
		defer fresh.Close()
		_, err = roundTrip(fresh, "b\n", 5*time.Second)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("new connection in Reset mode: %v, want a reset", err)
	}
	p.SetMode(Pass)
	c := dial(t, p)
	if got, err := roundTrip(c, "c\n", 5*time.Second); err != nil || got != "c\n" {
		t.Fatalf("after Reset → Pass: %q, %v", got, err)
	}
}

// TestDropNextReply: the request reaches the target (it acts), the client
// gets a reset instead of the reply, and only that one exchange is hit.
func TestDropNextReply(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p)
	if _, err := roundTrip(c, "first\n", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	<-e.got
	d := p.DropNextReply()
	if d.Claimed() {
		t.Fatal("claimed before any request")
	}
	_, err := roundTrip(c, "acted\n", 5*time.Second)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client saw %v, want ECONNRESET", err)
	}
	select {
	case line := <-e.got:
		if line != "acted\n" {
			t.Fatalf("target got %q", line)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached the target")
	}
	<-d.Done()
	if !d.Claimed() || !d.Dropped() || d.Cancel() {
		t.Fatalf("drop state: claimed %v dropped %v", d.Claimed(), d.Dropped())
	}
	if s := p.Stats(); s.DroppedReplies != 1 {
		t.Fatalf("stats %+v", s)
	}
	// One-shot: the next connection works.
	c2 := dial(t, p)
	if got, err := roundTrip(c2, "again\n", 5*time.Second); err != nil || got != "again\n" {
		t.Fatalf("after the drop: %q, %v", got, err)
	}
}

// TestDropCancel: a drop cancelled before any request leaves traffic alone.
func TestDropCancel(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	d := p.DropNextReply()
	if !d.Cancel() {
		t.Fatal("Cancel of an unclaimed drop returned false")
	}
	<-d.Done()
	c := dial(t, p)
	if got, err := roundTrip(c, "ok\n", 5*time.Second); err != nil || got != "ok\n" {
		t.Fatalf("after a cancelled drop: %q, %v", got, err)
	}
	if d.Dropped() || d.Claimed() {
		t.Fatal("cancelled drop was used")
	}
}

// TestCloseEndsEverything: Close with connections open in every state
// (passing, held in a blackhole, waiting out latency) ends all goroutines;
// goleak in TestMain checks that none is left.
func TestCloseEndsEverything(t *testing.T) {
	e := newEcho(t)
	p, err := Listen(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a := dial(t, p)
	if _, err := roundTrip(a, "a\n", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetLatency(time.Hour)
	if _, err := a.Write([]byte("slow\n")); err != nil {
		t.Fatal(err)
	}
	p.SetMode(Blackhole)
	b := dial(t, p)
	if _, err := b.Write([]byte("held\n")); err != nil {
		t.Fatal(err)
	}
	p.DropNextReply()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("Close did not return")
	}
	if err := p.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still accepts after Close")
	}
}

// TestParseMode: every mode's name parses back to it.
func TestParseMode(t *testing.T) {
	for _, m := range []Mode{Pass, Blackhole, Reset} {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Fatalf("ParseMode(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := ParseMode("nope"); err == nil {
		t.Fatal("ParseMode accepted an unknown name")
	}
}

// TestHeldSignalsAHeldChunk: Held stays open while a blackhole holds
// nothing (an idle connection), is closed once a chunk sent during the
// blackhole is held, and a later blackhole gets a fresh channel.
func TestHeldSignalsAHeldChunk(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p)
	if _, err := roundTrip(c, "before\n", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	<-e.got
	for round := range 2 {
		p.SetMode(Blackhole)
		held := p.Held()
		select {
		case <-held:
			t.Fatalf("round %d: Held closed before anything was sent", round)
		case <-time.After(quiet):
		}
		sendIntoBlackhole(t, p, c, e, held, round)
	}
}

// sendIntoBlackhole sends a chunk on c during p's blackhole, waits for
// held (Held's channel for that blackhole) to close, heals p, and checks
// that the chunk then made its way to the echo server e and back.
func sendIntoBlackhole(t *testing.T, p *Proxy, c net.Conn, e *echoServer, held <-chan struct{}, round int) {
	t.Helper()
	if _, err := c.Write([]byte("held\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatalf("round %d: Held not closed 10s after a chunk was sent into the blackhole", round)
	}
	p.SetMode(Pass)
	if got, err := readLine(t, c, 5*time.Second); err != nil || got != "held\n" {
		t.Fatalf("round %d: after healing: %q, %v", round, got, err)
	}
	<-e.got
}

// TestHeldSignalsAHeldConnection: a connection opened during a blackhole
// is held, and Held says so.
func TestHeldSignalsAHeldConnection(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	p.SetMode(Blackhole)
	dial(t, p)
	select {
	case <-p.Held():
	case <-time.After(10 * time.Second):
		t.Fatal("Held not closed 10s after a connection was opened into the blackhole")
	}
}

// TestListenAtReusesAClosedProxysAddress: a proxy on the address of one
// that was closed (a store back on its port) accepts and forwards.
func TestListenAtReusesAClosedProxysAddress(t *testing.T) {
	e := newEcho(t)
	p, err := Listen(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	addr := p.Addr()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatal("a closed proxy's address accepts connections")
	}
	q, err := ListenAt(addr, e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	if q.Addr() != addr {
		t.Fatalf("ListenAt(%s) listens on %s", addr, q.Addr())
	}
	c := dial(t, q)
	if got, err := roundTrip(c, "back\n", 5*time.Second); err != nil || got != "back\n" {
		t.Fatalf("through the reopened proxy: %q, %v", got, err)
	}
	if _, err := ListenAt(addr, e.ln.Addr().String()); err == nil {
		t.Fatal("ListenAt on an address in use succeeded")
	}
}

// TestHeldSignalsEveryBlackholeOfAQuickSeries: blackholes that follow
// each other at once, each with a chunk sent into it, each signal Held:
// the proxy reads what arrives during a blackhole and holds it, so a
// chunk that arrives before the proxy's copy loop is back at its read
// (it was still forwarding the last reply) is seen too.
func TestHeldSignalsEveryBlackholeOfAQuickSeries(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c := dial(t, p)
	for round := range 200 {
		p.SetMode(Blackhole)
		sendIntoBlackhole(t, p, c, e, p.Held(), round)
	}
}
