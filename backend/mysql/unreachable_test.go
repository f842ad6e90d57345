package mysql_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/mysql"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/deadstore"
	"github.com/fencelock/fencelock/internal/testenv"
)

// ownServer starts a MariaDB of the test's own (deadstore.OwnServer), so
// that the test may stop, kill or pause it without disturbing the server
// other tests share.
func ownServer(t *testing.T) (*testenv.Env, string) {
	t.Helper()
	return deadstore.OwnServer(t, "mysql", "MariaDB")
}

// Open on an address where nothing listens fails within a second, saying
// that the connection was refused.
func TestOpenRefusedConnectionFailsAtOnce(t *testing.T) {
	u := "mysql://fencelock@" + deadstore.RefusingAddr(t) + "/fencelock"
	deadstore.RefusedOpen{
		Open:    func(ctx context.Context) (io.Closer, error) { return mysql.Open(ctx, u) },
		Bound:   time.Second,
		Refused: deadstore.IsRefusal,
	}.Check(t)
}

// On a MariaDB stopped after Open, one backend request fails within a
// second, and the calls of deadstore.Outage within their bounds, each
// naming the refused connection.
func TestServerStoppedAfterOpenCallsEndWithTheCause(t *testing.T) {
	e, u := ownServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := mysql.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	o := &deadstore.Outage{
		TTL: 2 * time.Second, ReleaseTimeout: time.Second, Slack: time.Second,
		Cause: deadstore.IsRefusal,
	}
	o.Stop(ctx, t, b, func(ctx context.Context) error { return e.Stop(ctx, "mysql") })

	t.Run("Backend.Acquire", func(t *testing.T) {
		deadstore.Call{
			What:           "Backend.Acquire(context.Background())",
			Times:          3, // a broken pooled connection, then new connections
			Hang:           o.TTL + o.Slack,
			Bound:          time.Second,
			Cause:          deadstore.IsRefusal,
			FirstMayDiffer: true,
		}.Check(t, func() error {
			_, err := b.Acquire(context.Background(), driver.AcquireRequest{Key: "backend", Owner: "o1", TTL: o.TTL})
			return err
		})
	})
	o.Run(ctx, t)
}

// Open on a server that accepts connections but never answers (a paused
// server) fails once the URL's timeout= has passed, even under a context
// without a deadline, and says so: the driver bounds only the dial with
// timeout=, and its handshake waited for ever.
func TestOpenSilentServerFailsAfterTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	done := make(chan error, 1)
	go func() {
		b, err := mysql.Open(context.Background(), "mysql://u:"+secret+"@"+ln.Addr().String()+"/db?timeout=300ms")
		if err == nil {
			b.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "timeout=") || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Open on a silent server: %v; want an error naming timeout= that matches context.DeadlineExceeded", err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("the error shows the password: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Open on a server that never answers has not returned after 30s (timeout=300ms): it waits for ever")
	}
}
