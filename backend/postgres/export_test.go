package postgres

import (
	"time"

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

// MaxHeldHints is maxHeldHints.
const MaxHeldHints = maxHeldHints

// SetHeldHint sets or clears key's held hint, which picks the statement
// b's next Acquire of key sends: acquire if set, acquireFree if not.
func SetHeldHint(b *Backend, key string, held bool) { b.held.note(key, held) }

// HeldHint reports whether key's held hint is set.
func HeldHint(b *Backend, key string) bool { return b.held.has(key) }

// HeldHints is the number of keys with a held hint.
func HeldHints(b *Backend) int {
	b.held.mu.Lock()
	defer b.held.mu.Unlock()
	return len(b.held.keys)
}

// SetListenPingEvery sets how long the LISTEN connection may stay silent
// before it is pinged, until the test ends.
func SetListenPingEvery(t interface{ Cleanup(func()) }, d time.Duration) {
	old := listenPingEvery
	listenPingEvery = d
	t.Cleanup(func() { listenPingEvery = old })
}

// ListenConnecting reports whether b's LISTEN connection is being
// established.
func ListenConnecting(b *Backend) bool { return len(b.lis.connecting) > 0 }
