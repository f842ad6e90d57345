package suite

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock/safety/report"
)

// memberExpectations: with the majority paused nothing commits, so
// liveness bounds measured from a release or a crash inside the window
// can pass (CI, zookeeper3: a release started during the outage, the
// next acquire 3.88 s later against a bound of 3.7 s). Exclusion and
// fencing are still checked.
var memberExpectations = report.Table{
	{Backend: "*", Fault: FaultMemberIsolated, Expectation: report.Expectation{
		Tolerate: []string{"P5", "P6"},
		Why: "every member but the holder's is paused for 2×TTL: the cluster has no quorum, so no release, expiry or " +
			"acquire commits until the majority returns and a leader is (re)elected. A release or crash inside that " +
			"window frees the key only after it, which can take longer than TTL + poll + slack (P5) or the progress " +
			"bound (P6): a liveness loss of the store, not a safety one.",
	}},
}

func init() { expectations = append(expectations, memberExpectations...) }

// Faults of one member of a cluster (etcd, ZooKeeper) under a holder
// connected to that member alone: the stale-read renewal question. Can a
// holder whose member cannot reach its peers keep renewing, or believe it
// holds, while the majority has expired its lease and granted the key to
// another? They need Control.Members, PauseMember and ResumeMember, and
// run when named in Config.Faults (or GroupMembers).
const (
	// FaultMemberPause: the member the holder is connected to is paused
	// (SIGSTOP) for 3×TTL while the other members serve the other
	// contenders.
	FaultMemberPause = "member-pause"
	// FaultMemberIsolated: every member but the holder's is paused for
	// 2×TTL, so the holder's member runs on without its peers (it can
	// answer its clients from what it has, but cannot commit anything);
	// then the majority comes back, its clock past the holder's lease.
	FaultMemberIsolated = "member-isolated"

	// GroupMembers is every member fault, for Config.Faults.
	GroupMembers = "members"
)

// MemberFaults are the faults of one cluster member.
var MemberFaults = []string{FaultMemberPause, FaultMemberIsolated}

// memberURL is rawURL with addr as its only host.
func memberURL(rawURL, addr string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL // openBackendEnv parsed it already
	}
	u.Host = addr
	return u.String()
}

// memberOf is the index of the member contender proc ("c3") connects to.
func memberOf(proc string, members int) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(proc, "c"))
	return (n - 1) % members
}

// memberCells are the member faults of a cluster backend: three
// contenders, each connected to one member.
func memberCells(be *backendEnv, ctl *Control, prof profile) []cellSpec {
	ttl := be.ttl
	n := len(ctl.Members)
	urlFor := func(i int) string { return memberURL(be.url, ctl.Members[(i-1)%n]) }
	// pauseFor pauses the members sel picks for d (always resuming
	// them), in one round aimed at the holder.
	pauseFor := func(ctx context.Context, c *cell, what string, d time.Duration, sel func(holder int) []int) error {
		h, err := c.awaitHolder(ctx, 10*ttl)
		if err != nil {
			return err
		}
		m := memberOf(h.proc, n)
		ids := sel(m)
		var names []string
		for _, i := range ids {
			names = append(names, strconv.Itoa(i+1))
		}
		return c.round(h.proc, fmt.Sprintf("%s (holder %s on member %d; paused: %s)", what, h.proc, m+1, strings.Join(names, ",")), func() error {
			var paused []int
			var err error
			for _, i := range ids {
				if err = ctl.PauseMember(ctx, i); err != nil {
					break
				}
				paused = append(paused, i)
			}
			if err == nil {
				err = pace(ctx, d)
			}
			// Always resume: later cells need the cluster whole.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			for _, i := range paused {
				if rerr := ctl.ResumeMember(rctx, i); rerr != nil && err == nil {
					err = rerr
				}
			}
			return err
		})
	}
	rounds := func(what string, d time.Duration, sel func(holder int) []int) func(ctx context.Context, c *cell) (int, error) {
		return func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.rounds {
				if err := pauseFor(ctx, c, what, d, sel); err != nil {
					return i + 1, err
				}
				if err := between(ctx, i, prof.rounds, 2*ttl); err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		}
	}
	return []cellSpec{
		{fault: FaultMemberPause, fencing: true, hold: 2 * ttl, urlFor: urlFor, cooldown: 2*ttl + 2*be.slack,
			setup: fmt.Sprintf("%d members, each contender connected to one; the holder's member paused (SIGSTOP) for 3×TTL", n),
			run:   rounds("holder's member paused", 3*ttl, func(m int) []int { return []int{m} })},
		{fault: FaultMemberIsolated, fencing: true, hold: 2 * ttl, urlFor: urlFor, cooldown: 2*ttl + 2*be.slack,
			setup: fmt.Sprintf("%d members, each contender connected to one; every member but the holder's paused (SIGSTOP) for 2×TTL: "+
				"the holder's member runs without its peers, then the majority returns", n),
			run: rounds("holder's member isolated", 2*ttl, func(m int) []int {
				var others []int
				for i := range n {
					if i != m {
						others = append(others, i)
					}
				}
				return others
			})},
	}
}
