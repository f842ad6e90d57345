package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
)

// awaitT polls cond (an observation of state that another goroutine
// changes, with no event to wait on) until it holds, failing after a
// generous bound.
func awaitT(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// lockRow takes key's row lock in a transaction of its own, so that a
// renewal statement touching key blocks until unlock is called.
func lockRow(t *testing.T, b *postgres.Backend, table, key string) (unlock func()) {
	t.Helper()
	ctx := ctxT(t)
	tx, err := b.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM "`+table+`" WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	done := false
	unlock = func() {
		if !done {
			done = true
			_ = tx.Rollback(context.Background())
		}
	}
	t.Cleanup(unlock)
	return unlock
}

type batchOutcome struct {
	res []driver.RenewResult
	err error
}

func renewBatchAsync(ctx context.Context, b *postgres.Backend, g driver.Grant, req driver.RenewRequest) <-chan batchOutcome {
	ch := make(chan batchOutcome, 1)
	go func() {
		res, err := b.RenewBatch(ctx, []driver.Grant{g}, req)
		ch <- batchOutcome{res, err}
	}()
	return ch
}

func acquireKeys(t *testing.T, b *postgres.Backend, keys ...string) []driver.Grant {
	t.Helper()
	out := make([]driver.Grant, len(keys))
	for i, k := range keys {
		g, err := b.Acquire(ctxT(t), driver.AcquireRequest{Key: k, Owner: "owner-" + k, TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = g
	}
	return out
}

// waitingOn reports how many statements on table wait for a lock.
func waitingOn(t *testing.T, b *postgres.Backend, table string) int {
	t.Helper()
	var n int
	err := b.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM pg_stat_activity
  WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND position($1 in query) > 0`, table).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The defect: a RenewBatch call that joined a gathering group and whose
// context ended before the group was sent returned its context's error
// (for the engine, a failed renewal: it keeps the old token and retries),
// yet the group's statement still renewed and rotated its grant. The
// caller never learned the new token, so its retry was refused (ErrNotHeld)
// and the lease lost, though nobody else held the key.
func TestRenewBatchCoalescerRotatesNoMemberWhoseContextEnded(t *testing.T) {
	base := testURL(t)
	table := uniqueTable(t, base)
	b := openT(t, withParams(t, base, "table", table))
	ctx := ctxT(t)
	req := driver.RenewRequest{TTL: time.Minute, Rotate: true}
	gs := acquireKeys(t, b, "block", "stays", "leaves")
	block, stays, leaves := gs[0], gs[1], gs[2]

	// A statement in flight that cannot finish until unblock.
	unblock := lockRow(t, b, table, block.Key)
	r0 := renewBatchAsync(ctx, b, block, req)
	awaitT(t, "the first statement in flight", func() bool { busy, _ := postgres.LaneState(b, req); return busy })
	// Two more calls gather behind it.
	r1 := renewBatchAsync(ctx, b, stays, req)
	awaitT(t, "the first member to gather", func() bool { _, n := postgres.LaneState(b, req); return n == 1 })
	leaveCtx, leave := context.WithCancel(ctx)
	defer leave()
	r2 := renewBatchAsync(leaveCtx, b, leaves, req)
	awaitT(t, "the second member to gather", func() bool { _, n := postgres.LaneState(b, req); return n == 2 })

	// The second member's caller gives up before the group is sent.
	leave()
	if o := <-r2; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("RenewBatch whose context ended = %+v, %v; want context.Canceled", o.res, o.err)
	}
	unblock()
	for _, r := range []<-chan batchOutcome{r0, r1} {
		if o := <-r; o.err != nil || o.res[0].Err != nil {
			t.Fatalf("live member's RenewBatch = %+v, %v", o.res, o.err)
		}
	}

	// The departed caller's record is as it left it: same token, and its
	// retry with that token renews.
	info, err := b.Inspect(ctx, leaves.Key)
	if err != nil || info.Owner != leaves.Owner || info.Token != leaves.Token {
		t.Fatalf("Inspect(%q) = %+v, %v; want owner %q still at token %d (the statement rotated for a caller that was gone)", leaves.Key, info, err, leaves.Owner, leaves.Token)
	}
	res, err := b.RenewBatch(ctx, []driver.Grant{leaves}, req)
	if err != nil || res[0].Err != nil || res[0].Grant.Token <= leaves.Token {
		t.Fatalf("retry with the token the caller holds = %+v, %v; want a rotated renewal", res, err)
	}
}

func TestRenewBatchCoalescerGroupWhoseMembersAllLeftFreesTheLane(t *testing.T) {
	base := testURL(t)
	table := uniqueTable(t, base)
	b := openT(t, withParams(t, base, "table", table))
	ctx := ctxT(t)
	req := driver.RenewRequest{TTL: time.Minute, Rotate: true}
	gs := acquireKeys(t, b, "block", "leaves")
	block, leaves := gs[0], gs[1]

	unblock := lockRow(t, b, table, block.Key)
	r0 := renewBatchAsync(ctx, b, block, req)
	awaitT(t, "the first statement in flight", func() bool { busy, _ := postgres.LaneState(b, req); return busy })
	leaveCtx, leave := context.WithCancel(ctx)
	r1 := renewBatchAsync(leaveCtx, b, leaves, req)
	awaitT(t, "the member to gather", func() bool { _, n := postgres.LaneState(b, req); return n == 1 })
	leave()
	if o := <-r1; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("RenewBatch whose context ended = %+v, %v; want context.Canceled", o.res, o.err)
	}
	unblock()
	if o := <-r0; o.err != nil || o.res[0].Err != nil {
		t.Fatalf("first RenewBatch = %+v, %v", o.res, o.err)
	}
	awaitT(t, "the lane to be free", func() bool { busy, _ := postgres.LaneState(b, req); return !busy })
	if info, err := b.Inspect(ctx, leaves.Key); err != nil || info.Token != leaves.Token {
		t.Fatalf("Inspect(%q) = %+v, %v; want token %d unchanged", leaves.Key, info, err, leaves.Token)
	}
	res, err := b.RenewBatch(ctx, []driver.Grant{leaves}, req)
	if err != nil || res[0].Err != nil {
		t.Fatalf("later RenewBatch = %+v, %v", res, err)
	}
}
