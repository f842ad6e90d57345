package suite

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/fencelock/fencelock/safety/contender"
	"github.com/fencelock/fencelock/safety/history"
)

// Faults of clients that differ, and of the server's clock estimate.
const (
	// FaultMixedConfig: three clients of one store with different
	// options (TTL, RotateEvery, MinHold; on MongoDB the clock resync
	// period) on the same keys, with a holder paused between its lease
	// check and its write.
	FaultMixedConfig = fMixedConfig
	// FaultClockStall: for backends that estimate the server's clock
	// (MongoDB: the hello reply's localTime), a holder is cut off and the
	// store stops answering every client for 3s while their clock
	// resyncs are due, so that a resync is in flight through the stall.
	FaultClockStall = fClockStall
)

const (
	fMixedConfig = "mixed-config"
	fClockStall  = "server-stall-clock-resync"
)

// clockStall is how long the store stops answering in the clock-stall
// cell; clockStallTTL its contenders' TTL, long enough that a holder
// acquired just before the stall still believes after it.
const (
	clockStall    = 3 * time.Second
	clockStallTTL = 4 * time.Second
)

// estimatesClock reports whether a backend of this scheme estimates the
// server's clock from its replies (and so has the clock-stall cell):
// MongoDB only. PostgreSQL judges expiry by now() in each statement,
// Redis by key TTLs, etcd and ZooKeeper by their leases and sessions.
func estimatesClock(scheme string) bool { return scheme == "mongodb" || scheme == "mongodb+srv" }

// withQuery returns raw with query parameter k set to v.
func withQuery(raw, k, v string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw // openBackendEnv parsed it
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// mixedConfigCell runs three clients of different options on one store's
// keys: c1 the backend's TTL; c2 twice that, rotating its tokens every
// TTL; c3 the TTL with MinHold TTL/2 (and on MongoDB a clock resync every
// second against the default 30s). One round pauses a holder between its
// lease check and its write until another lease of its key has written.
// Tokens must still rise per key across the clients (P2), at most one
// client believe it holds a key (P3, P4), and the other properties hold
// with the checker's TTL the longest of them.
func mixedConfigCell(be *backendEnv, prof profile) cellSpec {
	ttl := be.ttl
	setup := fmt.Sprintf("c1 TTL %v; c2 TTL %v, RotateEvery %v; c3 TTL %v, MinHold %v", ttl, 2*ttl, ttl, ttl, ttl/2)
	if estimatesClock(be.scheme) {
		setup += ", clock_resync 1s (c1, c2: 30s)"
	}
	setup += "; a holder paused between lease check and write"
	return cellSpec{fault: fMixedConfig, fencing: true, setup: setup, checkTTL: 2 * ttl, cooldown: 2*ttl + 2*be.slack,
		tailor: func(n int, cfg *contender.Config) {
			switch (n-1)%3 + 1 {
			case 2:
				cfg.TTL, cfg.RotateEvery = 2*ttl, ttl
			case 3:
				cfg.MinHold = ttl / 2
				if estimatesClock(be.scheme) {
					cfg.URL = withQuery(cfg.URL, "clock_resync", "1s")
				}
			}
			if be.scheme == "zk" {
				// ZooKeeper's lease is its session.
				cfg.URL = withQuery(cfg.URL, "session_timeout", cfg.TTL.String())
			}
		},
		run: func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.rounds {
				if _, err := c.pauseHolder(ctx, "holder paused between lease check and write"); err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		}}
}

// clockStallCell is the server stall during a clock estimate (backends
// that estimate the server's clock). Its contenders use a TTL of
// clockStallTTL, longer than the stall, and resync their estimate every
// 2s (clock_resync): during a stall of clockStall every estimate goes
// stale, so a waiter's next attempt sends its resync hello into the
// stall and gets the reply when the store answers again: a round trip of
// up to clockStall, whose midpoint puts the estimate up to half of it
// ahead of the server. Each round: a fresh holder (just acquired, so
// its validity outlasts the stall) is cut off (blackhole: no renewal
// gets through), at once every other contender's path stops too for
// clockStall (the store paused, as each client sees it), then they come
// back, the holder a TTL later. A waiter that trusts an estimate taken
// across the stall judges the holder's record expired up to half the
// stall early and takes the key while the holder still believes: P3 and
// P4 fail. Tokens must still rise (P2) and stale writes be refused (P1).
func clockStallCell(be *backendEnv, prof profile) cellSpec {
	ttl := clockStallTTL
	return cellSpec{fault: fClockStall, fencing: true, keys: 1, hold: 2 * ttl, checkTTL: ttl, cooldown: ttl + 2*be.slack,
		setup: fmt.Sprintf("TTL %v, clock_resync 2s; a fresh holder cut off, then the store unanswering for every other client for %v (resyncs in flight), the holder back a TTL after", ttl, clockStall),
		tailor: func(_ int, cfg *contender.Config) {
			cfg.TTL = ttl
			cfg.URL = withQuery(cfg.URL, "clock_resync", "2s")
		},
		run: func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.rounds {
				acq, err := c.awaitEvent(ctx, 10*ttl, c.log.mark(), "a new holder", func(e history.Event) bool {
					return e.Kind == history.Acquired
				})
				if err != nil {
					return i, err
				}
				blackhole := contender.Command{Op: contender.OpProxyMode, Mode: "blackhole"}
				pass := contender.Command{Op: contender.OpProxyMode, Mode: "pass"}
				if err := c.round("", fmt.Sprintf("holder %s cut off, store unanswering for %v", acq.Proc, clockStall), func() error {
					if err := c.send(acq.Proc, blackhole); err != nil {
						return err
					}
					var others []string
					for _, p := range c.live() {
						if p.Name() != acq.Proc {
							others = append(others, p.Name())
						}
					}
					for _, o := range others {
						if err := c.send(o, blackhole); err != nil {
							return err
						}
					}
					perr := pace(ctx, clockStall)
					for _, o := range others {
						if err := c.send(o, pass); err != nil {
							return err
						}
					}
					if perr == nil {
						perr = pace(ctx, ttl)
					}
					if err := c.send(acq.Proc, pass); err != nil {
						return err
					}
					return perr
				}); err != nil {
					return i + 1, err
				}
				if err := between(ctx, i, prof.rounds, ttl); err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		}}
}
