package suite

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/mono"
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

	// FaultFollowerPartitioned: the holder's member, a follower, is cut
	// off from its peers (Control.PartitionMember: its peer links, not
	// its clients') for 3×TTL while contenders connected to the other
	// members wait for the holder's key; then the links heal.
	FaultFollowerPartitioned = "follower-partitioned"

	// GroupMembers is every member fault, for Config.Faults.
	GroupMembers = "members"
)

// MemberFaults are the faults of one cluster member.
var MemberFaults = []string{FaultMemberPause, FaultMemberIsolated, FaultFollowerPartitioned}

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
			resumed := true
			for _, i := range paused {
				if rerr := ctl.ResumeMember(rctx, i); rerr != nil {
					resumed = false
					if err == nil {
						err = rerr
					}
				}
			}
			if resumed && ctl.MembersServe != nil {
				if werr := ctl.MembersServe(rctx); werr != nil && err == nil {
					err = werr
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

// partitionCell is FaultFollowerPartitioned: three contenders on one key,
// each connected to one member. In each round a fresh holder connected to
// a follower is cut off with its member: the member keeps answering the
// holder (pings, reads) until it gives up on its leader, while the
// leader, with the third member, expires the holder's session and a
// contender connected to the majority takes the key. The checker judges
// whether the holder still believed then (P3, P4) and whether a stale
// write got in (P1); the setup column gives, per round, when the holder
// stopped believing and when the next holder was granted the key,
// measured from the cut.
func partitionCell(be *backendEnv, ctl *Control, prof profile) cellSpec {
	ttl := be.ttl
	n := len(ctl.Members)
	cut := 3 * ttl
	type cutRound struct {
		lease, key string
		at         int64 // the cut (FaultStart)
	}
	var (
		mu   sync.Mutex
		cuts []cutRound
	)
	spec := cellSpec{fault: FaultFollowerPartitioned, fencing: true, keys: 1, hold: 4 * ttl,
		urlFor:   func(i int) string { return memberURL(be.url, ctl.Members[(i-1)%n]) },
		cooldown: 2*ttl + 2*be.slack,
		setup: fmt.Sprintf("%d members, each contender connected to one, all on one key; the holder's member, a follower, cut off "+
			"from its peers (its quorum and election links held by proxies, its clients' path untouched) for 3×TTL, then healed", n),
	}
	spec.run = func(ctx context.Context, c *cell) (int, error) {
		for i := range prof.rounds {
			leader := -1
			for m := range n {
				ok, err := ctl.MemberLeads(ctx, m)
				if err != nil {
					return i, err
				}
				if ok {
					leader = m
				}
			}
			// A holder on a follower, acquired within the last TTL/2 (so
			// that it holds and renews well into the cut).
			hctx, cancel := context.WithTimeout(ctx, 20*ttl)
			h, err := c.log.awaitHolding(hctx, c.rng, func(h holding) bool {
				return c.proc(h.proc) != nil && memberOf(h.proc, n) != leader && mono.Now()-h.t < int64(ttl/2)
			})
			cancel()
			if err != nil {
				return i, fmt.Errorf("no fresh holder on a follower (leader: member %d): %w", leader+1, err)
			}
			m := memberOf(h.proc, n)
			err = c.round(h.proc, fmt.Sprintf("holder's member partitioned (holder %s, lease %s, on follower %d; leader %d)", h.proc, h.lease, m+1, leader+1), func() error {
				mu.Lock()
				cuts = append(cuts, cutRound{lease: h.lease, key: h.key, at: mono.Now()})
				mu.Unlock()
				err := ctl.PartitionMember(ctx, m)
				if err == nil {
					err = pace(ctx, cut)
				}
				// Always heal: later cells need the cluster whole.
				hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				return errors.Join(err, ctl.HealMember(hctx, m))
			})
			if err != nil {
				return i + 1, err
			}
			if err := between(ctx, i, prof.rounds, 2*ttl); err != nil {
				return i + 1, err
			}
		}
		return prof.rounds, nil
	}
	spec.after = func(c *cell, res check.Result) error {
		mu.Lock()
		defer mu.Unlock()
		evs := c.log.snapshot()
		sort.SliceStable(evs, func(i, j int) bool { return evs[i].T < evs[j].T })
		ms := func(d int64) string { return fmt.Sprintf("%+.2fs", time.Duration(d).Seconds()) }
		for i, r := range cuts {
			var believed, lost, next int64 = 0, -1, -1
			nextBy := ""
			for _, ev := range evs {
				switch {
				case ev.Lease == r.lease && (ev.Kind == history.Belief || ev.Kind == history.Acquired) && ev.Until > believed:
					believed = ev.Until
				case ev.Lease == r.lease && lost < 0 && (ev.Kind == history.Lost || ev.Kind == history.ReleaseStart):
					lost = ev.T
				case ev.Kind == history.Acquired && ev.Key == r.key && ev.Lease != r.lease && ev.T > r.at && next < 0:
					next, nextBy = ev.T, ev.Proc
				}
			}
			s := fmt.Sprintf("; round %d (from the cut): holder's last belief until %s", i+1, ms(believed-r.at))
			if lost >= 0 {
				s += fmt.Sprintf(", loss or release reported %s", ms(lost-r.at))
			}
			if next >= 0 {
				s += fmt.Sprintf(", key granted to %s %s", nextBy, ms(next-r.at))
			} else {
				s += ", key not granted to another before the end"
			}
			c.spec.setup += s
		}
		return nil
	}
	return spec
}
