package fencelock

// SchedulerPokes reports how many wakes c has sent its scheduler.
func SchedulerPokes(c *Client) uint64 { return c.pokes.Load() }
