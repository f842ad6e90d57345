package generative

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
)

// The generative mode exercises coalescing: on the memory backend (a
// driver.BatchAcquirer and driver.BatchReleaser), a budget of programs
// has clients whose workers' acquire attempts and releases the engine
// sends in batches of two or more, through the fault-injecting driver's
// batch hooks. Without them (the driver hiding the capabilities, or no
// program with several workers on one client) the checks would never
// see a coalesced call.
func TestProgramsFormBatches(t *testing.T) {
	var store *memory.Store
	stats := Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) { return store.Backend(), nil },
		TTL:  3 * time.Second,
	}, &Options{SyncTest: true, Fresh: func() { store = memory.NewStore() }, Budget: 20 * time.Second, programs: 300})
	if stats.AcquireBatches == 0 || stats.ReleaseBatches == 0 {
		t.Errorf("%d programs formed %d acquire batches and %d release batches of two or more; want some of each", stats.Programs, stats.AcquireBatches, stats.ReleaseBatches)
	}
}
