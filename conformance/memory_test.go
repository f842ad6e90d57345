package conformance_test

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
)

// TestMemory runs the suite on the memory backend with every capability.
func TestMemory(t *testing.T) {
	store := memory.NewStore()
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) { return store.Backend(), nil },
	})
}

// plain hides every optional capability of a backend, so the suite also
// covers the engine's fallbacks: polling with backoff instead of
// notifications, one renewal per lease instead of batches, loss found by
// renewal instead of pushed.
type plain struct{ driver.Backend }

// TestMemoryWithoutCapabilities runs the suite on the memory backend with
// its optional capabilities hidden.
func TestMemoryWithoutCapabilities(t *testing.T) {
	store := memory.NewStore()
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) { return plain{store.Backend()}, nil },
	})
}
