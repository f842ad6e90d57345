package zookeeper

import (
	"testing"

	"github.com/fencelock/fencelock/driver"
)

// TestGrantValidityLeavesRoomForAPartitionedFollower: acquired and renewed
// grants report a third of the session timeout as their TTL (see
// confirmedTTL), not the whole timeout: a follower cut off from its
// leader answers renewals while the leader expires the session, and only
// this bound keeps the holder's belief inside the leader's expiry (the
// safety suite's follower-partitioned cell on zookeeper3 measured a
// holder believing 154 ms after another was granted with the whole
// timeout).
func TestGrantValidityLeavesRoomForAPartitionedFollower(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, testTTL)
	sess := b.SessionTimeout()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "validity/" + t.Name(), Owner: "v", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if g.TTL != sess/3 {
		t.Errorf("acquired Grant.TTL = %v; want a third of the %v session timeout", g.TTL, sess)
	}
	for _, rotate := range []bool{false, true} {
		ng, err := b.Renew(ctx, g, driver.RenewRequest{TTL: testTTL, Rotate: rotate})
		if err != nil {
			t.Fatalf("Renew (rotate %v): %v", rotate, err)
		}
		if ng.TTL != sess/3 {
			t.Errorf("renewed (rotate %v) Grant.TTL = %v; want a third of the %v session timeout", rotate, ng.TTL, sess)
		}
		g = ng
	}
	res, err := b.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: testTTL})
	if err != nil || res[0].Err != nil {
		t.Fatalf("RenewBatch: %v %v", err, res)
	}
	if res[0].Grant.TTL != sess/3 {
		t.Errorf("batch-renewed Grant.TTL = %v; want a third of the %v session timeout", res[0].Grant.TTL, sess)
	}
}
