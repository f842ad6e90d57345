package suite

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/contender"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/report"
)

// profile sizes a run.
type profile struct {
	name     string
	rounds   int           // rounds of each fault class (holder pause: twice this)
	baseline time.Duration // how long the fault-free cell runs
	controls int           // rounds of the fencing-off control
	// cellTimeout bounds one cell.
	cellTimeout time.Duration
}

// Names of the fault classes and controls (report.Cell.Fault).
const (
	fBaseline      = "baseline"
	fHolderPause   = "holder-pause"
	fHolderKill    = "holder-kill"
	fBlackhole     = "blackhole"
	fLatency       = "latency"
	fReset         = "conn-reset"
	fAmbAcquire    = "ambiguous-acquire"
	fAmbRelease    = "ambiguous-release"
	fStaleOps      = "stale-release-renew"
	fRotation      = "rotation-batch-wait"
	fCoalesced     = "coalesced"
	fStoreKill     = "server-kill"
	fStorePause    = "server-pause"
	fRedisFlushall = "redis-flushall"
	fRedisExpire   = "redis-early-expiry"
	fFailover      = "failover"
	fFencingOff    = "control-fencing-off"
	mutantPrefix   = "mutant-"
)

// expectations is what is known in advance: the cells that are unsafe by
// design, and the negative controls with the properties they must fail.
var expectations = report.Table{
	{Backend: "*", Fault: fRedisFlushall, Expectation: report.Expectation{
		Unsafe:     true,
		Properties: []string{"P1", "P2", "P3", "P4", "P6"},
		Why: "FLUSHALL deletes every lock record and every token counter. A waiting contender acquires at once while the holder " +
			"still believes it holds the lock (until its next renewal is refused), and the counters restart, so tokens are " +
			"issued again: lower than tokens already used (the fenced resource rejects the new holders' writes until the " +
			"counter passes the old maximum) or equal to one (the resource cannot tell the old holder from the new one and " +
			"may accept a stale write). Exclusion, fencing and progress are all lost.",
		Fix: "Never flush a lock store: a dedicated Redis for locks, FLUSHALL/FLUSHDB disabled (ACL `-flushall -flushdb`, or " +
			"`rename-command FLUSHALL \"\"`); after an unavoidable data loss raise the token floor (driver.TokenFloorer) above " +
			"the highest token the resources have seen.",
	}},
	{Backend: "*", Fault: fRedisExpire, Expectation: report.Expectation{
		Unsafe:     true,
		Properties: []string{"P3", "P4"},
		Why: "Redis judges a lock's expiry by the key's TTL alone. Anything that shortens it — a PEXPIRE or DEL by another " +
			"client, eviction under maxmemory with an allkeys-* or volatile-* policy, a jump of the server's clock — frees the " +
			"lock while its holder still believes it holds it, and a second holder acquires: two believers. The token counter " +
			"is untouched, so the fenced resource rejects the old holder's writes once the new one has written.",
		Fix: "`maxmemory-policy noeviction`; no client but fencelock may write the lock keys (ACL key patterns); pass the " +
			"fencing token with every write to the protected resource.",
	}},
	// The loopback clusters of TestSafety (scripts/testenv etcd3,
	// zookeeper3, redisha) under their failover fault.
	{Backend: "redisha", Fault: "primary-kill-failover", Expectation: report.Expectation{
		Unsafe:     true,
		Properties: []string{"P1", "P2", "P3", "P4"},
		Why: "Redis replicates asynchronously. A lock record or token increment the primary acknowledged just before it " +
			"died may be missing on the replica the Sentinel promotes: a second contender acquires a lock whose holder " +
			"still believes it holds it, and a token can be issued again (the fenced resource cannot tell the two holders " +
			"apart). Whether a run shows it depends on the timing of the kill.",
		Fix: "Use a single Redis primary with appendonly yes and appendfsync always and no automatic failover for locks " +
			"(a restart keeps every lock and token), or a consensus store (etcd, ZooKeeper) when the lock must survive " +
			"the loss of a server. WAIT / min-replicas-to-write narrow the window but do not close it.",
	}},
	{Backend: "postgresha", Fault: "primary-kill-failover", Expectation: report.Expectation{
		Unsafe:     true,
		Properties: []string{"P1", "P2", "P3", "P4"},
		Why: "The standby replicates asynchronously, and the backend warns about it (Describe, doctor). A grant, renewal " +
			"or sequence value the primary acknowledged just before it died may be missing on the promoted standby: a " +
			"second contender acquires a lock whose holder still believes it holds it, and a token can be issued again " +
			"(the sequence is WAL-logged 32 values ahead, so only a lost log record lets it go back). Whether a run shows " +
			"it depends on the replication lag at the kill.",
		Fix: "Make the standby synchronous: synchronous_standby_names naming it, synchronous_commit = on or remote_apply " +
			"(the postgresha-sync row), and fail over only to a synchronous standby.",
	}},
	{Backend: "*", Fault: fFencingOff, Expectation: report.Expectation{
		Control:    true,
		Properties: []string{"P1"},
		Why: "Negative control: the fenced resource accepts every write. A holder paused between its lease check and its " +
			"write resumes after another holder took the key and wrote; its stale write must be caught.",
	}},
	{Backend: "*", Fault: mutantPrefix + string(contender.MutantToken), Expectation: report.Expectation{
		Control:    true,
		Properties: []string{"P2"},
		Why:        "Negative control: every grant reports token 1, as if the store did not increment its counter.",
	}},
	{Backend: "*", Fault: mutantPrefix + string(contender.MutantExpiry), Expectation: report.Expectation{
		Control:    true,
		Properties: []string{"P3"},
		Why:        "Negative control: renewals succeed without asking the store, so a holder keeps believing after its record expired.",
	}},
	{Backend: "*", Fault: mutantPrefix + string(contender.MutantRelease), Expectation: report.Expectation{
		Control:    true,
		Properties: []string{"P7"},
		Why:        "Negative control: Release removes the key's record whoever holds it, so a stale release frees a newer holder's lock.",
	}},
	{Backend: "*", Fault: mutantPrefix + string(contender.MutantRenewAfterRelease), Expectation: report.Expectation{
		Control:    true,
		Properties: []string{"P5"},
		Why:        "Negative control: a released grant keeps being renewed, so the key stays held by nobody who believes it.",
	}},
}

// claimedRules are expectations a backend announces itself: weaknesses of
// the server it detected and reports in its Description's Warnings. They
// come after the fault-specific rules (the negative controls keep theirs).
// No backend claims one today: the MongoDB backend's FerretDB takeover
// race is gone (it rests on unique inserts only), and a weak write or read
// concern it warns about is measured, not excused.
func claimedRules(string, driver.Description) report.Table { return nil }

// holderPauses is the holder-pause scenario: rounds that pause a holder
// between its lease check and its write, alternating with rounds that
// stop one at random.
func holderPauses(prof profile) func(ctx context.Context, c *cell) (int, error) {
	return func(ctx context.Context, c *cell) (int, error) {
		for i := range 2 * prof.rounds {
			var err error
			if i%2 == 0 {
				_, err = c.pauseHolder(ctx, "holder paused between lease check and write")
			} else {
				err = c.stopHolder(ctx)
			}
			if err != nil {
				return i, err
			}
		}
		return 2 * prof.rounds, nil
	}
}

// kitCell is the holder-pause scenario with writes that land in the
// backend's own server through its fencing kit (see kitFor), or why the
// backend has none.
func kitCell(be *backendEnv, prof profile) (cellSpec, string) {
	var what string
	switch be.scheme {
	case "postgres", "postgresql":
		what = "a PostgreSQL table through kit/postgres (pgfence.Tx)"
	case "redis":
		what = "a Redis list through kit/redis (redisfence.Do)"
	case "etcd":
		what = "etcd keys through kit/etcd (etcdfence.Txn)"
	case "mongodb":
		return cellSpec{}, "kit/mongo's conditional update is atomic on MongoDB, not on FerretDB, the server this suite runs"
	default:
		return cellSpec{}, "no fencing kit for " + be.scheme + "://"
	}
	return cellSpec{fault: fHolderPauseKit, fencing: true, kit: true, run: holderPauses(prof),
		setup: "holder paused between lease check and write; every write goes to " + what + ", whose answer decides"}, ""
}

// notRun is a fault left out of a backend's cells, and why.
type notRun struct{ fault, why string }

// cellsFor returns the cells that can run on a backend (the caller picks
// the requested ones) and the faults that cannot, with the reason.
func cellsFor(be *backendEnv, prof profile) (specs []cellSpec, left []notRun) {
	ttl := be.ttl
	specs = []cellSpec{
		{fault: fBaseline, run: func(ctx context.Context, c *cell) (int, error) {
			return 0, pace(ctx, prof.baseline)
		}},
		{fault: fHolderPause, fencing: true, run: holderPauses(prof)},
		{fault: fHolderKill, fencing: true, run: func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.rounds {
				h, err := c.awaitHolder(ctx, 10*ttl)
				if err != nil {
					return i, err
				}
				if err := c.round(h.proc, "holder kill -9", func() error {
					if err := c.kill(h.proc); err != nil {
						return err
					}
					_, err := c.startProc()
					return err
				}); err != nil {
					return i + 1, err
				}
				if err := between(ctx, i, prof.rounds, ttl+be.slack); err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		}},
		{fault: fBlackhole, fencing: true, run: proxyFault(prof, "blackhole holder↔store", 2*ttl,
			contender.Command{Op: contender.OpProxyMode, Mode: "blackhole"},
			contender.Command{Op: contender.OpProxyMode, Mode: "pass"})},
		{fault: fLatency, fencing: true, run: proxyFault(prof, fmt.Sprintf("latency %v per chunk holder↔store", ttl/6), 3*ttl,
			contender.Command{Op: contender.OpLatency, Latency: ttl / 6},
			contender.Command{Op: contender.OpLatency})},
		{fault: fReset, fencing: true, run: proxyFault(prof, "reset holder↔store connections", ttl/2,
			contender.Command{Op: contender.OpProxyMode, Mode: "reset"},
			contender.Command{Op: contender.OpProxyMode, Mode: "pass"})},
		{fault: fAmbAcquire, fencing: true, run: func(ctx context.Context, c *cell) (int, error) {
			return c.ambiguous(ctx, prof.rounds, contender.OpDropAcquire)
		}},
		{fault: fAmbRelease, fencing: true, run: func(ctx context.Context, c *cell) (int, error) {
			return c.ambiguous(ctx, prof.rounds, contender.OpDropRelease)
		}},
		{fault: fStaleOps, fencing: true, hold: ttl, run: func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.rounds {
				if err := c.staleOps(ctx, "release", "renew"); err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		}},
	}
	if !be.proxy {
		why := "no proxy in front of the store: " + be.noProxy
		var kept []cellSpec
		for _, s := range specs {
			if proxied[s.fault] {
				left = append(left, notRun{s.fault, why})
			} else {
				kept = append(kept, s)
			}
		}
		specs = kept
	}
	if be.proxy {
		specs = append(specs, callBoundsCell(be))
	} else {
		left = append(left, notRun{fCallBounds, "no proxy in front of the store (it pauses, refuses and vanishes there): " + be.noProxy})
	}
	specs = append(specs, mixedConfigCell(be, prof))
	if estimatesClock(be.scheme) {
		if be.proxy {
			specs = append(specs, clockStallCell(be, prof))
		} else {
			left = append(left, notRun{fClockStall, "no proxy in front of the store (it stops answering there): " + be.noProxy})
		}
	}
	specs = append(specs, rotationCell(be))
	if be.batches {
		specs = append(specs, coalescedCell(be, prof))
	} else {
		left = append(left, notRun{fCoalesced, be.noBatch})
	}
	specs = append(specs, primCells(be, prof)...)
	ctl := be.control
	if ctl == nil {
		ctl = &Control{}
	}
	if ctl.Restart != nil {
		specs = append(specs, cellSpec{fault: fStoreKill, fencing: true, setup: ctl.setup(fStoreKill, "server killed and started again with its data"),
			run: func(ctx context.Context, c *cell) (int, error) {
				for i := range prof.rounds {
					if err := c.round("", "server kill + restart", func() error {
						return ctl.Restart(ctx)
					}); err != nil {
						return i + 1, err
					}
					if err := between(ctx, i, prof.rounds, ttl); err != nil {
						return i + 1, err
					}
				}
				return prof.rounds, nil
			}})
	} else {
		left = append(left, notRun{fStoreKill, "no command to kill the server (--server-kill; Control.Restart)"})
	}
	if ctl.Pause != nil && ctl.Resume != nil {
		specs = append(specs, cellSpec{fault: fStorePause, fencing: true, setup: ctl.setup(fStorePause, "server paused for 2×TTL, then resumed"),
			run: func(ctx context.Context, c *cell) (int, error) {
				for i := range prof.rounds {
					if err := c.round("", "server paused", func() error {
						if err := ctl.Pause(ctx); err != nil {
							return err
						}
						perr := pace(ctx, 2*ttl)
						// Always resume: a paused server would hang every later cell.
						rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
						defer cancel()
						if err := ctl.Resume(rctx); err != nil {
							return err
						}
						return perr
					}); err != nil {
						return i + 1, err
					}
				}
				return prof.rounds, nil
			}})
	} else {
		left = append(left, notRun{fStorePause, "no commands to pause and resume the server (--server-pause, --server-resume; Control.Pause, Control.Resume)"})
	}
	if ctl.PauseMember != nil && ctl.ResumeMember != nil && len(ctl.Members) >= 3 {
		specs = append(specs, memberCells(be, ctl, prof)...)
	} else {
		for _, f := range MemberFaults {
			if f != FaultFollowerPartitioned {
				left = append(left, notRun{f, "no cluster members to pause (Control.Members, PauseMember, ResumeMember)"})
			}
		}
	}
	if ctl.PartitionMember != nil && ctl.HealMember != nil && ctl.MemberLeads != nil && len(ctl.Members) >= 3 {
		specs = append(specs, partitionCell(be, ctl, prof))
	} else {
		left = append(left, notRun{FaultFollowerPartitioned, "no member links to cut (Control.Members, PartitionMember, HealMember, MemberLeads: " +
			"the cluster's peer links must go through proxies of the suite's process)"})
	}
	if ctl.ClockJump != nil {
		specs = append(specs, clockJumpCell(be, ctl, prof))
	} else {
		left = append(left, notRun{FaultClockJump, "no way to move the server's clock (Control.ClockJump)"})
	}
	if ctl.Failover != nil || ctl.FailoverKey != nil {
		specs = append(specs, failoverCell(be, ctl, prof))
	} else {
		left = append(left, notRun{fFailover, "no command to fail the server over (--server-failover; Control.Failover)"})
	}
	if ctl.MigrateKeys != nil {
		specs = append(specs, slotMigrationCell(be, ctl, prof))
	} else {
		left = append(left, notRun{FaultSlotMigration, "no sharded store whose keys could be moved (Control.MigrateKeys)"})
	}
	if be.scheme == "redis" {
		specs = append(specs,
			cellSpec{fault: fRedisFlushall, fencing: true, setup: "FLUSHALL while locks are held", cooldown: 3*ttl + 2*be.slack,
				run: func(ctx context.Context, c *cell) (int, error) {
					for i := range prof.rounds {
						if _, err := c.awaitHolder(ctx, 10*ttl); err != nil {
							return i, err
						}
						if err := c.round("", "FLUSHALL", func() error {
							_, err := redisDo(ctx, be.url, "FLUSHALL")
							return err
						}); err != nil {
							return i + 1, err
						}
					}
					return prof.rounds, nil
				}},
			cellSpec{fault: fRedisExpire, fencing: true, keys: 1, hold: ttl,
				setup: "PEXPIRE 1 on a lock key just acquired (as eviction or a clock jump would), contenders waiting",
				run: func(ctx context.Context, c *cell) (int, error) {
					for i := range prof.rounds {
						// A fresh holder: it keeps believing for a while.
						mark := c.log.mark()
						acq, err := c.awaitEvent(ctx, 10*ttl, mark, "a new holder", func(e history.Event) bool {
							return e.Kind == history.Acquired
						})
						if err != nil {
							return i, err
						}
						if err := c.round("", "PEXPIRE 1 on the lock key of "+acq.Key, func() error {
							_, err := redisDo(ctx, be.url, "PEXPIRE", redisLockKey(acq.Key), "1")
							return err
						}); err != nil {
							return i + 1, err
						}
						if err := between(ctx, i, prof.rounds, ttl); err != nil {
							return i + 1, err
						}
					}
					return prof.rounds, nil
				}},
		)
		specs = append(specs, evictionCells(be, prof)...)
	}
	switch kc, why := kitCell(be, prof); {
	case why == "":
		specs = append(specs, kc)
	case be.scheme == "mongodb":
		left = append(left, notRun{fHolderPauseKit, why})
	}
	specs = append(specs, cellSpec{fault: fFencingOff, fencing: false, setup: "fenced resource with fencing off",
		run: func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.controls {
				if _, err := c.pauseHolder(ctx, "holder paused between lease check and write"); err != nil {
					return i + 1, err
				}
			}
			return prof.controls, nil
		},
		after: fencingOffRounds,
	})
	if ld, why := lockDelayCell(be, prof); why == "" {
		specs = append(specs, ld)
	} else {
		left = append(left, notRun{fLockDelay, why})
	}
	specs = append(specs, mutantCells(be)...)
	if be.peer != nil {
		return peerCells(be, specs, left)
	}
	return specs, left
}

// peerCells keeps, of a backend's cells, those a Peer runs (PeerFaults),
// with the fenced resource fencing only when the library has tokens.
func peerCells(be *backendEnv, specs []cellSpec, left []notRun) ([]cellSpec, []notRun) {
	var kept []cellSpec
	for _, s := range specs {
		if slices.Contains(PeerFaults, s.fault) {
			s.fencing = be.peer.Tokens
			if !s.fencing {
				s.setup = strings.TrimPrefix(s.setup+"; ", "; ") + "no fencing token: the resource accepts every write"
			}
			kept = append(kept, s)
		}
	}
	var why []notRun
	for _, l := range left {
		if slices.Contains(PeerFaults, l.fault) {
			why = append(why, l)
		}
	}
	return kept, why
}

// withoutTokens drops P2 (tokens unique and increasing) from the result
// of a Peer without fencing tokens: every write carries token 0, so
// there is nothing to judge.
func withoutTokens(r check.Result) check.Result {
	r.Properties = slices.DeleteFunc(slices.Clone(r.Properties), func(p check.Property) bool { return p.ID == "P2" })
	return r
}

// proxied are the faults injected through a contender's faultproxy.
var proxied = map[string]bool{fBlackhole: true, fLatency: true, fReset: true, fAmbAcquire: true, fAmbRelease: true}

// failoverCell is the server failover fault (Control.Failover): while
// contenders hold locks, the leader or primary is killed, another takes
// over, and the old one comes back.
func failoverCell(be *backendEnv, ctl *Control, prof profile) cellSpec {
	fault := fFailover
	if ctl.FailoverName != "" {
		fault = ctl.FailoverName
	}
	return cellSpec{fault: fault, fencing: true, setup: ctl.setup(fFailover, "the server's leader or primary killed, another one takes over, the old one started again"),
		run: func(ctx context.Context, c *cell) (int, error) {
			for i := range prof.rounds {
				h, err := c.awaitHolder(ctx, 10*be.ttl)
				if err != nil {
					return i, err
				}
				from := c.note(history.FaultStart, "", fault)
				var what string
				if ctl.FailoverKey != nil {
					what, err = ctl.FailoverKey(ctx, h.key)
				} else {
					what, err = ctl.Failover(ctx)
				}
				to := c.note(history.FaultEnd, "", fault+" "+what)
				c.mu.Lock()
				c.rounds = append(c.rounds, roundMark{from: from, to: to})
				c.mu.Unlock()
				if err != nil {
					return i + 1, err
				}
				if err := between(ctx, i, prof.rounds, be.ttl); err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		}}
}

// rotationCell exercises the engine's optional paths together: token
// rotation (Options.RotateEvery), batch renewal (two workers per
// contender, so a client holds several leases at once) and waiting
// through the backend (driver.Waiter or driver.Watcher, where it has
// one). Leases are held for one to two TTLs, so every lease rotates, and
// after each rotation its holder writes once with the previous token,
// which the fence must refuse (P1). Once a batch renewal (and a wait)
// has been seen, a rotating holder is paused between its lease check and
// its write until another lease of its key has written: its rotated
// token must then be refused too. after checks that each path was used
// and that no lease was lost before the pause.
func rotationCell(be *backendEnv) cellSpec {
	ttl := be.ttl
	var paused string // the contender the round paused
	return cellSpec{fault: fRotation, fencing: true, keys: 3, workers: 2, rotate: ttl / 2, hold: ttl,
		run: func(ctx context.Context, c *cell) (int, error) {
			if _, err := c.awaitEvent(ctx, 20*ttl, 0, "a batch renewal", func(e history.Event) bool {
				return e.Kind == history.BatchRenew && e.Err == ""
			}); err != nil {
				return 0, err
			}
			if be.waits {
				if _, err := c.awaitEvent(ctx, 20*ttl, 0, "a wait through the backend", func(e history.Event) bool {
					return e.Kind == history.Wait && e.Err == ""
				}); err != nil {
					return 0, err
				}
			}
			h, err := c.pauseHolder(ctx, "rotating holder paused between lease check and write")
			paused = h.proc
			return 1, err
		},
		after: func(c *cell, res check.Result) error {
			st := res.Stats
			how := "polling only: the backend has neither driver.Waiter nor driver.Watcher"
			if be.waits {
				how = fmt.Sprintf("%d through the backend", st.Waits)
			}
			c.spec.setup = fmt.Sprintf("RotateEvery %v, 2 leases per client; %d rotations, %d rotated tokens accepted, %d pre-rotation tokens refused "+
				"(%d accepted); %d batch renewals (up to %d leases); waits: %s; then a holder paused between lease check and write",
				ttl/2, st.Rotations, st.RotatedAccepted, st.OldTokenWrites-st.OldTokenAccepted, st.OldTokenAccepted, st.BatchRenewals, st.MaxBatch, how)
			var errs []error
			if st.Rotations == 0 || st.RotatedAccepted == 0 || st.OldTokenWrites == 0 {
				errs = append(errs, fmt.Errorf("rotation not exercised: %d rotations, %d rotated tokens accepted, %d writes with a pre-rotation token",
					st.Rotations, st.RotatedAccepted, st.OldTokenWrites))
			}
			if st.BatchRenewals == 0 || st.MaxBatch < 2 {
				errs = append(errs, fmt.Errorf("batch renewal not exercised: %d batches", st.BatchRenewals))
			}
			if be.waits && st.Waits == 0 {
				errs = append(errs, errors.New("no wait through the backend's Waiter or Watcher"))
			}
			// Only the paused contender's leases may be lost, and only
			// from its pause on: any other loss was dropped by the engine
			// or the backend (a batch renewal or rotation gone wrong).
			// A backend whose expectation already says the cell is
			// unsafe (FerretDB's takeover race, which the backend
			// announces) loses leases to that weakness: the verdict
			// measures it, and this check would only repeat it.
			if len(c.rounds) > 0 && !c.be.rules.Lookup(c.be.name, c.spec.fault).Unsafe {
				for _, e := range c.log.snapshot() {
					if e.Kind == history.Lost && (e.Proc != paused || e.T < c.rounds[0].from) {
						errs = append(errs, fmt.Errorf("lease %s of %s (%s) lost without a fault: %s", e.Lease, e.Key, e.Proc, e.Err))
						break
					}
				}
			}
			return errors.Join(errs...)
		},
	}
}

// between paces d after round i of n, except after the last one (the
// cell's cool-down follows it).
func between(ctx context.Context, i, n int, d time.Duration) error {
	if i+1 >= n {
		return nil
	}
	return pace(ctx, d)
}

// proxyFault returns a scenario that applies a fault on one holder's path
// to the store with on, keeps it for d, and lifts it with off.
func proxyFault(prof profile, what string, d time.Duration, on, off contender.Command) func(ctx context.Context, c *cell) (int, error) {
	return func(ctx context.Context, c *cell) (int, error) {
		for i := range prof.rounds {
			h, err := c.awaitHolder(ctx, 10*c.be.ttl)
			if err != nil {
				return i, err
			}
			if err := c.round(h.proc, what, func() error {
				if err := c.send(h.proc, on); err != nil {
					return err
				}
				perr := pace(ctx, d)
				if err := c.send(h.proc, off); err != nil {
					return err
				}
				return perr
			}); err != nil {
				return i + 1, err
			}
			if err := between(ctx, i, prof.rounds, c.be.ttl); err != nil {
				return i + 1, err
			}
		}
		return prof.rounds, nil
	}
}

// pauseHolder makes a holder stop itself (SIGSTOP) between its lease
// check and its next write, keeps it stopped until another lease of the
// key has been acquired and has written (or 3×TTL), for at least 2×TTL,
// then resumes it: its write then arrives stale. It returns the paused
// lease.
func (c *cell) pauseHolder(ctx context.Context, what string) (holding, error) {
	h, err := c.awaitHolder(ctx, 10*c.be.ttl)
	if err != nil {
		return h, err
	}
	paused, err := c.pauseUntilSuperseded(ctx, h.proc, what, "a new holder's second write", func(paused, e history.Event) bool {
		return e.Key == paused.Key
	})
	return holding{key: paused.Key, lease: paused.Lease, proc: h.proc, token: paused.Token}, err
}

// pauseUntilSuperseded is one round in which proc stops itself (SIGSTOP)
// between its grant check and its next access: it stays stopped until a
// newer grant (an Acquired event of another lease for which newer, given
// the paused access's event, reports true) has accessed the resource
// twice (its second Belief follows its first answered access), or 3×TTL,
// for at least 2×TTL, and is then resumed, so that its access arrives
// stale. The contender may let its grant go before its next access; it
// then pauses at the first access of its next one. It returns the pause
// event, and records its lease as the round's.
func (c *cell) pauseUntilSuperseded(ctx context.Context, proc, what, superseded string, newer func(paused, e history.Event) bool) (history.Event, error) {
	ttl := c.be.ttl
	var paused history.Event
	err := c.round(proc, what, func() error {
		mark := c.log.mark()
		if err := c.send(proc, contender.Command{Op: contender.OpPauseBeforeWrite}); err != nil {
			return err
		}
		ev, err := c.awaitEvent(ctx, 20*ttl, mark, "the contender's self-pause", func(ev history.Event) bool {
			return ev.Kind == history.Pause && ev.Proc == proc
		})
		if err != nil {
			return err
		}
		paused = ev
		p := c.proc(proc)
		if err := p.WaitStopped(ctx); err != nil {
			return err
		}
		began := time.Now()
		var next string
		beliefs := 0
		if _, err := c.awaitEvent(ctx, 3*ttl+c.be.slack, mark, superseded, func(e history.Event) bool {
			if next == "" && e.Kind == history.Acquired && e.Lease != ev.Lease && newer(ev, e) {
				next = e.Lease
			}
			if e.Kind == history.Belief && e.Lease == next && next != "" {
				beliefs++
			}
			return beliefs >= 2
		}); err != nil {
			c.logf("%s: %v (resuming anyway)", what, err)
		}
		if err := pace(ctx, 2*ttl-time.Since(began)); err != nil {
			return err
		}
		return p.Resume()
	})
	c.mu.Lock()
	c.rounds[len(c.rounds)-1].lease = paused.Lease
	c.mu.Unlock()
	return paused, err
}

// stopHolder stops a holder from outside (SIGSTOP at whatever it was
// doing) for 2×TTL, then resumes it.
func (c *cell) stopHolder(ctx context.Context) error {
	h, err := c.awaitHolder(ctx, 10*c.be.ttl)
	if err != nil {
		return err
	}
	return c.round(h.proc, "holder SIGSTOP", func() error {
		p := c.proc(h.proc)
		if err := p.Pause(ctx); err != nil {
			return err
		}
		perr := pace(ctx, 2*c.be.ttl)
		if err := p.Resume(); err != nil {
			return err
		}
		return perr
	})
}

// ambiguous drops the reply of an acquire or release (op) of a contender
// and waits until a call was hit.
func (c *cell) ambiguous(ctx context.Context, rounds int, op contender.Op) (int, error) {
	ttl := c.be.ttl
	for i := range rounds {
		var target string
		if op == contender.OpDropRelease {
			h, err := c.awaitHolder(ctx, 10*ttl)
			if err != nil {
				return i, err
			}
			target = h.proc
		} else {
			live := c.live()
			target = live[c.rng.IntN(len(live))].Name()
		}
		if err := c.round(target, string(op), func() error {
			mark := c.log.mark()
			if err := c.send(target, contender.Command{Op: op}); err != nil {
				return err
			}
			_, err := c.awaitEvent(ctx, 30*ttl, mark, "an ambiguous "+string(op), func(e history.Event) bool {
				return e.Proc == target && e.Ambiguous
			})
			return err
		}); err != nil {
			return i + 1, err
		}
		if err := between(ctx, i, rounds, ttl); err != nil {
			return i + 1, err
		}
	}
	return rounds, nil
}

// staleOps pauses a holder until its lease is lost and the key has a new
// holder, then has it send its old grant's release and/or renew (ops)
// straight to the backend, after the fault ended.
func (c *cell) staleOps(ctx context.Context, ops ...string) error {
	ttl := c.be.ttl
	mark := c.log.mark()
	ph, err := c.pauseHolder(ctx, "holder paused past its TTL, then stale ops")
	if err != nil {
		return err
	}
	if _, err := c.awaitEvent(ctx, 5*ttl, mark, "the paused lease's loss", func(e history.Event) bool {
		return e.Kind == history.Lost && e.Lease == ph.lease
	}); err != nil {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, 10*ttl)
	defer cancel()
	if _, err := c.log.awaitHolding(hctx, c.rng, func(h holding) bool {
		return h.key == ph.key && h.proc != ph.proc && c.proc(h.proc) != nil
	}); err != nil {
		return fmt.Errorf("no new holder of %s: %w", ph.key, err)
	}
	for _, op := range ops {
		m := c.log.mark()
		if err := c.send(ph.proc, contender.Command{Op: contender.OpStale, Stale: op}); err != nil {
			return err
		}
		ev, err := c.awaitEvent(ctx, 5*ttl, m, "stale "+op, func(e history.Event) bool {
			return e.Kind == history.StaleOp && e.Proc == ph.proc
		})
		if err != nil {
			return err
		}
		if ev.Lease != ph.lease {
			return fmt.Errorf("stale %s used lease %s, not the paused lease %s", op, ev.Lease, ph.lease)
		}
	}
	return nil
}

// mutantCells are the negative controls with a broken backend.
func mutantCells(be *backendEnv) []cellSpec {
	ttl := be.ttl
	name := func(m contender.Mutant) string { return mutantPrefix + string(m) }
	return []cellSpec{
		{fault: name(contender.MutantToken), fencing: true, keys: 1, setup: "backend reports token 1 for every grant",
			mutant: contender.MutantToken,
			run: func(ctx context.Context, c *cell) (int, error) {
				return 1, c.round("", "mutant round", func() error {
					mark := c.log.mark()
					n := 0
					_, err := c.awaitEvent(ctx, 20*ttl, mark, "three acquisitions", func(e history.Event) bool {
						if e.Kind == history.Acquired {
							n++
						}
						return n >= 3
					})
					return err
				})
			}},
		{fault: name(contender.MutantExpiry), fencing: true, keys: 1, hold: 3 * ttl, setup: "Renew succeeds without asking the store",
			mutant: contender.MutantExpiry,
			run: func(ctx context.Context, c *cell) (int, error) {
				h, err := c.awaitHolder(ctx, 10*ttl)
				if err != nil {
					return 0, err
				}
				return 1, c.round("", "mutant round", func() error {
					_, err := c.awaitEvent(ctx, 5*ttl, 0, "another lease of the key", func(e history.Event) bool {
						return e.Kind == history.Acquired && e.Key == h.key && e.Lease != h.lease && e.T > h.t
					})
					return err
				})
			}},
		{fault: name(contender.MutantRelease), fencing: true, keys: 1, hold: 2 * ttl, setup: "Release is a ForceRelease",
			mutant: contender.MutantRelease,
			run: func(ctx context.Context, c *cell) (int, error) {
				return 1, c.staleOps(ctx, "release")
			}},
		// Held 1–2 TTLs: the other contenders (slow to start on a busy
		// machine) must be waiting when the first holder releases, or P5
		// has nobody to judge and the key stays stranded unseen.
		{fault: name(contender.MutantRenewAfterRelease), fencing: true, keys: 1, hold: 2 * ttl, cooldown: 2*ttl + 2*be.slack,
			setup: "a released grant keeps being renewed", mutant: contender.MutantRenewAfterRelease,
			run: func(ctx context.Context, c *cell) (int, error) {
				h, err := c.awaitHolder(ctx, 10*ttl)
				if err != nil {
					return 0, err
				}
				return 1, c.round(h.proc, "mutant round", func() error {
					_, err := c.awaitEvent(ctx, 10*ttl, 0, "the holder's release", func(e history.Event) bool {
						return e.Kind == history.Released && e.Lease == h.lease
					})
					return err
				})
			}},
	}
}

// fencingOffRounds checks that the checker flags the fencing-off control
// in nearly every round (all but at most one, and at least two): a P1
// violation whose accepted stale write came from the lease the round
// paused.
func fencingOffRounds(c *cell, res check.Result) error {
	p1, _ := res.Property("P1")
	n := 0
	for _, r := range c.rounds {
		for _, v := range p1.Violations {
			if len(v.Events) > 0 && r.lease != "" && v.Events[len(v.Events)-1].Lease == r.lease {
				n++
				break
			}
		}
	}
	c.spec.setup = fmt.Sprintf("fenced resource with fencing off; stale write accepted and flagged (P1) in %d of %d rounds", n, len(c.rounds))
	if n < 2 || n < len(c.rounds)-1 {
		return fmt.Errorf("fencing off: P1 flagged in only %d of %d rounds (want nearly every round)", n, len(c.rounds))
	}
	return nil
}
