//go:build linux

package redis_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	fencelockredis "github.com/fencelock/fencelock/backend/redis"
)

// captureStderr points file descriptor 2 (standard error of the whole
// process, whatever os.Stderr was when a logger captured it) at a pipe
// while f runs, and returns what was written to it.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() { // drained all along: a full pipe would block the writers
		b, _ := io.ReadAll(r)
		r.Close()
		got <- b
	}()
	if err := syscall.Dup3(int(w.Fd()), 2, 0); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if err := syscall.Dup3(saved, 2, 0); err != nil {
				panic(err)
			}
			syscall.Close(saved)
			w.Close()
		}()
		f()
	}()
	return string(<-got)
}

// During an outage (the server killed after Open) the backend writes
// nothing to the program's standard error: go-redis's connection pool
// logs every failed dial through its process-wide logger, whose default
// writes to standard error, about 20 lines in 5s with the defaults.
func TestOutageWritesNothingToStderr(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := fencelockredis.Open(ctx, s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const ttl = time.Second
	c, err := fencelock.New(b, &fencelock.Options{TTL: ttl, ReleaseTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Acquire(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	var errs []error
	out := captureStderr(t, func() {
		s.kill()
		// Failed renewals of the lease, failed attempts of a waiter and
		// of single tries, each dialling the dead server.
		actx, acancel := context.WithTimeout(ctx, 2*ttl)
		defer acancel()
		_, err := c.Acquire(actx, "wait")
		errs = append(errs, err)
		for range 5 {
			_, err := c.TryAcquire(ctx, "try")
			errs = append(errs, err)
		}
	})
	for _, err := range errs {
		if err == nil {
			t.Error("a call succeeded during the outage")
		}
	}
	if out != "" {
		t.Errorf("written to standard error during the outage:\n%s", out)
	}
}

type recordingLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *recordingLogger) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

// A program that sets its own go-redis logger (after this package was
// initialised, as main does) receives go-redis's lines about the
// backend's connections: the package silences only go-redis's default
// logger, not one the program chose.
func TestProgramsOwnLoggerIsKept(t *testing.T) {
	rec := &recordingLogger{}
	goredis.SetLogger(rec)
	t.Cleanup(func() { goredis.SetLogger(discardLogger{}) })
	u := "redis://" + refusingAddr(t) + "/0"
	if b, err := fencelockredis.Open(t.Context(), u); err == nil {
		b.Close()
		t.Fatal("Open succeeded on a port where nothing listens")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, l := range rec.lines {
		if strings.Contains(l, "connection refused") {
			return
		}
	}
	t.Errorf("the program's logger got %q; want go-redis's line about the refused dial", rec.lines)
}
