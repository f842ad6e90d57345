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
	// Release batches need three releases of one client at once (a lane
	// keeps two requests in flight): a few per budget of programs, so a
	// budget that formed none is followed by up to two more.
	var acq, rel, programs int64
	for range 3 {
		var store *memory.Store
		stats := Run(t, conformance.Harness{
			Open: func(context.Context) (driver.Backend, error) { return store.Backend(), nil },
			TTL:  3 * time.Second,
		}, &Options{SyncTest: true, Keys: 8, Fresh: func() { store = memory.NewStore() }, Budget: 20 * time.Second, programs: 500})
		acq, rel, programs = acq+stats.AcquireBatches, rel+stats.ReleaseBatches, programs+stats.Programs
		if acq > 0 && rel > 0 {
			return
		}
	}
	t.Errorf("%d programs formed %d acquire batches and %d release batches of two or more; want some of each", programs, acq, rel)
}
