package zookeeper

import (
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// TestGrantValidityLeavesRoomForAPartitionedFollower: acquired and renewed
// grants vouch for a third of the session timeout (Grant.Valid, see
// confirmedTTL), not the whole timeout: a follower cut off from its
// leader answers renewals while the leader expires the session, and only
// this bound keeps the holder's belief inside the leader's expiry (the
// safety suite's follower-partitioned cell on zookeeper3 measured a
// holder believing 154 ms after another was granted with the whole
// timeout). Their TTL stays the session timeout, how long the leader
// keeps a crashed holder's znode (the conformance suite's expiry bounds).
func TestGrantValidityLeavesRoomForAPartitionedFollower(t *testing.T) {
	ctx := t.Context()
	b, _ := open(t, testTTL)
	sess := b.SessionTimeout()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "validity/" + t.Name(), Owner: "v", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	checkValidity(t, "acquired", g, sess)
	for _, rotate := range []bool{false, true} {
		ng, err := b.Renew(ctx, g, driver.RenewRequest{TTL: testTTL, Rotate: rotate})
		if err != nil {
			t.Fatalf("Renew (rotate %v): %v", rotate, err)
		}
		checkValidity(t, fmt.Sprintf("renewed (rotate %v)", rotate), ng, sess)
		g = ng
	}
	res, err := b.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: testTTL})
	if err != nil || res[0].Err != nil {
		t.Fatalf("RenewBatch: %v %v", err, res)
	}
	checkValidity(t, "batch-renewed", res[0].Grant, sess)
}

func checkValidity(t *testing.T, what string, g driver.Grant, sess time.Duration) {
	t.Helper()
	if g.Valid != sess/3 {
		t.Errorf("%s Grant.Valid = %v; want a third of the %v session timeout", what, g.Valid, sess)
	}
	if g.TTL != sess {
		t.Errorf("%s Grant.TTL = %v; want the %v session timeout", what, g.TTL, sess)
	}
}
