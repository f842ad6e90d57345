package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// fault is what faultKV does to one writing transaction.
type fault int

const (
	faultPass      fault = iota
	faultLoseReply       // applied by the server, reply lost
	faultUnsent          // fails before reaching the server
)

var errUnsent = errors.New("test: transaction failed before it reached the server")

// faultKV applies a plan of faults to the writing transactions it sees,
// one step each, in order; with the plan empty it passes them through.
// before, if set, runs once before the next read-only transaction.
type faultKV struct {
	clientv3.KV
	mu          sync.Mutex
	plan        []fault
	before      func() // once, before the next read-only transaction
	beforeWrite func() // once, before the next writing transaction
}

func (k *faultKV) arm(steps ...fault) {
	k.mu.Lock()
	k.plan = append(k.plan, steps...)
	k.mu.Unlock()
}

func (k *faultKV) left() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.plan)
}

func (k *faultKV) Txn(ctx context.Context) clientv3.Txn {
	return &hookTxn{Txn: k.KV.Txn(ctx), commit: k.commit}
}

func (k *faultKV) commit(writes bool, commit func() (*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	k.mu.Lock()
	step := faultPass
	var before func()
	if writes && len(k.plan) > 0 {
		step, k.plan = k.plan[0], k.plan[1:]
	}
	if !writes && k.before != nil {
		before, k.before = k.before, nil
	}
	if writes && k.beforeWrite != nil {
		before, k.beforeWrite = k.beforeWrite, nil
	}
	k.mu.Unlock()
	if before != nil {
		before()
	}
	switch step {
	case faultUnsent:
		return nil, errUnsent
	case faultLoseReply:
		if _, err := commit(); err != nil {
			return nil, err
		}
		return nil, errReplyLost
	}
	return commit()
}

// faultBackend returns a backend on other's prefix whose client applies
// faultKV's plan.
func faultBackend(t *testing.T, other *Backend) (*Backend, *faultKV) {
	t.Helper()
	fk := new(faultKV)
	b, _ := backendVia(t, other, func(kv clientv3.KV) clientv3.KV { fk.KV = kv; return fk })
	return b, fk
}

// queueDump lists key's queue in order: name=owner@createrev.
func queueDump(t *testing.T, b, of *Backend, key string) []string {
	t.Helper()
	resp, err := b.cli.Get(context.Background(), b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	var q []string
	for _, kv := range resp.Kvs {
		q = append(q, fmt.Sprintf("%s=%s@%d", strings.TrimPrefix(string(kv.Key), of.queuePrefix(key)), ownerOf(kv), kv.CreateRevision))
	}
	return q
}

// leaveGhost runs AcquireWait for owner on b with its put applied but its
// reply lost, and its clean-up failing before it reaches etcd: what a
// connection that drops for a moment leaves. The engine then retries
// AcquireWait with the same owner (acquireQueued).
func leaveGhost(t *testing.T, ctx context.Context, b *Backend, fk *faultKV, key, owner string) {
	t.Helper()
	fk.arm(faultLoseReply, faultUnsent)
	if _, err := b.AcquireWait(ctx, lockReq(key, owner)); err == nil || errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("AcquireWait with a lost reply = %v; want a transient error", err)
	}
	if n := fk.left(); n != 0 {
		t.Fatalf("%d faults not consumed", n)
	}
}

// TestRetryAfterTwoLostPutsFindsOldestEntry: two AcquireWait
// attempts of one owner, each whose put was applied with its reply lost
// and whose clean-up failed, leave two entries of the owner: the first
// attempt's slot was freed on failure, and the slot the second took was
// another (a waiter of the same backend had taken the first one in
// between). The engine's third attempt with the same owner must take the
// first entry's place (the oldest) and leave no other entry of the owner
// behind: queued behind its own older entry it waits for an entry that the
// backend's own lease keeps alive, and so does every waiter behind it.
func TestRetryAfterTwoLostPutsFindsOldestEntry(t *testing.T) {
	ctx := ctxT(t)
	other := open(t)
	b, fk := faultBackend(t, other)
	const key, owner = "review2-two-ghosts", "O"
	h, err := other.Acquire(ctx, lockReq(key, "holder"))
	if err != nil {
		t.Fatal(err)
	}
	// Attempt 1: slot 0.
	leaveGhost(t, ctx, b, fk, key, owner)
	// B queues on the same backend: slot 0 is taken by O's entry, so
	// B ends up on slot 1 and keeps slot 0 reserved while it waits.
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	bw := waitFor(bctx, b, key, "B")
	awaitQueue(t, other, key, 3)
	// Attempt 2: slot 2.
	leaveGhost(t, ctx, b, fk, key, owner)
	awaitQueue(t, other, key, 4)
	t.Logf("queue before the retry: %v", queueDump(t, other, b, key))

	// Attempt 3, the engine's retry with the same owner.
	actx, acancel := context.WithTimeout(ctx, 4*fenceTTL)
	defer acancel()
	aw := waitFor(actx, b, key, owner)
	if err := other.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	r := <-aw
	if r.err != nil {
		t.Fatalf("the retry of AcquireWait by %q = %v after the holder released; want granted at the first entry's place (queue now %v)", owner, r.err, queueDump(t, other, b, key))
	}
	g, err := b.Renew(ctx, r.g, driver.RenewRequest{TTL: fenceTTL})
	if err != nil {
		t.Fatalf("confirmation: %v", err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	br := <-bw
	if br.err != nil {
		t.Fatalf("B after O's release: %v", br.err)
	}
	if err := b.Release(ctx, br.g); err != nil {
		t.Fatal(err)
	}
	if info, err := other.Inspect(ctx, key); err != nil || info.Locked() {
		t.Errorf("after O and B released Inspect = %+v, %v; want the key free (queue %v)", info, err, queueDump(t, other, b, key))
	}
}

// TestAcquireRetryOfQueuedEntryIsAboveFloor: an Acquire by an owner
// whose earlier AcquireWait left an entry in the queue (behind another
// holder) takes the retry path once that entry is at the head. A floor
// raised while the entry waited must still be below the token: RaiseFloor
// relies on every grant of a revision below the floor key's being
// re-put (AcquireWait does that; Acquire's retry path looks at the marker
// only). With a7b38e8 the entry need not even be at the head when the
// compare fails.
func TestAcquireRetryOfQueuedEntryIsAboveFloor(t *testing.T) {
	// queued: the holder releases only between Acquire's failed compare
	// and its read of the head (possible since a7b38e8: before it, the
	// head read with the compare was the holder, a HeldError).
	for _, queued := range []bool{false, true} {
		t.Run(fmt.Sprintf("queued-at-compare=%v", queued), func(t *testing.T) {
			ctx := ctxT(t)
			other := open(t)
			b, fk := faultBackend(t, other)
			const key, owner = "review2-floor", "O"
			h, err := other.Acquire(ctx, lockReq(key, "holder"))
			if err != nil {
				t.Fatal(err)
			}
			leaveGhost(t, ctx, b, fk, key, owner)
			awaitQueue(t, other, key, 2)
			hw, err := other.HighWater(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			floor := hw.Global + 1000
			if err := other.RaiseFloor(ctx, "", floor); err != nil {
				t.Fatal(err)
			}
			release := func() {
				if err := other.Release(ctx, h); err != nil {
					t.Error(err)
				}
			}
			if queued {
				fk.mu.Lock()
				fk.before = release
				fk.mu.Unlock()
			} else {
				release()
			}
			g, err := b.Acquire(ctx, lockReq(key, owner))
			if err != nil {
				t.Fatalf("Acquire by %q whose entry is at the head: %v", owner, err)
			}
			if g.Token <= floor {
				t.Errorf("Acquire after RaiseFloor(%d) returned token %d", floor, g.Token)
			}
			if g, err = b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL}); err != nil {
				t.Fatal(err)
			}
			if g.Token <= floor {
				t.Errorf("the confirmed grant's token %d is not above the floor %d", g.Token, floor)
			}
			_ = b.Release(ctx, g)
		})
	}
}

// TestHeldErrorAcrossChangeBeforeHeadRead (a7b38e8): between the
// failed compare and the read-only transaction the holder releases, a new
// holder takes the key and the floor is raised with a new segment. The
// HeldError names the new holder with the token it was granted (mapped
// through the floor as read by the read-only transaction), and a second
// variant with the key left free reports a HeldError with no holder.
func TestHeldErrorAcrossChangeBeforeHeadRead(t *testing.T) {
	ctx := ctxT(t)
	other := open(t)
	b, fk := faultBackend(t, other)
	const key = "review2-headread"
	h, err := other.Acquire(ctx, lockReq(key, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	var h2 driver.Grant
	fk.mu.Lock()
	fk.before = func() {
		if err := other.Release(ctx, h); err != nil {
			t.Error(err)
		}
		hw, err := other.HighWater(ctx, "")
		if err != nil {
			t.Error(err)
			return
		}
		if err := other.RaiseFloor(ctx, "", hw.Global+5000); err != nil {
			t.Error(err)
		}
		if h2, err = other.Acquire(ctx, lockReq(key, "h2")); err != nil {
			t.Error(err)
		}
	}
	fk.mu.Unlock()
	_, err = b.Acquire(ctx, lockReq(key, "x"))
	var held *driver.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Acquire = %v; want a HeldError", err)
	}
	if held.Holder.Owner != "h2" || held.Holder.Token != h2.Token {
		t.Errorf("HeldError names %+v; want h2 with token %d", held.Holder, h2.Token)
	}
	if err := other.Release(ctx, h2); err != nil {
		t.Fatal(err)
	}

	// The key freed in the gap: not acquired, no holder named. (Another
	// key: this one is hot now, and would be read first.)
	const key2 = key + "-2"
	h3, err := other.Acquire(ctx, lockReq(key2, "h3"))
	if err != nil {
		t.Fatal(err)
	}
	fk.mu.Lock()
	fk.before = func() {
		if err := other.Release(ctx, h3); err != nil {
			t.Error(err)
		}
	}
	fk.mu.Unlock()
	_, err = b.Acquire(ctx, lockReq(key2, "y"))
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire = %v; want ErrNotAcquired", err)
	}
	if errors.As(err, &held) && held.Holder.Owner != "" {
		t.Errorf("HeldError names %+v; want no holder", held.Holder)
	}
	for _, k := range []string{key, key2} {
		if got := slotsInUse(b, k); len(got) != 0 {
			t.Errorf("slot table of %q after a failed Acquire: %v; want none", k, got)
		}
	}
}

// TestSlotFreedWhenBumpFindsEntryGone: a rotating Renew whose
// entry is deleted (force-release, expiry) between its check read and its
// re-put answers ErrNotHeld; the engine then forgets the grant without
// releasing it (lose with ErrNotHeld; the loss watch that would free the
// slot is stopped by lose, or not started yet), so the slot must be freed
// here, as lostEntry does when the read itself finds the entry gone.
func TestSlotFreedWhenBumpFindsEntryGone(t *testing.T) {
	ctx := ctxT(t)
	other := open(t)
	b, fk := faultBackend(t, other)
	const key = "review2-bump-gone"
	g, err := b.Acquire(ctx, lockReq(key, "o"))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	fk.mu.Lock()
	fk.beforeWrite = func() {
		ran = true
		if _, err := other.ForceRelease(ctx, key); err != nil {
			t.Error(err)
		}
	}
	fk.mu.Unlock()
	_, err = b.Renew(ctx, g, driver.RenewRequest{TTL: fenceTTL, Rotate: true})
	if !ran {
		t.Fatal("the re-put was never sent")
	}
	if !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Renew = %v; want ErrNotHeld", err)
	}
	if got := slotsInUse(b, key); len(got) != 0 {
		t.Errorf("after the grant's entry was found gone the slot table holds %v; want none", got)
	}
}
