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
// localTime's 1ms resolution at the sample, and grows by the drift between
// the two clocks' rates since (at most maxDrift, see clockSample.boundAt).
// A new sample replaces the estimate only if its bound is no larger than
// the current estimate's bound grown by that drift: a sample with a long
// round trip (a server that stalled while the hello was in flight) never
// replaces a tighter one. The estimate runs on this process's monotonic
// clock, so a step of the local wall clock (NTP, an operator) changes
// nothing.
type serverClock struct {
	db     *mongo.Database
	resync time.Duration

	mu    sync.Mutex  // guards the fields below
	cur   clockSample // the estimate: the tightest sample, drift counted
	tried time.Time   // when a sample was last attempted

	refresh sync.Mutex // held by the goroutine refreshing the estimate
}

// maxDriftDiv is 1/maxDrift: the estimate's bound grows by 1ms for every
// 2s since its sample (500 ppm, the most NTP slews a clock, plus the
// rate error of an undisciplined crystal). 15ms over the default
// ClockResync.
const maxDriftDiv = 2000

// retightenEvery bounds how often an estimate whose bound is too large
// for a takeover is sampled again (see tighten).
const retightenEvery = time.Second

// clockSample is one estimate of the server's clock: at the local reading
// base (with its monotonic part) the server's clock read server, within
// bound.
type clockSample struct {
	base   time.Time
	server time.Time
	bound  time.Duration
}

// boundAt is s's error bound at local time t: its bound at the sample
// plus the drift since.
func (s clockSample) boundAt(t time.Time) time.Duration {
	if s.base.IsZero() {
		return 1<<63 - 1
	}
	age := t.Sub(s.base)
	if age < 0 {
		age = 0
	}
	return s.bound + age/maxDriftDiv
}

// reading is an estimate of the server's clock at one moment: the server's
// clock is within bound of mid.
type reading struct {
	mid   time.Time
	bound time.Duration
}

// early is the earliest the server's clock can read: what a contender
// judges another holder's expiry by, so it never takes a record over
// before the server's clock has passed its expiry.
func (r reading) early() time.Time { return r.mid.Add(-r.bound) }

// late is the latest the server's clock can read: what a holder's expiry
// is counted from, so the record lives at least its TTL by the server's
// clock.
func (r reading) late() time.Time { return r.mid.Add(r.bound) }

// offer replaces the estimate with s if s is at least as tight at local
// time at as the estimate is then (its sample's bound plus drift since),
// and reports whether it did.
func (c *serverClock) offer(s clockSample, at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.boundAt(at) > c.cur.boundAt(at) {
		return false
	}
	c.cur = s
	return true
}

// sample measures the offset with n hello round trips and offers each to
// the estimate. It returns an error only if no hello answered.
func (c *serverClock) sample(ctx context.Context, n int) error {
	var (
		answered  bool
		lastError error
	)
	c.mu.Lock()
	c.tried = time.Now()
	c.mu.Unlock()
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
		answered = true
		rtt := r.Sub(s)
		c.offer(clockSample{base: s.Add(rtt / 2), server: reply.LocalTime.Time(), bound: rtt/2 + time.Millisecond}, r)
	}
	if !answered {
		return lastError
	}
	return nil
}

// read returns the estimate of the server's clock now. When the last
// attempt to sample is older than resync, one caller takes a sample with a
// single hello (others keep using the estimate meanwhile); a failed or
// slow sample keeps the estimate, its bound growing with its age.
func (c *serverClock) read(ctx context.Context) reading {
	c.mu.Lock()
	stale := time.Since(c.tried) >= c.resync
	c.mu.Unlock()
	if stale && c.refresh.TryLock() {
		_ = c.sample(ctx, 1)
		c.refresh.Unlock()
	}
	return c.at(time.Now())
}

// at returns the estimate at local time t.
func (c *serverClock) at(t time.Time) reading {
	c.mu.Lock()
	defer c.mu.Unlock()
	return reading{mid: c.cur.server.Add(t.Sub(c.cur.base)), bound: c.cur.boundAt(t)}
}

// tighten returns the estimate now, first sampling again (one hello, at
// most once per retightenEvery) if its bound exceeds limit.
func (c *serverClock) tighten(ctx context.Context, limit time.Duration) reading {
	r := c.read(ctx)
	if r.bound <= limit {
		return r
	}
	c.mu.Lock()
	due := time.Since(c.tried) >= retightenEvery
	c.mu.Unlock()
	if due && c.refresh.TryLock() {
		_ = c.sample(ctx, 1)
		c.refresh.Unlock()
	}
	return c.at(time.Now())
}

// now returns the estimated server time (the midpoint of its bounds).
func (c *serverClock) now(ctx context.Context) time.Time { return c.read(ctx).mid }

// Bound returns the error bound of the estimate now: half the round trip
// of the hello it came from, plus localTime's 1ms resolution, plus drift
// since.
func (c *serverClock) Bound() time.Duration { return c.at(time.Now()).bound }
