package suite

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/contender"
	"github.com/fencelock/fencelock/safety/history"
)

// coalescedKeys is the number of keys of the coalesced cell: enough that
// most of a client's workers find a free key and acquire side by side
// (the engine coalesces calls on different keys only), few enough that
// the three clients' workers meet on every key.
const coalescedKeys = 16

// coalescedWorkers is the number of workers (Config.Workers) of
// contender n of the coalesced cell: 8, 10 or 12, in turn.
func coalescedWorkers(n int) int { return 8 + 2*((n-1)%3) }

// coalescedCell exercises the engine's coalescing: three contenders of
// 8, 10 and 12 workers each (loops of acquire, hold, release on one
// client) on coalescedKeys keys, so that a client's calls meet in
// flight and go to the store together (driver.BatchAcquirer: one
// statement or pipeline for many acquire attempts; BatchReleaser the
// same for releases), each member with its own answer. An answer
// delivered to the wrong member is two holders of one key (P3), and a
// write of one of them accepted after the other's (P1). Each profile
// round pauses a holder between its lease check and its write until
// another lease of its key has written (every lease of its client
// expires meanwhile, and its workers resume together), then kills a
// holder (SIGKILL) and starts a new contender in its place, whose
// workers start together. after fails the cell unless acquisitions and
// releases were coalesced, and unless no lease was lost but the paused
// client's from its pause on.
func coalescedCell(be *backendEnv, prof profile) cellSpec {
	ttl := be.ttl
	var paused []string // the contenders the rounds paused
	return cellSpec{fault: fCoalesced, fencing: true, keys: coalescedKeys, procs: 3,
		tailor: func(n int, cfg *contender.Config) { cfg.Workers = coalescedWorkers(n) },
		run: func(ctx context.Context, c *cell) (int, error) {
			if _, err := c.awaitEvent(ctx, 20*ttl, 0, "a coalesced acquisition", func(e history.Event) bool {
				return e.Kind == history.BatchAcquire && e.N >= 2 && e.Err == ""
			}); err != nil {
				return 0, err
			}
			for i := range prof.rounds {
				// Two rounds marked per profile round: the pause, the kill.
				h, err := c.pauseHolder(ctx, "holder of a coalescing client paused between lease check and write")
				paused = append(paused, h.proc)
				if err != nil {
					return 2*i + 1, err
				}
				if h, err = c.awaitHolder(ctx, 10*ttl); err != nil {
					return 2*i + 1, err
				}
				if err := c.killAndAwaitRetake(ctx, h, "holder of a coalescing client kill -9", "the killed holder's key taken again", i, prof.rounds); err != nil {
					return 2*i + 2, err
				}
			}
			return 2 * prof.rounds, nil
		},
		after: func(c *cell, res check.Result) error {
			st := res.Stats
			c.spec.setup = fmt.Sprintf("3 clients of %d, %d and %d workers on %d keys; %d coalesced acquisitions (up to %d attempts in one), "+
				"%d coalesced releases (up to %d); a holder paused between lease check and write, then a holder killed (SIGKILL) and replaced",
				coalescedWorkers(1), coalescedWorkers(2), coalescedWorkers(3), coalescedKeys,
				st.BatchAcquires, st.MaxAcquireBatch, st.BatchReleases, st.MaxReleaseBatch)
			var errs []error
			if st.BatchAcquires == 0 {
				errs = append(errs, errors.New("coalescing not exercised: no batch of acquire attempts"))
			}
			if st.BatchReleases == 0 {
				errs = append(errs, errors.New("coalescing not exercised: no batch of releases"))
			}
			// Only a paused client's leases may be lost, and only from
			// its pause on: any other loss was dropped by the engine or
			// the backend (a member's grant or release gone astray).
			if len(c.rounds) > 0 && !c.be.rules.Lookup(c.be.name, c.spec.fault).Unsafe {
				for _, e := range c.log.snapshot() {
					if e.Kind == history.Lost && (!slices.Contains(paused, e.Proc) || e.T < c.rounds[0].from) {
						errs = append(errs, fmt.Errorf("lease %s of %s (%s) lost without a fault: %s", e.Lease, e.Key, e.Proc, e.Err))
						break
					}
				}
			}
			return errors.Join(errs...)
		},
	}
}
