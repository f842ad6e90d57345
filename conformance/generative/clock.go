package generative

import (
	"sync/atomic"
	"time"
)

// jumpClock is a client's Options.Clock: the harness's clock plus how
// far it has jumped ahead. The engine reads time through it alone, while
// its timers run on the harness's clock, so a jump is what a process
// paused or starved sees when it runs again: its clock moved on, and
// every timer it had armed fires late. A lease's Remaining() falls to 0
// before its timer has ended it, and a renewal's answer can be applied
// in between (ValidityNeverComesBack). The clock never goes back: a
// jump only shrinks what a holder believes, so a window of holding is
// still never wider than the holder's belief.
type jumpClock struct {
	ahead atomic.Int64 // nanoseconds
}

// Now returns the harness's clock plus the jumps so far.
func (c *jumpClock) Now() time.Time {
	return time.Now().Add(time.Duration(c.ahead.Load()))
}

// jump moves the clock forward by d.
func (c *jumpClock) jump(d time.Duration) { c.ahead.Add(int64(d)) }

// jumped records that client's clock jumps forward by d while the reply
// of op for owners is on its way (a fault of kind "jump"). Called before
// the clock moves, so that aheadOf is never below what the engine read.
func (r *recorder) jumped(client int, op string, owners []string, rotate bool, d time.Duration) {
	r.fault(client, op, "jump", owners, rotate)
	r.mu.Lock()
	if r.ahead == nil {
		r.ahead = make(map[int]time.Duration)
	}
	r.ahead[client] += d
	r.mu.Unlock()
	r.note("client %d's clock jumps %v ahead (its process paused with the reply of %s for %v on its way)", client, d, op, owners)
}

// aheadOf returns how far client's clock has jumped so far: an upper
// bound of how much earlier, by the harness's clock, anything the
// engine timed by its own clock (a minimum hold) ended. Called with
// r.mu held.
func (r *recorder) aheadOf(client int) time.Duration { return r.ahead[client] }
