package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// TestSlotTable: a slot is reserved for one owner at a time, the lowest
// free one first; an owner asking again gets the slot it holds; only its
// holder frees it; takeNew gives an owner a second slot.
func TestSlotTable(t *testing.T) {
	var st slotTable
	if a, b := st.take("k", "a"), st.take("k", "b"); a != 0 || b != 1 {
		t.Fatalf("take a, b = %d, %d; want 0, 1", a, b)
	}
	if got := st.take("k", "a"); got != 0 {
		t.Fatalf("take a again = %d; want the slot it holds, 0", got)
	}
	if got := st.take("other", "c"); got != 0 {
		t.Fatalf("take on another key = %d; want 0", got)
	}
	st.free("k", 0, "b") // not b's: nothing happens
	if got := st.take("k", "c"); got != 2 {
		t.Fatalf("take c after a stranger's free = %d; want 2", got)
	}
	st.free("k", 0, "a")
	if got := st.take("k", "d"); got != 0 {
		t.Fatalf("take d after a's free = %d; want 0", got)
	}
	if got := st.takeNew("k", "d"); got != 3 {
		t.Fatalf("takeNew d = %d; want 3", got)
	}
	for i, o := range []string{"d", "b", "c", "d"} {
		st.free("k", i, o)
	}
	st.free("other", 0, "c")
	if len(st.keys) != 0 {
		t.Fatalf("after every slot was freed the table holds %v; want nothing", st.keys)
	}
}

// putNames returns how often each entry name was put in key's queue
// between revisions from and to.
func putNames(t *testing.T, ctx context.Context, cli *clientv3.Client, b *Backend, key string, from, to int64) map[string]int {
	t.Helper()
	names := make(map[string]int)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for resp := range cli.Watch(wctx, b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if err := resp.Err(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.PUT {
				names[strings.TrimPrefix(string(ev.Kv.Key), b.queuePrefix(key))]++
			}
			if ev.Kv.ModRevision >= to {
				return names
			}
		}
	}
	t.Fatal("watch ended early")
	return nil
}

// TestEntryNamesAreReused: acquisitions with fresh owners (as the engine
// makes them, one per lease) put their entries under the same few names,
// so that etcd's index of the key's queue does not grow with every
// acquisition until a compaction. One contender at a time takes one name;
// a holder and a waiter of one backend take two.
func TestEntryNamesAreReused(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	cli := rawClient(t, b)
	const key = "reuse"
	start, err := cli.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		g, err := b.Acquire(ctx, lockReq(key, fmt.Sprintf("acq-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		w, err := b.AcquireWait(ctx, lockReq(key, fmt.Sprintf("wait-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	mid, err := cli.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if got := putNames(t, ctx, cli, b, key, start.Header.Revision+1, mid.Header.Revision); len(got) != 1 {
		t.Fatalf("40 acquisitions one after the other put entries under %d names %v; want 1", len(got), got)
	}
	// A holder and a waiter at a time, handing over 10 times.
	holder, err := b.Acquire(ctx, lockReq(key, "h-0"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		ch := waitFor(ctx, b, key, fmt.Sprintf("h-%d", i+1))
		awaitQueue(t, b, key, 2)
		if err := b.Release(ctx, holder); err != nil {
			t.Fatal(err)
		}
		w := <-ch
		if w.err != nil {
			t.Fatal(w.err)
		}
		holder = w.g
	}
	if err := b.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	end, err := cli.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if got := putNames(t, ctx, cli, b, key, mid.Header.Revision+1, end.Header.Revision); len(got) != 2 {
		t.Fatalf("10 hand-offs between a holder and a waiter put entries under %d names %v; want 2", len(got), got)
	}
}

// TestStaleGrantCannotTouchReusedName: once a grant is released, the next
// acquisition of its backend takes the same name; the old grant, and a
// grant that pairs the new one's handle and token with another owner,
// neither renew nor rotate nor release the new holder's entry.
func TestStaleGrantCannotTouchReusedName(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	const key = "stale"
	old, err := b.Acquire(ctx, lockReq(key, "first"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, old); err != nil {
		t.Fatal(err)
	}
	cur, err := b.Acquire(ctx, lockReq(key, "second"))
	if err != nil {
		t.Fatal(err)
	}
	on, _ := handleName(old.Handle)
	cn, _ := handleName(cur.Handle)
	if on == "" || on != cn {
		t.Fatalf("entry names %q then %q; want the same name reused", on, cn)
	}
	forged := []struct {
		what string
		g    driver.Grant
	}{
		{"the released grant", old},
		{"the released grant with the new handle", driver.Grant{Key: key, Owner: old.Owner, Token: old.Token, Handle: cur.Handle}},
		{"the new handle and token with the old owner", driver.Grant{Key: key, Owner: old.Owner, Token: cur.Token, Handle: cur.Handle}},
		{"the new token with the old owner and no handle", driver.Grant{Key: key, Owner: old.Owner, Token: cur.Token}},
	}
	for _, f := range forged {
		for _, rotate := range []bool{false, true} {
			if _, err := b.Renew(ctx, f.g, driver.RenewRequest{TTL: fenceTTL, Rotate: rotate}); !errors.Is(err, driver.ErrNotHeld) {
				t.Errorf("Renew (Rotate %v) of %s = %v; want ErrNotHeld", rotate, f.what, err)
			}
		}
		if err := b.Release(ctx, f.g); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Release of %s = %v; want ErrNotHeld", f.what, err)
		}
	}
	info, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Owner != cur.Owner || info.Token != cur.Token {
		t.Fatalf("after the stale calls Inspect = %+v; want %q holding with token %d", info, cur.Owner, cur.Token)
	}
	if _, err := b.Renew(ctx, cur, driver.RenewRequest{TTL: fenceTTL}); err != nil {
		t.Fatalf("the holder's Renew: %v", err)
	}
	if err := b.Release(ctx, cur); err != nil {
		t.Fatalf("the holder's Release: %v", err)
	}
}

// TestNameTakenByStaleEntry: an entry left under one of a backend's names
// by another owner (here put by an operator, as a failed release could
// leave one) is never overwritten or deleted by the backend's next
// acquisitions: Acquire reports it as the holder, a waiter queues under
// another name behind it and is granted once it goes.
func TestNameTakenByStaleEntry(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	cli := rawClient(t, b)
	const key = "taken"
	lr, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	stale := b.queuePrefix(key) + b.slotName(0)
	put, err := cli.Put(ctx, stale, entryValue("stranger", nil), clientv3.WithLease(lr.ID))
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, lockReq(key, "acq"))
	if he := (*driver.HeldError)(nil); !errors.As(err, &he) || he.Holder.Owner != "stranger" {
		t.Fatalf("Acquire with a stranger's entry under the backend's name = %v; want held by stranger", err)
	}
	queued := cli.Watch(ctx, b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithRev(put.Header.Revision+1), clientv3.WithFilterDelete())
	ch := waitFor(ctx, b, key, "waiter")
	ev := <-queued
	if err := ev.Err(); err != nil || len(ev.Events) == 0 {
		t.Fatalf("watching the queue: %v", err)
	}
	if k := string(ev.Events[0].Kv.Key); k == stale {
		t.Fatalf("the waiter put its entry under the stranger's name %q", k)
	}
	got, err := cli.Get(ctx, stale)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 1 || got.Kvs[0].ModRevision != put.Header.Revision || ownerOf(got.Kvs[0]) != "stranger" {
		t.Fatalf("the stranger's entry after the waiter queued: %v; want it untouched at revision %d", got.Kvs, put.Header.Revision)
	}
	select {
	case w := <-ch:
		t.Fatalf("the waiter returned %+v, %v while the stranger holds the key", w.g, w.err)
	default:
	}
	if _, err := cli.Delete(ctx, stale); err != nil {
		t.Fatal(err)
	}
	w := <-ch
	if w.err != nil {
		t.Fatal(w.err)
	}
	if n, _ := handleName(w.g.Handle); n == b.slotName(0) {
		t.Fatalf("the waiter's grant names the stranger's entry %q", n)
	}
	if _, err := b.Renew(ctx, w.g, driver.RenewRequest{TTL: fenceTTL}); err != nil {
		t.Fatalf("the waiter's Renew: %v", err)
	}
	if err := b.Release(ctx, w.g); err != nil {
		t.Fatal(err)
	}
}

// TestLossWatchOnReusedName: a holder whose entry is removed is told so
// once, not again when the next holder under the same name is removed,
// and that next holder's watch, on the same name, tells it of its own
// removal.
func TestLossWatchOnReusedName(t *testing.T) {
	ctx := ctxT(t)
	b := open(t)
	other := open(t)
	const key = "lossname"
	first, err := b.Acquire(ctx, lockReq(key, "first"))
	if err != nil {
		t.Fatal(err)
	}
	lost1 := make(chan error, 2)
	stop1 := b.NotifyLoss(first, func(err error) { lost1 <- err })
	defer stop1()
	if _, err := other.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := <-lost1; !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("first holder's loss = %v; want ErrNotHeld", err)
	}
	second, err := b.Acquire(ctx, lockReq(key, "second"))
	if err != nil {
		t.Fatal(err)
	}
	if n1, _ := handleName(first.Handle); n1 != mustName(t, second) {
		t.Fatalf("names %q then %q; want the same name reused", n1, mustName(t, second))
	}
	lost2 := make(chan error, 1)
	stop2 := b.NotifyLoss(second, func(err error) { lost2 <- err })
	defer stop2()
	if _, err := other.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := <-lost2; !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("second holder's loss = %v; want ErrNotHeld", err)
	}
	select {
	case err := <-lost1:
		t.Fatalf("the first holder was told of a loss twice (%v)", err)
	default:
	}
}

func mustName(t *testing.T, g driver.Grant) string {
	t.Helper()
	n, ok := handleName(g.Handle)
	if !ok {
		t.Fatalf("grant %+v carries no entry name", g)
	}
	return n
}
