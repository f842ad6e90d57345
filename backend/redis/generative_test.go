package redis_test

import (
	"context"
	"testing"
	"time"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/driver"
)

// TestGenerative runs the generative conformance mode (random programs,
// faults at the driver boundary, histories checked with a fence in the
// loop) against a real Redis.
func TestGenerative(t *testing.T) {
	url := withPrefix(testURL(t), uniquePrefix(t))
	generative.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) { return fencelockredis.Open(ctx, url) },
		TTL:  time.Second,
	}, nil)
}
