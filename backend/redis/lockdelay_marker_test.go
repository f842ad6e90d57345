package redis_test

import (
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// A batch renewal (RenewBatch), with or without a token rotation, keeps
// the lock-delay marker its record's new TTL plus the delay ahead, as a
// single Renew does: otherwise a holder renewed by batches would leave,
// when it crashed, a marker that ran out before its record, and no gap.
func TestRenewBatchMovesLockDelayMarker(t *testing.T) {
	for _, rotate := range []bool{false, true} {
		b, rdb := open(t)
		ctx := t.Context()
		const delay = 3 * time.Second
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "a", TTL: time.Second, LockDelay: delay})
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: 20 * time.Second, Rotate: rotate})
		if err != nil || res[0].Err != nil {
			t.Fatalf("RenewBatch = %v, %v", res, err)
		}
		marker := "{" + b.Prefix() + ":k}:ended"
		pttl, err := rdb.PTTL(ctx, marker).Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := 20*time.Second + delay - time.Second; pttl < want {
			t.Errorf("rotate=%v: marker PTTL after RenewBatch(20s) = %v; want at least %v (record TTL plus delay)", rotate, pttl, want)
		}
	}
}
