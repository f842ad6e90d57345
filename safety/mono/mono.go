// Package mono reads the system-wide monotonic clock (CLOCK_MONOTONIC).
//
// Go's time.Now carries a monotonic reading too, but it is relative to the
// process and cannot be compared across processes. The safety harness
// needs one clock that every contender process, the fenced resource and
// the harness itself read, so that their events can be ordered; the
// system under test never reads it.
package mono

import "golang.org/x/sys/unix"

// Now returns CLOCK_MONOTONIC in nanoseconds: the same clock for every
// process on the machine, never going backwards, not affected by changes
// of the wall clock.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC is always available on Linux; a failure here
		// means the harness cannot order events at all.
		panic("mono: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}
