package conformance_test

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// TestMemory runs the suite on the memory backend with every capability.
func TestMemory(t *testing.T) {
	store := memory.NewStore()
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) { return store.Backend(), nil },
	})
}

// TestMemoryWithoutCapabilities runs the suite on the memory backend with
// its optional capabilities hidden.
func TestMemoryWithoutCapabilities(t *testing.T) {
	store := memory.NewStore()
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) { return plain(store.Backend()), nil },
	})
}

// plain hides every optional capability of b, so the suite also covers
// the engine's fallbacks: polling with backoff instead of notifications,
// one renewal per lease instead of batches, loss found by renewal
// instead of pushed.
func plain(b driver.Backend) driver.Backend { return fakebackend.New(b, fakebackend.Plain).Backend() }
