package mongo

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// serverClock estimates the server's wall clock from the localTime field
// of its hello reply, so that expiry is judged by one clock (the server's)
// for every client instead of by each client's own wall clock.
//
// A sample is taken by sending hello at local monotonic time s and
// receiving the reply at r; the server read its clock somewhere in [s, r].
// The estimate takes the midpoint, so its error is at most (r−s)/2 plus
// localTime's 1ms resolution, plus the drift between the two clocks' rates
// since the sample (re-sampled every ClockResync). Of several samples the
// one with the smallest round trip wins. The estimate runs on this
// process's monotonic clock, so a step of the local wall clock (NTP, an
// operator) changes nothing.
type serverClock struct {
	db     *mongo.Database
	resync time.Duration

	mu      sync.Mutex // guards the fields below
	base    time.Time  // local reading (with monotonic part) at the sample
	server  time.Time  // server's clock at base
	bound   time.Duration
	sampled time.Time // when the estimate was last refreshed

	refresh sync.Mutex // held by the goroutine refreshing the estimate
}

// sample measures the offset with n hello round trips and keeps the
// tightest.
func (c *serverClock) sample(ctx context.Context, n int) error {
	var (
		best      time.Duration = -1
		bestBase  time.Time
		bestSrv   time.Time
		lastError error
	)
	for range n {
		var reply struct {
			LocalTime bson.DateTime `bson:"localTime"`
		}
		s := time.Now()
		err := c.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&reply)
		r := time.Now()
		if err != nil {
			lastError = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if reply.LocalTime == 0 {
			lastError = errors.New("mongo: hello reply has no localTime: cannot read the server's clock")
			continue
		}
		rtt := r.Sub(s)
		if best < 0 || rtt < best {
			best = rtt
			bestBase = s.Add(rtt / 2)
			bestSrv = reply.LocalTime.Time()
		}
	}
	if best < 0 {
		return lastError
	}
	c.mu.Lock()
	c.base, c.server, c.bound, c.sampled = bestBase, bestSrv, best/2+time.Millisecond, time.Now()
	c.mu.Unlock()
	return nil
}

// now returns the estimated server time. When the estimate is older than
// resync, one caller refreshes it with a single hello (others keep using
// the old estimate meanwhile); a failed refresh keeps the old estimate.
func (c *serverClock) now(ctx context.Context) time.Time {
	c.mu.Lock()
	stale := time.Since(c.sampled) >= c.resync
	c.mu.Unlock()
	if stale && c.refresh.TryLock() {
		_ = c.sample(ctx, 1)
		c.refresh.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.server.Add(time.Since(c.base))
}

// Bound returns the error bound of the last sample: half its round trip
// plus localTime's 1ms resolution.
func (c *serverClock) Bound() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bound
}
