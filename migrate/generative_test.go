package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/conformance/generative"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/migrate"
)

// TestGenerativeMemory runs the generative mode on a Dual of two memory
// stores, every program in a synctest bubble: the dual backend's own
// interleavings (one side answers, the other fails or is late; rotations
// that take effect on one side only) under random programs and faults.
func TestGenerativeMemory(t *testing.T) {
	var old, new *memory.Store
	generative.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) {
			return migrate.NewDual(old.Backend(), new.Backend())
		},
		TTL: 3 * time.Second,
	}, &generative.Options{SyncTest: true, Fresh: func() { old, new = memory.NewStore(), memory.NewStore() }})
}

// TestGenerativeRedisPostgres runs the generative mode on a Dual of the
// real Redis and PostgreSQL servers: the configuration a fleet runs
// during the middle phase of a migration.
func TestGenerativeRedisPostgres(t *testing.T) {
	w := newWorld(t)
	generative.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) {
			b, _, err := fencelock.OpenBackend(ctx, w.url(phase2))
			return b, err
		},
		TTL: time.Second,
	}, nil)
}
