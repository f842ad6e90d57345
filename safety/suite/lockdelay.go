package suite

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/contender"
	"github.com/fencelock/fencelock/safety/history"
)

// fLockDelay is the lock-delay cell: a resource that does not check
// tokens, protected by the quiet gap of a lock delay instead.
const fLockDelay = "lock-delay-unfenced"

// FaultLockDelay is the lock-delay cell (Options.LockDelay): fencing off
// on the resource, every contender with a lock delay longer than a
// holder's pause; a holder paused between its lease check and its write
// for 2×TTL must see its late write land before the next holder's first.
// Not in DefaultFaults (it needs a backend that keeps a lock delay, and
// its delay lengthens every round): name it in Config.Faults.
const FaultLockDelay = fLockDelay

// lockDelayCell is the cell of FaultLockDelay, or why the backend cannot
// run it.
func lockDelayCell(be *backendEnv, prof profile) (cellSpec, string) {
	switch be.scheme {
	case "postgres", "postgresql", "redis", "mongodb", "etcd", "zk", "mem", "file":
	default:
		return cellSpec{}, be.scheme + ":// keeps no lock delay (driver.LockDelayUnsupported)"
	}
	ttl := be.ttl
	pause := 2 * ttl
	// The paused holder's record ends at most TTL after the pause began
	// and at least at it: with a delay past the pause plus slack, the key
	// is refused until well after the holder resumed and wrote.
	delay := pause + ttl + 2*be.slack
	var pauses []history.Event // the Pause event of each round
	return cellSpec{
		fault: fLockDelay, fencing: false, keys: 1,
		setup:    fmt.Sprintf("fenced resource with fencing off; LockDelay %v; holder paused between lease check and write for %v", delay, pause),
		checkTTL: ttl + delay, // a lost holder's key stays refused that long
		cooldown: delay + ttl + 2*be.slack,
		tailor: func(_ int, cfg *contender.Config) {
			cfg.LockDelay = delay
			cfg.AcquireTimeout = 5*ttl + delay
		},
		run: func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.rounds {
				h, err := c.awaitHolder(ctx, 10*ttl+delay)
				if err != nil {
					return i, err
				}
				var ev history.Event
				err = c.round(h.proc, fmt.Sprintf("holder paused between lease check and write for %v", pause), func() error {
					mark := c.log.mark()
					if err := c.send(h.proc, contender.Command{Op: contender.OpPauseBeforeWrite}); err != nil {
						return err
					}
					var err error
					ev, err = c.awaitEvent(ctx, 20*ttl, mark, "the contender's self-pause", func(e history.Event) bool {
						return e.Kind == history.Pause && e.Proc == h.proc
					})
					if err != nil {
						return err
					}
					p := c.proc(h.proc)
					if err := p.WaitStopped(ctx); err != nil {
						return err
					}
					if err := pace(ctx, pause); err != nil {
						return err
					}
					return p.Resume()
				})
				c.mu.Lock()
				c.rounds[len(c.rounds)-1].lease = ev.Lease
				c.mu.Unlock()
				pauses = append(pauses, ev)
				if err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		},
		after: func(c *cell, res check.Result) error {
			h := append(c.log.snapshot(), c.fence.Log()...) // writes are the fence's
			h.Sort()
			var errs []error
			gap := time.Duration(1<<63 - 1)
			proven := 0
			for _, p := range pauses {
				late, next, nextWrite := lateAndNext(h, p)
				switch {
				case late == nil:
					errs = append(errs, fmt.Errorf("lease %s paused at %d wrote nothing after its pause: the round shows nothing", p.Lease, p.T))
				case next == nil || nextWrite == nil:
					errs = append(errs, fmt.Errorf("no later lease of %s wrote after lease %s's pause: the round shows nothing", p.Key, p.Lease))
				case late.T >= nextWrite.T:
					errs = append(errs, fmt.Errorf("late write of paused lease %s (token %d) landed after the next holder %s's first write: the lock delay did not keep the key",
						p.Lease, late.Token, next.Lease))
				default:
					proven++
					gap = min(gap, time.Duration(next.T-late.T))
				}
			}
			p1, _ := res.Property("P1")
			c.spec.setup = fmt.Sprintf("fenced resource with fencing off; LockDelay %v; holder paused between lease check and write for %v; "+
				"in %d of %d rounds its late write landed before the next holder acquired (shortest quiet gap %v); P1 violations %d",
				delay, pause, proven, len(pauses), gap.Round(time.Millisecond), p1.Count)
			if len(pauses) == 0 {
				errs = append(errs, errors.New("no round ran"))
			}
			return errors.Join(errs...)
		},
	}, ""
}

// lateAndNext finds, after pause p (the paused lease's Pause event), the
// last write the paused lease sent, the next lease of its key acquired
// after the pause, and that lease's first write (nil where none).
func lateAndNext(h history.History, p history.Event) (late, next, nextWrite *history.Event) {
	for i := range h {
		e := &h[i]
		if e.T <= p.T {
			continue
		}
		switch {
		case e.Kind == history.Write && e.Lease == p.Lease:
			late = e
		case e.Kind == history.Acquired && e.Key == p.Key && e.Lease != p.Lease && next == nil:
			next = e
		case e.Kind == history.Write && next != nil && e.Lease == next.Lease && nextWrite == nil:
			nextWrite = e
		}
	}
	return late, next, nextWrite
}
