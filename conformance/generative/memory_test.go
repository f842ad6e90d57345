package generative_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// TestMemory runs the generative mode on the memory backend, every
// program in a testing/synctest bubble: time is fake, so programs that
// hold, expire and crash run in microseconds and many fit the budget.
func TestMemory(t *testing.T) {
	var store *memory.Store
	generative.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) { return store.Backend(), nil },
		TTL:  3 * time.Second,
	}, &generative.Options{SyncTest: true, Pauses: true, Fresh: func() { store = memory.NewStore() }})
}

// TestMemoryWithoutCapabilities runs the generative mode on the memory
// backend with its capabilities hidden.
func TestMemoryWithoutCapabilities(t *testing.T) {
	var store *memory.Store
	generative.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) {
			return fakebackend.New(store.Backend(), fakebackend.Plain).Backend(), nil
		},
		TTL: 3 * time.Second,
	}, &generative.Options{SyncTest: true, Pauses: true, Fresh: func() { store = memory.NewStore() }})
}
