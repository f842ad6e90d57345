package zookeeper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/deadstore"
)

// TestAcquireWithDeadlineOnASilentServerNamesTheCause: an Acquire with a
// deadline (the context's, or WithWait's) on a server that stopped
// answering returns the context's end (or ErrNotAcquired) joined with
// the store's cause, ErrNoAnswer, whatever request is in flight when the
// deadline comes. With a TTL of 1s and a deadline of 2.5s, the deadline
// comes while the engine's Inspect runs, the one that follows a queue
// wait that reached its TTL bound (docs/design.md, "Bounds"): that
// Inspect, cut short by the caller's deadline, says only that the context
// ended, and the call must still name what the store did before it (the
// first attempt and the queue wait had no answer). The safety suite's
// call-bounds cell found these calls returning a bare
// "context deadline exceeded" and "not acquired within the wait bound".
func TestAcquireWithDeadlineOnASilentServerNamesTheCause(t *testing.T) {
	const (
		ttl      = time.Second
		deadline = 2500 * time.Millisecond // within the Inspect after the queue wait: [2×TTL, 3×TTL)
	)
	e, u := ownServer(t, 10*time.Second) // the connection outlives the test's calls
	ctx := t.Context()
	calls := []struct {
		name string
		call func(c *fencelock.Client, key string) error
		want error // besides ErrNoAnswer
	}{
		{"context deadline", func(c *fencelock.Client, key string) error {
			cctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			_, err := c.Acquire(cctx, key)
			return err
		}, context.DeadlineExceeded},
		{"WithWait", func(c *fencelock.Client, key string) error {
			_, err := c.Acquire(context.Background(), key, fencelock.WithWait(deadline))
			return err
		}, fencelock.ErrNotAcquired},
	}
	clients := make([]*fencelock.Client, len(calls))
	for i := range calls {
		c, err := fencelock.Open(ctx, u, &fencelock.Options{TTL: ttl, ReleaseTimeout: 2 * time.Second, Owner: "deadline-cause"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// A session before the server stops: the calls' requests go
		// unanswered on a live connection.
		if _, err := c.Inspect(ctx, "deadline-cause/"+calls[i].name); err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	if err := e.Pause(ctx, "zookeeper"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Resume(context.Background(), "zookeeper"); err != nil {
			t.Error(err)
		}
	})
	t.Run("calls", func(t *testing.T) {
		for i, tc := range calls {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel() // both at once, while the connections live
				_, err, took := deadstore.Within(t, tc.name, time.Minute, func() (struct{}, error) {
					return struct{}{}, tc.call(clients[i], "deadline-cause/"+tc.name)
				})
				t.Logf("Acquire with a %s of %v on a silent server, after %v: %v", tc.name, deadline, took, err)
				switch {
				case err == nil:
					t.Error("acquired on a server that does not answer")
				case !errors.Is(err, tc.want):
					t.Errorf("error %q; want one matching %v", err, tc.want)
				case !errors.Is(err, ErrNoAnswer):
					t.Errorf("error %q; want the store's cause in it too, ErrNoAnswer", err)
				}
			})
		}
	})
}
