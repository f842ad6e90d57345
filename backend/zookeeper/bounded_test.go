package zookeeper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// callBound is the deadline the tests below give each call, and callSlack
// how long after it the call must have returned (the driver contract: a
// backend call returns when its context ends).
const (
	callBound = 300 * time.Millisecond
	callSlack = 200 * time.Millisecond
)

// boundedCalls makes Inspect, Acquire, Renew and Release on b, each with a
// callBound deadline, while the server does not answer them, and checks
// that each returns by callBound + callSlack; one that returns at its
// deadline returns ctx's error joined with a cause, ErrNoAnswer, or the
// error of the connection's loss, which names its cause. (A call
// may also fail before it: go-zookeeper fails a request it could not
// send, and the backend fails fast once the connection knows its server
// is down.) g is a grant of b on key held; free is a key nobody holds.
func boundedCalls(t *testing.T, b *Backend, g driver.Grant, free string) {
	t.Helper()
	check := func(what string, err error, took time.Duration) {
		t.Helper()
		t.Logf("%s after %v: %v", what, took, err)
		switch {
		case err == nil:
			t.Errorf("%s succeeded with no server answering", what)
		case took < callBound:
		case errors.As(err, new(*unreachableError)):
			// The connection's loss failed the request as its deadline
			// came: the error names that cause.
		case !errors.Is(err, ErrNoAnswer):
			t.Errorf("%s = %v after its deadline; want the context's error joined with ErrNoAnswer (a cause)", what, err)
		case !errors.Is(err, context.DeadlineExceeded):
			t.Errorf("%s = %v after its deadline; want the context's error", what, err)
		}
		if took > callBound+callSlack {
			t.Errorf("%s returned %v after it began; want by its deadline %v + %v", what, took, callBound, callSlack)
		}
	}
	run := func(what string, f func(ctx context.Context) error) {
		t.Helper()
		_, err, took := within(t, what, 30*time.Second, func() (struct{}, error) {
			ctx, cancel := context.WithTimeout(context.Background(), callBound)
			defer cancel()
			return struct{}{}, f(ctx)
		})
		check(what, err, took)
	}
	// In this order each call's own first request is the one that goes
	// unanswered, until Acquire leaves a clean-up (the nonce of its
	// create) that Release's sweep tries first.
	run("Inspect", func(ctx context.Context) error { _, err := b.Inspect(ctx, g.Key); return err })
	run("Renew", func(ctx context.Context) error {
		_, err := b.Renew(ctx, g, driver.RenewRequest{TTL: g.TTL})
		return err
	})
	run("Renew with Rotate", func(ctx context.Context) error {
		_, err := b.Renew(ctx, g, driver.RenewRequest{TTL: g.TTL, Rotate: true})
		return err
	})
	run("Acquire", func(ctx context.Context) error {
		_, err := b.Acquire(ctx, driver.AcquireRequest{Key: free, Owner: "late", TTL: g.TTL})
		return err
	})
	run("Release", func(ctx context.Context) error { return b.Release(ctx, g) })
}

// TestCallsEndWithTheirContextOnASilentServer: on a server that accepted
// the connection and then stopped answering (its process stopped with
// SIGSTOP), Inspect, Acquire, Renew and Release each return once their
// context ends, with the context's error joined with ErrNoAnswer, not when
// go-zookeeper gives up on the connection (two thirds of the session
// timeout, 6.7 s here). Once the server answers again, what the abandoned
// requests may have done is undone: the abandoned create's znode (the
// acquire's, which the server executes when it resumes) and the released
// holder's znode are deleted, the engine's clean-up (Inspect, retried
// while it reports the clean-up pending) driving it, so neither key is
// left held by nobody.
func TestCallsEndWithTheirContextOnASilentServer(t *testing.T) {
	e, u := ownServer(t, 10*time.Second)
	ctx := t.Context()
	b, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	other, err := Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	held, free := "silent/"+t.Name()+"/held", "silent/"+t.Name()+"/free"
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: held, Owner: "o", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The free key's znode exists, so the acquire's create is the request
	// that goes unanswered.
	fg, err := other.Acquire(ctx, driver.AcquireRequest{Key: free, Owner: "x", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, fg); err != nil {
		t.Fatal(err)
	}

	if err := e.Pause(ctx, "zookeeper"); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := e.Resume(context.Background(), "zookeeper"); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(resume)
	boundedCalls(t, b, g, free)
	resume()

	for _, key := range []string{free, held} {
		deadline := time.Now().Add(40 * time.Second)
		for {
			info, err := b.Inspect(ctx, key)
			if err == nil {
				if info.Locked() {
					t.Errorf("%s is held by %q after its acquire was abandoned and its holder released it", key, info.Owner)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Inspect(%s) still fails after the server answers again: %v", key, err)
			}
			time.Sleep(100 * time.Millisecond) // the engine's clean-up retries Inspect with backoff; the nonce search lasts 10 s
		}
		queued(t, other, key, 0)
	}
}

// TestCallsEndWithTheirContextAfterTheConnectionDrops: in the first moments
// after the connection drops (go-zookeeper holds requests in its queue
// while it pauses a second before it dials again, and the backend does
// not know yet that the server is down), Inspect, Acquire, Renew and
// Release each return once their context ends.
func TestCallsEndWithTheirContextAfterTheConnectionDrops(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, testTTL)
	other, _ := open(t, testTTL)
	held, free := "dropped/"+t.Name()+"/held", "dropped/"+t.Name()+"/free"
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: held, Owner: "o", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	fg, err := other.Acquire(ctx, driver.AcquireRequest{Key: free, Owner: "x", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, fg); err != nil {
		t.Fatal(err)
	}
	b.d.cut(true)
	defer b.d.cut(false)
	boundedCalls(t, b, g, free)
}
