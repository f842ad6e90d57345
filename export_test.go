package fencelock

// SchedulerPokes reports how many wakes c has sent its scheduler.
func SchedulerPokes(c *Client) uint64 { return c.pokes.Load() }

// CoalesceStats reports the batches of two or more that c sent: acquire
// batches and their members, release batches and their members.
func CoalesceStats(c *Client) (acqBatches, acqMembers, relBatches, relMembers uint64) {
	return c.coalesceStats()
}

// CoalesceInFlight is how many requests or batches a lane keeps in
// flight before calls queue.
const CoalesceInFlight = maxInFlight
