package nats

import (
	"os"
	"testing"
	"time"

	"github.com/fencelock/fencelock/conformance/generative"
)

// TestGenerative runs the generative conformance mode (random programs,
// faults at the driver boundary, histories checked with a fence in the
// loop) against a real NATS server: 30 s, or FENCELOCK_GEN_BUDGET.
func TestGenerative(t *testing.T) {
	var o generative.Options
	if os.Getenv("FENCELOCK_GEN_BUDGET") == "" {
		o.Budget = 30 * time.Second
	}
	generative.Run(t, harness(testURL(t), nil), &o)
}
