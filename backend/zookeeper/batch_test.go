package zookeeper

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// TestRenewBatch: a rotating batch gives every grant a higher token in one
// multi, a stale grant in a batch gets ErrNotHeld alone, and a plain batch
// keeps the tokens.
func TestRenewBatch(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, testTTL)
	var gs []driver.Grant
	for i := range 50 {
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: fmt.Sprintf("batch/%s/%d", t.Name(), i), Owner: "o", TTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	stale := gs[3]
	res, err := b.RenewBatch(ctx, gs, driver.RenewRequest{TTL: testTTL, Rotate: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Grant.Token <= gs[i].Token {
			t.Fatalf("%d: %v %d %d", i, r.Err, r.Grant.Token, gs[i].Token)
		}
		gs[i] = r.Grant
	}
	gs[3] = stale
	res, err = b.RenewBatch(ctx, gs, driver.RenewRequest{TTL: testTTL, Rotate: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if (i == 3) != (r.Err != nil) {
			t.Fatalf("rotating batch with one stale grant: result %d: %v", i, r.Err)
		}
		if i != 3 {
			gs[i] = r.Grant
		}
	}
	res, err = b.RenewBatch(ctx, gs, driver.RenewRequest{TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if (i == 3) != (r.Err != nil) {
			t.Fatalf("plain batch with one stale grant: result %d: %v", i, r.Err)
		}
		if i != 3 && r.Grant.Token != gs[i].Token {
			t.Fatalf("plain renewal changed token %d -> %d", gs[i].Token, r.Grant.Token)
		}
	}
}

// TestRenewBatchSeesDeletion: the one-read batch renewal (armed loss
// watches) still answers ErrNotHeld for a znode deleted just before.
func TestRenewBatchSeesDeletion(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, testTTL)
	admin, _ := open(t, testTTL)
	var gs []driver.Grant
	for i := range 20 {
		g, err := b.Acquire(ctx, driver.AcquireRequest{Key: fmt.Sprintf("batchdel/%s/%d", t.Name(), i), Owner: "o", TTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
		defer b.NotifyLoss(g, func(error) {})()
	}
	time.Sleep(4 * lossWatchDelay) // the watches are armed
	for round := range 3 {
		victim := 5 + round
		if _, err := admin.ForceRelease(ctx, gs[victim].Key); err != nil {
			t.Fatal(err)
		}
		res, err := b.RenewBatch(ctx, gs, driver.RenewRequest{TTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			gone := i >= 5 && i <= victim
			if gone != errors.Is(r.Err, driver.ErrNotHeld) || !gone && r.Err != nil {
				t.Fatalf("round %d: result %d = %v; want ErrNotHeld only for force-released grants", round, i, r.Err)
			}
		}
	}
}
