package postgres

import (
	"github.com/fencelock/fencelock/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RenewPool returns the pool renewals use.
func RenewPool(b *Backend) *pgxpool.Pool { return b.renewPool }

// LaneState reports, for the renewal lane of req, whether a statement is
// in flight and how many grants the members of the gathering group that
// are still waiting hold.
func LaneState(b *Backend, req driver.RenewRequest) (busy bool, gathering int) {
	c := &b.batches
	c.mu.Lock()
	defer c.mu.Unlock()
	lane := c.lanes[batchKind{req.TTL, req.Rotate}]
	if lane == nil {
		return false, 0
	}
	if g := lane.next; g != nil {
		for _, m := range g.members {
			if !m.gone {
				gathering += len(m.grants)
			}
		}
	}
	return lane.busy, gathering
}
