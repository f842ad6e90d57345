package etcd

import (
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// A grant released before its loss watch would start (most short critical
// sections) costs NotifyLoss and its stop no context: no timer of a
// bounded token mapping and no child of the backend's context, which
// every grant of the backend would register under one lock. The bound is
// the allocations of what remains (the delay's timer, the closures and
// the stop's state): 5, where the two contexts made it 14.
func TestLossNotificationStoppedEarlyMakesNoContext(t *testing.T) {
	b := open(t)
	ctx := t.Context()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "notify-cost", Owner: "o", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx, g)
	allocs := testing.AllocsPerRun(200, func() {
		stop := b.NotifyLoss(g, func(error) { t.Error("loss reported for a held grant") })
		stop()
	})
	if allocs > maxNotifyAllocs {
		t.Errorf("NotifyLoss+stop allocated %.0f times; want at most %d (a context per grant is back?)", allocs, maxNotifyAllocs)
	}
}

// maxNotifyAllocs is what NotifyLoss+stop of a grant in the floor cache
// allocates without its contexts.
const maxNotifyAllocs = 5
