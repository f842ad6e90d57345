package zookeeper

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/driver"
)

// TestGenerative runs the generative conformance mode (random programs,
// faults at the driver boundary, histories checked with a fence in the
// loop) against a real ZooKeeper.
func TestGenerative(t *testing.T) {
	u := testURL(t)
	generative.Run(t, conformance.Harness{
		Open:  func(ctx context.Context) (driver.Backend, error) { return Open(ctx, u) },
		TTL:   testTTL,
		Crash: func(b driver.Backend) { b.(*Backend).crash() },
	}, nil)
}
