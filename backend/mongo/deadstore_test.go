package mongo_test

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"

	mongolock "github.com/fencelock/fencelock/backend/mongo"
)

// deadPort returns a loopback address where nothing listens.
func deadPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// overrun is the engine's documented overrun after a call's bound
// (Options.ReleaseTimeout's default), plus scheduling slack.
const overrun = 5*time.Second + 2*time.Second

// TestOpenOnRefusedPortFailsWithCause: Open of a URL where nothing
// listens returns within its context's deadline plus the overrun, with
// the refused connection as its cause (errors.Is ECONNREFUSED, and the
// message says so).
func TestOpenOnRefusedPortFailsWithCause(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	b, err := mongolock.Open(ctx, "mongodb://"+deadPort(t)+"/?database=fencelock_test")
	took := time.Since(start)
	if err == nil {
		b.Close()
		t.Fatal("Open of a refused port succeeded")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, mongolock.ErrUnreachable) {
		t.Errorf("Open error %v does not match ErrUnreachable and ECONNREFUSED", err)
	}
	if took > 3*time.Second+overrun {
		t.Errorf("Open took %v; want at most its 3s deadline + %v", took, overrun)
	}
	t.Logf("Open: %v after %v", err, took.Round(time.Millisecond))
}

// TestCallsOnVanishedServerEndWithinBound: a client opened through a
// proxy whose listener and connections then vanish (a server stopped
// after Open) gets TryAcquire (no deadline) back within the TTL plus the
// overrun, and Acquire with a 3s deadline back by the deadline plus the
// overrun, each with the refused connection as its cause.
func TestCallsOnVanishedServerEndWithinBound(t *testing.T) {
	eachServer(t, testCallsOnVanishedServerEndWithinBound)
}

func testCallsOnVanishedServerEndWithinBound(t *testing.T, _ server, raw string) {
	const ttl = 3 * time.Second
	p := newStallProxy(t, raw)
	c, err := fencelock.Open(context.Background(), withParams(t, p.url(t, raw), "database", testDatabase, "collection", freshCollection(t, raw)), &fencelock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "vanish/warm")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.vanish()

	start := time.Now()
	_, err = c.TryAcquire(context.Background(), "vanish/k")
	took := time.Since(start)
	t.Logf("TryAcquire: %v after %v", err, took.Round(time.Millisecond))
	// Its first command meets the connection the server closed; the
	// ones after, the refused ones.
	if !errors.Is(err, mongolock.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, io.EOF) {
		t.Errorf("TryAcquire on a vanished server = %v; want ErrUnreachable caused by a closed or refused connection", err)
	}
	if took > ttl+overrun {
		t.Errorf("TryAcquire took %v; want at most TTL %v + %v", took, ttl, overrun)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start = time.Now()
	_, err = c.Acquire(ctx, "vanish/k")
	took = time.Since(start)
	t.Logf("Acquire: %v after %v", err, took.Round(time.Millisecond))
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire on a vanished server = %v; want the deadline joined with the refused connection", err)
	}
	if took > 3*time.Second+overrun {
		t.Errorf("Acquire with a 3s deadline took %v; want at most 3s + %v", took, overrun)
	}
}
