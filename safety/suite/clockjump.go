package suite

import (
	"context"
	"fmt"

	"github.com/fencelock/fencelock/safety/report"
)

// FaultClockJump: the server's wall clock jumps forward by 2×TTL while a
// lock is held (Control.ClockJump). A backend that judges expiry by the
// server's clock (PostgreSQL's now(), Redis's PEXPIRE) then sees every
// lease expire early. It runs when named in Config.Faults.
const FaultClockJump = "server-clock-jump"

var clockJumpExpectation = report.Table{
	{Backend: "*", Fault: FaultClockJump, Expectation: report.Expectation{
		Unsafe:     true,
		Properties: []string{"P3", "P4"},
		Why: "Expiry is judged by the server's clock: when it jumps forward by more than the TTL, every lease it holds has " +
			"expired at once, and a waiting contender acquires while the holder still believes (its own monotonic clock " +
			"did not jump) until its next renewal is refused. The token sequence is untouched, so the fenced resource " +
			"refuses the old holder's writes once the new holder has written.",
		Fix: "Keep the server's clock from stepping (NTP slewing, not stepping; no manual date changes); pass the fencing " +
			"token with every write to the protected resource.",
	}},
}

func init() { expectations = append(expectations, clockJumpExpectation...) }

// clockJumpCell: once a fresh holder holds a lock, the server's clock
// jumps forward by 2×TTL (in each round; the jumps add up).
func clockJumpCell(be *backendEnv, ctl *Control, prof profile) cellSpec {
	ttl := be.ttl
	return cellSpec{fault: FaultClockJump, fencing: true, keys: 1, hold: ttl,
		setup: ctl.setup(FaultClockJump, fmt.Sprintf("the server's wall clock jumps forward by %v while a lock is held", 2*ttl)),
		run: func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.rounds {
				h, err := c.awaitHolder(ctx, 10*ttl)
				if err != nil {
					return i, err
				}
				if err := c.round("", fmt.Sprintf("server clock +%v while %s holds %s", 2*ttl, h.lease, h.key), func() error {
					return ctl.ClockJump(ctx, 2*ttl)
				}); err != nil {
					return i + 1, err
				}
				if err := between(ctx, i, prof.rounds, 2*ttl); err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		}}
}
