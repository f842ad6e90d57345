package etcd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// slotsInUse returns the slots of key that b's slot table holds reserved,
// by owner.
func slotsInUse(b *Backend, key string) []string {
	b.slots.mu.Lock()
	defer b.slots.mu.Unlock()
	var out []string
	for _, o := range b.slots.keys[key] {
		if o != "" {
			out = append(out, o)
		}
	}
	return out
}

// TestTryAcquireFailuresDoNotLeakSlots: the engine's
// TryAcquire on a key another client holds, whose transaction's reply is
// lost (what a timeout or a dropped connection looks like), is cleaned up
// by the engine's abandon (Inspect, then Release only if its owner holds
// the key). Every such attempt uses a fresh owner, so a slot reserved
// "for a retry by the same owner" is never freed: the slot table must not
// grow with the number of failed attempts.
func TestTryAcquireFailuresDoNotLeakSlots(t *testing.T) {
	ctx := ctxT(t)
	other := open(t)
	b, lossy := lossyBackend(t, other)
	const key = "review-leak"
	h, err := other.Acquire(ctx, lockReq(key, "holder"))
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, b)
	const n = 20
	for i := range n {
		lossy.drop.Store(true)
		if _, err := c.TryAcquire(ctx, key); err == nil {
			t.Fatalf("attempt %d: TryAcquire of a held key succeeded", i)
		}
		if lossy.drop.Load() {
			t.Fatalf("attempt %d sent no transaction (the key was read first)", i)
		}
	}
	if got := slotsInUse(b, key); len(got) != 0 {
		t.Errorf("after %d failed TryAcquire calls (each cleaned up by the engine) the slot table holds %d slots of %q reserved: %v; want none", n, len(got), key, got)
	}
	if err := other.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	// The leaked slots push the names of later acquisitions up: the next
	// acquisition does not reuse slot 0.
	l, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	resp, err := other.cli.Get(ctx, b.queuePrefix(key), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != b.queuePrefix(key)+b.slotName(0) {
		var names []string
		for _, kv := range resp.Kvs {
			names = append(names, strings.TrimPrefix(string(kv.Key), b.queuePrefix(key)))
		}
		t.Errorf("the next acquisition's entry is %v; want slot 0 (%s)", names, b.slotName(0))
	}
}

// TestEarlierVersionEntryReleasedAfterRenew: an entry written by the
// previous version (named escape(owner), value the owner alone, no NUL)
// and its grant (Handle: the lease id alone) are, per doc.go, found by
// token. Renewing that grant returns a Handle that now carries the
// entry's name; releasing with the renewed grant must remove the entry.
func TestEarlierVersionEntryReleasedAfterRenew(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	cli := rawClient(t, b)
	const key, owner = "review-oldver", "old-owner"
	lr, err := cli.Grant(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, b.queuePrefix(key)+escape(owner), owner, clientv3.WithLease(lr.ID)); err != nil {
		t.Fatal(err)
	}
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Owner != owner {
		t.Fatalf("Inspect = %+v, %v; want the earlier version's entry", info, err)
	}
	old := driver.Grant{Key: key, Owner: owner, Token: info.Token, Handle: strconv.FormatInt(int64(lr.ID), 16)}
	g, err := b.Renew(ctx, old, driver.RenewRequest{TTL: fenceTTL})
	if err != nil {
		t.Fatalf("Renew of the earlier version's grant: %v", err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Errorf("Release of the renewed grant (Handle %q) = %v; want nil", g.Handle, err)
	}
	if now, err := b.Inspect(ctx, key); err != nil || now.Locked() {
		t.Errorf("after the holder's Release Inspect = %+v, %v; want the key free", now, err)
	}
}

// TestWaiterRetryDoesNotQueueBehindItsOwnEntry: a waited grant
// whose settling re-put (the floor was raised after it queued) loses its
// reply leaves the owner's entry at the head under its name, and the
// backend's own clean-up (Release with the provisional token) is answered
// "not held" and frees the slot anyway. Meanwhile another waiter of the
// same backend reserves that slot (finds it taken, moves on). The
// engine's retry of AcquireWait with the same owner must find its own
// entry (as it did when entries were named by owner), not queue a second
// entry behind it: that one waits for an entry the backend's own lease
// keeps alive.
func TestWaiterRetryDoesNotQueueBehindItsOwnEntry(t *testing.T) {
	ctx := ctxT(t)
	other := open(t)
	b, lossy := lossyBackend(t, other)
	const key, owner = "review-self", "A"
	h, err := other.Acquire(ctx, lockReq(key, "holder"))
	if err != nil {
		t.Fatal(err)
	}
	first := waitFor(ctx, b, key, owner)
	awaitQueue(t, other, key, 2)
	// A floor raise after A queued: A's grant is settled by a re-put.
	// (A floor just above the tokens issued so far: the floor key is
	// rewritten, so its revision is above A's entry's.)
	hw, err := other.HighWater(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.RaiseFloor(ctx, "", hw.Global+1); err != nil {
		t.Fatal(err)
	}
	lossy.drop.Store(true)
	if err := other.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	r := <-first
	if r.err == nil || errors.Is(r.err, driver.ErrNotHeld) || lossy.drop.Load() {
		t.Fatalf("AcquireWait whose settling re-put lost its reply = %+v, %v (drop still armed: %v); want a transient error", r.g, r.err, lossy.drop.Load())
	}
	info, err := other.Inspect(ctx, key)
	if err != nil || info.Owner != owner {
		t.Fatalf("Inspect = %+v, %v; want %q's re-put entry at the head", info, err, owner)
	}
	// Another waiter of the same backend.
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	second := waitFor(bctx, b, key, "B")
	awaitQueue(t, other, key, 2)
	// The engine's retry: AcquireWait again with the same owner. Its own
	// entry is at the head, so it is granted at once; queued behind it,
	// it would wait until its context ends.
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	w := <-waitFor(actx, b, key, owner)
	if w.err != nil {
		resp, err := other.cli.Get(ctx, b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			t.Fatal(err)
		}
		var q []string
		for _, kv := range resp.Kvs {
			q = append(q, fmt.Sprintf("%s=%s@%d", strings.TrimPrefix(string(kv.Key), b.queuePrefix(key)), ownerOf(kv), kv.CreateRevision))
		}
		t.Fatalf("the retry of AcquireWait by %q = %v; want its own entry granted (queue %v)", owner, w.err, q)
	}
	if _, err := b.Renew(ctx, w.g, driver.RenewRequest{TTL: fenceTTL}); err != nil {
		t.Fatalf("the retry's confirmation: %v", err)
	}
	n, err := other.cli.Get(ctx, b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if n.Count != 2 {
		t.Errorf("queue after the retry's grant: %d entries; want 2 (the retry's and B's)", n.Count)
	}
	if err := b.Release(ctx, w.g); err != nil {
		t.Fatal(err)
	}
	bcancel()
	<-second
}

// TestForgedHandleNameDoesNotBlockSweep: a Release with a forged
// Handle whose name etcd refuses (too large a request) must not keep a
// genuine failed release from being swept: the orphan sweep deletes every
// pending entry in one transaction.
func TestForgedHandleNameDoesNotBlockSweep(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	const key = "review-sweep"
	g, err := b.Acquire(ctx, lockReq(key, "o"))
	if err != nil {
		t.Fatal(err)
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Release(dead, g); err == nil {
		t.Fatal("Release with a cancelled context succeeded")
	}
	forged := driver.Grant{Key: "review-forged", Owner: "x", Token: g.Token, Handle: "1:" + strings.Repeat("n", 1<<20+600<<10)}
	err = b.Release(ctx, forged)
	if !errors.Is(err, driver.ErrNotHeld) {
		t.Logf("Release with a forged 1.6MB name = %.200v; want ErrNotHeld", err)
	}
	b.sweep(ctx)
	if info, err := b.Inspect(ctx, key); err != nil || info.Locked() {
		t.Errorf("after a sweep Inspect = %+v, %v; want the failed release of %q completed", info, err, key)
	}
}

// TestOwnerPrefixCannotRelease: the owner compare (a value range) is
// exact: a grant whose owner is a proper prefix of the holder's, or the
// holder's owner extended, with the holder's handle and token, neither
// renews nor releases the holder's entry.
func TestOwnerPrefixCannotRelease(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	const key = "review-prefix"
	req := lockReq(key, "owner-ab")
	req.Metadata = []byte("meta")
	g, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"owner-a", "owner-", "owner-abc", "owner-ab "} {
		f := g
		f.Owner = o
		if _, err := b.Renew(ctx, f, driver.RenewRequest{TTL: fenceTTL}); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Renew as %q = %v; want ErrNotHeld", o, err)
		}
		if err := b.Release(ctx, f); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Release as %q = %v; want ErrNotHeld", o, err)
		}
	}
	if info, err := b.Inspect(ctx, key); err != nil || info.Owner != g.Owner || info.Token != g.Token {
		t.Fatalf("Inspect = %+v, %v; want the holder untouched", info, err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
}

// TestForgedHandleNamesStayInQueue: handles naming other entries of
// the same queue, the key's marker or another key's entries (through names
// that a path would resolve: "..", escapes) change nothing.
func TestForgedHandleNamesStayInQueue(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	const key, otherKey = "review-forge", "review-forge/x"
	g, err := b.Acquire(ctx, lockReq(key, "holder"))
	if err != nil {
		t.Fatal(err)
	}
	og, err := b.Acquire(ctx, lockReq(otherKey, "other"))
	if err != nil {
		t.Fatal(err)
	}
	lease, _, _ := strings.Cut(g.Handle, ":")
	oname := mustName(t, og)
	for _, name := range []string{"..", ".", "%2Fx/" + oname, "%2Fx%2F" + oname, oname, "", ":" + oname, b.id + ".-1", b.id + ".1"} {
		for _, f := range []driver.Grant{
			{Key: key, Owner: og.Owner, Token: og.Token, Handle: lease + ":" + name},
			{Key: key, Owner: g.Owner, Token: og.Token, Handle: lease + ":" + name},
		} {
			if _, err := b.Renew(ctx, f, driver.RenewRequest{TTL: fenceTTL, Rotate: true}); !errors.Is(err, driver.ErrNotHeld) {
				t.Errorf("Renew with handle %q, owner %q = %v; want ErrNotHeld", f.Handle, f.Owner, err)
			}
			if err := b.Release(ctx, f); !errors.Is(err, driver.ErrNotHeld) {
				t.Errorf("Release with handle %q, owner %q = %v; want ErrNotHeld", f.Handle, f.Owner, err)
			}
		}
	}
	for _, want := range []driver.Grant{g, og} {
		if info, err := b.Inspect(ctx, want.Key); err != nil || info.Owner != want.Owner || info.Token != want.Token {
			t.Errorf("Inspect(%q) = %+v, %v; want %q with token %d untouched", want.Key, info, err, want.Owner, want.Token)
		}
	}
	for _, x := range []driver.Grant{g, og} {
		if err := b.Release(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAcquireLostReplyThenWaitFindsOwnEntry: Acquire on a free key
// whose reply is lost (the put took effect) keeps its slot for the owner;
// the engine's next step with the same owner, AcquireWait, finds that
// entry (one entry, same token) instead of queueing behind it, and the
// slot is free once the grant is released.
func TestAcquireLostReplyThenWaitFindsOwnEntry(t *testing.T) {
	ctx := ctxT(t)
	other := open(t)
	b, lossy := lossyBackend(t, other)
	const key, owner = "review-lost-acquire", "A"
	lossy.drop.Store(true)
	if _, err := b.Acquire(ctx, lockReq(key, owner)); err == nil || lossy.drop.Load() {
		t.Fatalf("Acquire with its reply lost = %v; want a transient error after the put", err)
	}
	info, err := other.Inspect(ctx, key)
	if err != nil || info.Owner != owner {
		t.Fatalf("Inspect = %+v, %v; want %q holding", info, err, owner)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*fenceTTL)
	defer cancel()
	g, err := b.AcquireWait(wctx, lockReq(key, owner))
	if err != nil {
		t.Fatalf("AcquireWait by the same owner: %v", err)
	}
	if g.Token != info.Token {
		t.Errorf("AcquireWait's token %d; want the entry's %d", g.Token, info.Token)
	}
	if n := queueLen(t, other, key); n != 1 {
		t.Errorf("queue has %d entries; want 1", n)
	}
	if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL}); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if got := slotsInUse(b, key); len(got) != 0 {
		t.Errorf("after the release the slot table holds %v; want none", got)
	}
}
