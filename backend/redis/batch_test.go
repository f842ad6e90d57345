package redis_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// A SCRIPT FLUSH before a batch (a restart, a failover to a server that
// never saw the scripts) makes every EVALSHA of its pipeline answer
// NOSCRIPT without running: the batch sends those again with EVAL, and
// every member still gets its own answer, once.
func TestBatchesAfterScriptFlush(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	held := acquire(t, b, "held", "holder", time.Minute)
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := b.AcquireBatch(ctx, []driver.AcquireRequest{
		{Key: "a", Owner: "oa", TTL: time.Minute},
		{Key: "held", Owner: "ob", TTL: time.Minute},
		{Key: "c", Owner: "oc", TTL: time.Minute},
	})
	if err != nil {
		t.Fatalf("AcquireBatch after SCRIPT FLUSH: %v", err)
	}
	if res[0].Err != nil || res[0].Grant.Key != "a" || res[2].Err != nil || res[2].Grant.Key != "c" || !errors.Is(res[1].Err, driver.ErrNotAcquired) {
		t.Fatalf("AcquireBatch after SCRIPT FLUSH = %+v; want a granted, held refused, c granted", res)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	stale := held
	stale.Token++
	errs, err := b.ReleaseBatch(ctx, []driver.Grant{res[0].Grant, stale, res[2].Grant})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], driver.ErrNotHeld) || errs[2] != nil {
		t.Fatalf("ReleaseBatch after SCRIPT FLUSH = %v, %v; want nil, ErrNotHeld, nil", errs, err)
	}
	if info, err := b.Inspect(ctx, "held"); err != nil || info.Owner != "holder" {
		t.Fatalf("held after a stale release in a batch: %+v, %v", info, err)
	}
}
