package fencelock

// SetRWTestHookEntered sets the hook a reader runs after it got the gate
// and before it takes a slot; the returned function removes it.
func SetRWTestHookEntered(f func(gate *Lease)) (restore func()) {
	rwTestHookEntered = f
	return func() { rwTestHookEntered = nil }
}

// SchedulerPokes reports how many wakes c has sent its scheduler.
func SchedulerPokes(c *Client) uint64 { return c.pokes.Load() }
