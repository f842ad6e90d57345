package file_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// TestWatch: a watch fires on a release, and its goroutine ends (the
// channel closes) when its context ends or the Backend is closed.
func TestWatch(t *testing.T) {
	b := mustNew(t, t.TempDir())
	ctx := context.Background()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "w", Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	ch, err := b.Watch(wctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no notification after release")
	}
	cancel()
	if !closedWithin(ch, 10*time.Second) {
		t.Fatal("watch channel not closed after its context ended")
	}

	ch2, err := b.Watch(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if !closedWithin(ch2, 10*time.Second) {
		t.Fatal("watch channel not closed by Backend.Close")
	}
	if _, err := b.Watch(ctx, "w"); err != driver.ErrClosed {
		t.Fatalf("Watch after Close = %v; want ErrClosed", err)
	}
}

func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	deadline := time.After(d)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return true
			}
		case <-deadline:
			return false
		}
	}
}
