package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

const fenceTTL = 2 * time.Second

func lockReq(key, owner string) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: owner, TTL: fenceTTL}
}

// awaitQueue waits until key's queue has n entries.
func awaitQueue(t *testing.T, b *Backend, key string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * fenceTTL)
	for queueLen(t, b, key) < n {
		if time.Now().After(deadline) {
			t.Fatalf("queue of %q did not reach %d entries", key, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type waited struct {
	g   driver.Grant
	err error
}

// waitFor starts AcquireWait for owner on key.
func waitFor(ctx context.Context, b *Backend, key, owner string) <-chan waited {
	ch := make(chan waited, 1)
	go func() {
		g, err := b.AcquireWait(ctx, lockReq(key, owner))
		ch <- waited{g, err}
	}()
	return ch
}

// grantLog checks that tokens are issued in strictly increasing order.
type grantLog struct {
	t    *testing.T
	seq  []driver.Token
	what []string
}

func (l *grantLog) add(what string, tok driver.Token) {
	l.t.Helper()
	if n := len(l.seq); n > 0 && tok <= l.seq[n-1] {
		l.t.Errorf("%s got token %d, not above the token %d issued before it (%s); grants so far: %v %v",
			what, tok, l.seq[n-1], l.what[n-1], l.what, l.seq)
	}
	l.seq = append(l.seq, tok)
	l.what = append(l.what, what)
}

// Tokens strictly increase in grant order when a waiter that queued before
// a rotation is granted the key and then released, and a waiter that queued
// after the rotation is granted next. The first waiter's grant re-puts its
// entry (its token must exceed the rotated one); that re-put must raise the
// key's marker too, or the second waiter, whose entry is newer than the old
// marker, keeps its create revision as its token: below the first waiter's.
// The same-owner variant settles the first waiter's grant with an Acquire
// retry (same Owner) instead of the confirming Renew.
func TestTokensNeverGoBackwardsAfterQueuedWaiterAndRotation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle func(ctx context.Context, b *Backend, g driver.Grant) (driver.Grant, error)
	}{
		{"ConfirmingRenew", func(ctx context.Context, b *Backend, g driver.Grant) (driver.Grant, error) {
			return b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL})
		}},
		{"SameOwnerAcquireRetry", func(ctx context.Context, b *Backend, g driver.Grant) (driver.Grant, error) {
			return b.Acquire(ctx, lockReq(g.Key, g.Owner))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			const key = "backwards"
			b1, b2, b3 := open(t), open(t), open(t)
			log := grantLog{t: t}

			// H1 holds; H2 queues.
			g1, err := b1.Acquire(ctx, lockReq(key, "h1"))
			if err != nil {
				t.Fatal(err)
			}
			log.add("h1 acquire", g1.Token)
			h2 := waitFor(ctx, b2, key, "h2")
			awaitQueue(t, b1, key, 2)

			// H1 rotates (the marker is written); then W queues, after it.
			if g1, err = b1.Renew(ctx, g1, driver.RenewRequest{TTL: fenceTTL, Rotate: true}); err != nil {
				t.Fatal(err)
			}
			log.add("h1 rotation", g1.Token)
			w := waitFor(ctx, b3, key, "w")
			awaitQueue(t, b1, key, 3)

			// H1 releases: H2 is granted and settles its token, holds
			// briefly (no rotation of its own), and releases.
			if err := b1.Release(ctx, g1); err != nil {
				t.Fatal(err)
			}
			r2 := <-h2
			if r2.err != nil {
				t.Fatal(r2.err)
			}
			g2, err := tc.settle(ctx, b2, r2.g)
			if err != nil {
				t.Fatal(err)
			}
			log.add("h2 grant", g2.Token)
			if again, err := b2.Renew(ctx, g2, driver.RenewRequest{TTL: fenceTTL}); err != nil || again.Token != g2.Token {
				t.Fatalf("h2's second Renew = %d, %v; want its token %d kept", again.Token, err, g2.Token)
			}
			if err := b2.Release(ctx, g2); err != nil {
				t.Fatal(err)
			}

			// W is granted and confirms.
			rw := <-w
			if rw.err != nil {
				t.Fatal(rw.err)
			}
			gw, err := b3.Renew(ctx, rw.g, driver.RenewRequest{TTL: fenceTTL})
			if err != nil {
				t.Fatal(err)
			}
			log.add("w grant", gw.Token)
			if err := b3.Release(ctx, gw); err != nil {
				t.Fatal(err)
			}

			// And a plain Acquire after all of them.
			g4, err := b1.Acquire(ctx, lockReq(key, "h4"))
			if err != nil {
				t.Fatal(err)
			}
			log.add("h4 acquire", g4.Token)
			if err := b1.Release(ctx, g4); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Through the engine: only the first holder rotates (RotateEvery); the
// others hold briefly. Holder 2 queues before holder 1's rotation, holder
// 3 after it. Every holder's token must be above the one before, and a
// late write by holder 2 (paused after its critical section) must be
// refused by the Fence once holder 3 has written.
func TestEngineTokensNeverGoBackwardsWithOneRotatingHolder(t *testing.T) {
	ctx := ctxT(t)
	const key = "engine-backwards"
	type rotation struct {
		owner string
		token fencelock.Token
	}
	rotated := make(chan rotation, 64)
	rot, err := fencelock.New(open(t), &fencelock.Options{
		TTL: fenceTTL, RenewInterval: 500 * time.Millisecond, RotateEvery: 500 * time.Millisecond,
		Observer: fencelock.ObserverFunc(func(e fencelock.Event) {
			if e.Kind == fencelock.EventRotated {
				select {
				case rotated <- rotation{e.Owner, e.Token}:
				default:
				}
			}
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rot.Close() })
	short2, short3 := client(t, open(t)), client(t, open(t))
	b := open(t)

	acquire := func(c *fencelock.Client) <-chan *fencelock.Lease {
		ch := make(chan *fencelock.Lease, 1)
		go func() {
			l, err := c.Acquire(ctx, key)
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			ch <- l
		}()
		return ch
	}
	var fence fencelock.Fence
	var last fencelock.Token
	granted := func(who string, l *fencelock.Lease) {
		t.Helper()
		if l.Token() <= last {
			t.Errorf("%s got token %d, not above the previous token %d", who, l.Token(), last)
		}
		last = l.Token()
		if err := fence.Admit(key, l); err != nil {
			t.Errorf("fence refused %s's write with token %d: %v", who, l.Token(), err)
		}
	}

	for round := range 3 {
		l1, err := rot.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		granted("holder 1", l1)
		q2 := acquire(short2)
		awaitQueue(t, b, key, 2)
		// Wait for a rotation of holder 1 after holder 2 queued.
		for len(rotated) > 0 {
			<-rotated
		}
		for r := (rotation{}); r.owner != l1.Owner(); {
			select {
			case r = <-rotated:
			case <-time.After(5 * fenceTTL):
				t.Fatalf("round %d: holder 1 did not rotate", round)
			}
		}
		granted("holder 1 (rotated)", l1)
		q3 := acquire(short3)
		awaitQueue(t, b, key, 3)
		if err := l1.Release(ctx); err != nil {
			t.Fatal(err)
		}

		l2 := <-q2
		if l2 == nil {
			t.FailNow()
		}
		granted("holder 2", l2)
		stale, staleOwner := l2.Token(), l2.Owner()
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l3 := <-q3
		if l3 == nil {
			t.FailNow()
		}
		granted("holder 3", l3)
		// Holder 2, paused after its critical section, writes late.
		if err := fence.Check(key, stale, staleOwner); !errors.Is(err, fencelock.ErrStaleToken) {
			t.Errorf("round %d: fence accepted holder 2's late write with token %d after holder 3 wrote with %d (err %v)",
				round, stale, l3.Token(), err)
		}
		if err := l3.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if t.Failed() {
			return
		}
	}
}
