package etcd

import (
	"context"
	"errors"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// hookKV runs a hook once, before the first Get of a given etcd key: the
// window between acquire's transaction and its separate read of the
// rotation marker (the retry path since the Else branch lost that read).
type hookKV struct {
	clientv3.KV
	mu   sync.Mutex
	key  string
	hook func()
}

func (k *hookKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.mu.Lock()
	var h func()
	if key == k.key && k.hook != nil {
		h, k.hook = k.hook, nil
	}
	k.mu.Unlock()
	if h != nil {
		h()
	}
	return k.KV.Get(ctx, key, opts...)
}

// An Acquire retry by the owner whose own entry was re-put by its own
// rotation (so the marker's revision is the entry's): the same grant
// comes back with the rotated token, never the entry's create revision
// (which a Fence that saw the rotated token would refuse), and the grant
// is held: a plain Renew keeps it. Catches a retry path that takes the
// create revision as the token, or that compares the marker with the
// entry's create revision (it would bump needlessly; caught by the
// token staying put).
func TestAcquireRetryAfterOwnRotationKeepsRotatedToken(t *testing.T) {
	ctx := ctxT(t)
	const key = "retry-own-rotation"
	b := open(t)
	log := grantLog{t: t}
	g, err := b.Acquire(ctx, lockReq(key, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	log.add("h1 acquire", g.Token)
	for range 2 {
		if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL, Rotate: true}); err != nil {
			t.Fatal(err)
		}
		log.add("h1 rotation", g.Token)
	}
	r, err := b.Acquire(ctx, lockReq(key, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Token != g.Token {
		t.Fatalf("retry after own rotation returned token %d; want the rotated token %d", r.Token, g.Token)
	}
	if again, err := b.Renew(ctx, r, driver.RenewRequest{TTL: fenceTTL}); err != nil || again.Token != r.Token {
		t.Fatalf("Renew of the retried grant = %d, %v; want %d kept", again.Token, err, r.Token)
	}
	// With other metadata the retry re-puts: a new, higher token.
	req := lockReq(key, "h1")
	req.Metadata = []byte("v2")
	r2, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	log.add("h1 retry with new metadata", r2.Token)
	if _, err := b.Renew(ctx, r2, driver.RenewRequest{TTL: fenceTTL}); err != nil {
		t.Fatalf("Renew of the re-put grant: %v", err)
	}
	if _, err := b.Renew(ctx, r, driver.RenewRequest{TTL: fenceTTL}); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Renew of the grant from before the re-put: %v; want ErrNotHeld", err)
	}
	if err := b.Release(ctx, r2); err != nil {
		t.Fatal(err)
	}
	g2, err := b.Acquire(ctx, lockReq(key, "h2"))
	if err != nil {
		t.Fatal(err)
	}
	log.add("h2 acquire", g2.Token)
}

// In the new window between the retry's transaction (which finds the
// owner's entry at the head) and its read of the marker, an operator
// force-releases the key and another client takes it and rotates (the
// marker moves past the retrying owner's entry). The retry must not hand
// back a grant: its guarded re-put finds the entry gone. Then a grant
// that a Fence has seen (h2's rotated token) is never followed by a
// lower one from the retry.
func TestAcquireRetryRacingTakeoverBeforeMarkerRead(t *testing.T) {
	for _, md := range []string{"", "other"} {
		t.Run("metadata="+md, func(t *testing.T) {
			ctx := ctxT(t)
			const key = "retry-takeover"
			other := open(t)
			cli := rawClient(t, other)
			hk := &hookKV{KV: cli.KV}
			cli.KV = hk
			b, err := New(ctx, cli, &Options{Prefix: other.prefix})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			log := grantLog{t: t}

			g1, err := b.Acquire(ctx, lockReq(key, "h1"))
			if err != nil {
				t.Fatal(err)
			}
			log.add("h1 acquire", g1.Token)
			var g2 driver.Grant
			hk.mu.Lock()
			hk.key = b.markerKey(key)
			hk.hook = func() {
				if _, err := other.ForceRelease(ctx, key); err != nil {
					t.Error(err)
					return
				}
				var err error
				if g2, err = other.Acquire(ctx, lockReq(key, "h2")); err != nil {
					t.Error(err)
					return
				}
				log.add("h2 acquire", g2.Token)
				if g2, err = other.Renew(ctx, g2, driver.RenewRequest{TTL: fenceTTL, Rotate: true}); err != nil {
					t.Error(err)
					return
				}
				log.add("h2 rotation", g2.Token)
			}
			hk.mu.Unlock()

			req := lockReq(key, "h1")
			if md != "" {
				req.Metadata = []byte(md)
			}
			r, err := b.Acquire(ctx, req)
			if t.Failed() {
				t.FailNow()
			}
			if g2.Token == 0 {
				t.Fatal("the hook did not run: the retry did not read the marker")
			}
			if err == nil {
				t.Fatalf("retry returned grant %+v after h2 took the key over (h2's token %d)", r, g2.Token)
			}
			if !errors.Is(err, driver.ErrNotHeld) {
				t.Logf("retry error: %v", err)
			}
			if info, err := other.Inspect(ctx, key); err != nil || info.Owner != "h2" || info.Token != g2.Token {
				t.Fatalf("Inspect = %+v, %v; want h2 holding with %d", info, err, g2.Token)
			}
		})
	}
}
