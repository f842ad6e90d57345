package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// vouching is a memory backend that keeps its records for the TTL asked
// but vouches for only valid of it (driver.Grant.Valid), as ZooKeeper
// does.
type vouching struct {
	*memory.Backend
	valid time.Duration
}

func (v vouching) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := v.Backend.Acquire(ctx, req)
	g.Valid = v.valid
	return g, err
}

func (v vouching) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	ng, err := v.Backend.Renew(ctx, g, req)
	ng.Valid = v.valid
	return ng, err
}

// TestDualGrantKeepsTheShorterValidity: a dual grant vouches for no longer
// than either side does (driver.Grant.Valid), whichever side it is, so a
// holder migrating to or from ZooKeeper keeps the validity bound that a
// follower cut off from its leader requires. Catches a Dual that drops a
// side's Valid (reporting only the smaller TTL).
func TestDualGrantKeepsTheShorterValidity(t *testing.T) {
	const valid = time.Second
	for _, c := range []struct {
		name     string
		old, new driver.Backend
	}{
		{"old vouches less", vouching{memory.New(), valid}, memory.New()},
		{"new vouches less", memory.New(), vouching{memory.New(), valid}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			d := mustDual(t, c.old, c.new)
			g, err := d.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "dual", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if g.Valid != valid {
				t.Errorf("acquired dual Grant.Valid = %v; want the %v one side vouches for", g.Valid, valid)
			}
			ng, err := d.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if ng.Valid != valid {
				t.Errorf("renewed dual Grant.Valid = %v; want the %v one side vouches for", ng.Valid, valid)
			}
		})
	}
}
