package zookeeper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// TestWatchWakesOnEveryQueueChange: Watch wakes its caller when a key
// that never existed is acquired, when the holder's metadata changes (its
// znode's data is rewritten) and when it is released; the channel closes
// when the watch's context ends, and a closed backend refuses to watch.
func TestWatchWakesOnEveryQueueChange(t *testing.T) {
	b, _ := open(t, 4*time.Second)
	ctx := t.Context()
	ch, err := b.Watch(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	await := func(what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no wake-up after %s", what)
		}
	}
	drain := func() {
		for {
			select {
			case <-ch:
			case <-time.After(200 * time.Millisecond):
				return
			}
		}
	}
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "w", Owner: "o", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	await("acquire")
	drain()
	if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: 5 * time.Second, SetMetadata: true, Metadata: []byte("v2")}); err != nil {
		t.Fatal(err)
	}
	await("a metadata update")
	drain()
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	await("release")

	wctx, cancel := context.WithCancel(ctx)
	ch2, err := b.Watch(wctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	for range ch2 { // drains, then ends: the watch's goroutine closed it
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Watch(ctx, "w"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Watch after Close = %v; want ErrClosed", err)
	}
}
