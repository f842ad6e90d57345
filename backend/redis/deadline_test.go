package redis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
)

// TestCallReturnsByDeadline: a backend opened from a URL returns from a
// call by its context's deadline although the server has not answered (a
// private server paused with CLIENT PAUSE from a second connection), so a
// renewal cannot outlast the engine's deadline for it; once the pause
// ends, the backend works again.
func TestCallReturnsByDeadline(t *testing.T) {
	s := startServer(t, "appendonly yes", "appendfsync always")
	ctx := t.Context()
	b, err := fencelockredis.Open(ctx, s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	g := acquire(t, b, "k", "o", 10*time.Second)

	admin := goredis.NewClient(&goredis.Options{Addr: s.addr()})
	defer admin.Close()
	const pause = 1500 * time.Millisecond // well past the deadline, shorter than go-redis's default read timeout
	if err := admin.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()

	const deadline = 200 * time.Millisecond
	rctx, cancel := context.WithTimeout(ctx, deadline)
	start := time.Now()
	_, err = b.Renew(rctx, g, driver.RenewRequest{TTL: 10 * time.Second})
	took := time.Since(start)
	cancel()
	if late := start.Sub(paused); late > pause/2 {
		t.Skipf("the renewal started %v into a %v pause: machine too slow to tell", late, pause)
	}
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Renew during a pause: %v, want the context's deadline exceeded", err)
	}
	if took > deadline+500*time.Millisecond {
		t.Errorf("Renew with a %v deadline returned after %v (the server was paused for %v)", deadline, took, pause)
	}

	// After the pause the grant is still there and renews.
	if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: 10 * time.Second}); err != nil {
		t.Errorf("Renew after the pause: %v", err)
	}
}
