package generative

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestStalledReadThatTimesOutKeepsTheBytesForTheNextRead: a read whose
// deadline passes during a stall returns a timeout and nothing, and the
// bytes that had arrived are what the next read returns once the stall
// ends, as a real socket keeps them. A driver that keeps the connection
// after a timed-out read (MongoDB's reads the rest of the reply first)
// otherwise loses its place in the stream and waits forever.
func TestStalledReadThatTimesOutKeepsTheBytesForTheNextRead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var s Staller
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	s.Stall(ctx, time.Hour)
	if _, err := srv.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read during a stall past its deadline = %d, %v; want 0 and a timeout", n, err)
	}
	// The stall ends (a stall of 0 from now replaces it).
	s.mu.Lock()
	s.until = time.Now()
	s.signal()
	s.mu.Unlock()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(io.LimitReader(c, int64(len("reply"))))
	if err != nil || string(got) != "reply" {
		t.Fatalf("after the stall, Read = %q, %v; want the bytes that arrived during it (%q)", got, err, "reply")
	}
}
