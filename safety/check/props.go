package check

import (
	"time"

	"github.com/fencelock/fencelock/safety/history"
)

// Check evaluates P1..P8 (and S1, S2 with cfg.Permits; W1..W3 with
// cfg.RW; U1 with cfg.Upgrade too; M1 with cfg.Multi) on h (in any order; Check sorts a copy) with
// the bounds in cfg.
func Check(h history.History, cfg Config) Result {
	cfg = cfg.withDefaults()
	m := newModel(h, cfg)
	var st Stats
	props := []Property{
		m.noStaleWriteAccepted(&st),
		m.tokensIncrease(&st),
		m.beliefsDisjoint(&st),
		m.lossNoticed(&st),
		m.crashedKeyFreed(&st),
		m.progressAfterFaults(&st),
		m.staleOpsHarmless(&st),
		m.ambiguousNotStranded(&st),
	}
	if cfg.Permits > 0 {
		props = append(props, m.atMostNHolders(&st), m.permitsComeBack(&st))
	}
	if cfg.RW {
		props = append(props, m.writerExcludes(&st), m.rwTokens(&st), m.rwFenced(&st))
	}
	if cfg.RW && cfg.Upgrade {
		props = append(props, m.upgradesEnd(&st))
	}
	if cfg.Multi {
		props = append(props, m.allOrNothing(&st))
	}
	m.count(&st)
	st.OrphanTime = dist(append(m.orphanCrash, m.orphanAmbiguous...))
	return Result{Properties: props, Stats: st}
}

func (c Config) withDefaults() Config {
	if c.Slack == 0 {
		c.Slack = 250 * time.Millisecond
	}
	if c.Poll == 0 {
		c.Poll = time.Second
	}
	if c.Progress == 0 {
		c.Progress = 3*c.TTL + c.Poll + c.Slack
	}
	if c.MaxViolations == 0 {
		c.MaxViolations = 20
	}
	return c
}

// free is the bound of P5 and P8: how long after a key must be free a
// waiting contender may take to acquire it.
func (c Config) free() time.Duration { return c.TTL + c.Poll + c.Slack }

// count fills in the plain counts of st.
func (m *model) count(st *Stats) {
	keys := map[string]bool{}
	for _, e := range m.h {
		switch e.Kind {
		case history.Acquired:
			st.Acquisitions++
			keys[e.Key] = true
		case history.AcquireFailed:
			st.AcquireFailures++
		case history.ReleaseStart:
			st.Releases++
		case history.Lost:
			st.Losses++
		case history.FaultStart:
			st.Faults++
		case history.Crash:
			st.Crashes++
		case history.Pause:
			st.Pauses++
		case history.BatchRenew:
			st.BatchRenewals++
			st.MaxBatch = max(st.MaxBatch, e.N)
		case history.BatchAcquire:
			st.BatchAcquires++
			st.MaxAcquireBatch = max(st.MaxAcquireBatch, e.N)
		case history.BatchRelease:
			st.BatchReleases++
			st.MaxReleaseBatch = max(st.MaxReleaseBatch, e.N)
		case history.Wait:
			st.Waits++
		case history.StaleOp:
			st.StaleOps++
		case history.Write:
			st.Writes++
			keys[e.Key] = true
			if e.Accepted {
				st.WritesAccepted++
			}
			if !e.Fencing {
				st.FencingOffWrites++
			}
		}
		if e.Ambiguous {
			st.Ambiguous++
		}
	}
	st.Keys = len(keys)
	st.Span = time.Duration(m.last - m.first)
}

const ruleP1 = `A write attempt by lease L is stale if another lease of its key was acquired after L (by Acquired time) and before the fence received the write. ` +
	`Once such a newer lease has used the resource (the fence received a write from it), the fence must reject every write of L: ` +
	`otherwise an old holder overwrites a newer holder's work. A stale write that reaches the fence before the newer holder's first write is ` +
	`counted (stale_accepted_early) but not a violation: the resource sees the writes in lease order. Likewise, once the fence has accepted a ` +
	`lease's rotated token, it must reject that lease's writes with a lower (pre-rotation) token (old_token_writes, old_token_accepted). ` +
	`With fencing off this must fail.`

// noStaleWriteAccepted is P1.
func (m *model) noStaleWriteAccepted(st *Stats) Property {
	c := m.newCollector("P1", "no stale write accepted", ruleP1)
	type keyState struct {
		acquired int    // number of leases of the key acquired so far
		used     int    // highest rank that has written, -1 if none
		usedBy   string // the lease that wrote with rank used
		usedAt   history.Event
	}
	keys := map[string]*keyState{}
	state := func(k string) *keyState {
		s := keys[k]
		if s == nil {
			s = &keyState{used: -1}
			keys[k] = s
		}
		return s
	}
	type accepted struct {
		token uint64
		at    history.Event
	}
	high := map[string]accepted{} // per lease: its highest accepted token
	for _, e := range m.h {
		switch e.Kind {
		case history.Acquired:
			if l := m.leases[e.Lease]; l != nil && l.acq.T == e.T {
				state(e.Key).acquired = l.rank + 1
			}
		case history.Write:
			if e.Access != "" {
				continue // a read-write lock's resource: W3
			}
			c.check()
			if h, ok := high[e.Lease]; ok && e.Token < h.token {
				st.OldTokenWrites++
				if e.Accepted {
					st.OldTokenAccepted++
					c.violate([]history.Event{h.at, e},
						"%s: write of lease %s with its pre-rotation token %d accepted at %s after its rotated token %d was accepted at %s (fencing %v)",
						e.Key, e.Lease, e.Token, m.at(e.T), h.token, m.at(h.at.T), e.Fencing)
				}
			}
			if e.Accepted {
				if h, ok := high[e.Lease]; !ok || e.Token > h.token {
					if ok {
						st.RotatedAccepted++
					}
					high[e.Lease] = accepted{e.Token, e}
				}
			}
			s := state(e.Key)
			rank := -1 // a lease never acquired is older than all
			if l := m.leases[e.Lease]; l != nil {
				rank = l.rank
			}
			stale := s.acquired-1 > rank
			if stale {
				st.StaleAttempted++
				newer := m.byKey[e.Key][s.acquired-1]
				switch {
				case e.Accepted && s.used > rank:
					st.StaleAccepted++
					c.violate([]history.Event{newer.acq, s.usedAt, e},
						"%s: write of lease %s (token %d) accepted at %s after lease %s, acquired after it, wrote at %s (fencing %v)",
						e.Key, e.Lease, e.Token, m.at(e.T), s.usedBy, m.at(s.usedAt.T), e.Fencing)
				case e.Accepted:
					st.StaleAcceptedEarly++
				}
			}
			if rank > s.used {
				s.used, s.usedBy, s.usedAt = rank, e.Lease, e
			}
		}
	}
	return c.done()
}

const ruleP2 = `Every lease of a key gets a token no other lease of the key ever had, and a lease acquired after another has a higher token ` +
	`(likewise a rotated token is higher than every token before it). A token issued twice or going backwards lets fencing ` +
	`accept an old holder. Pairs whose order cannot be observed (the later-reported holder was paused between its Acquire call and its report) ` +
	`are only checked for uniqueness.`

// tokensIncrease is P2.
func (m *model) tokensIncrease(st *Stats) Property {
	c := m.newCollector("P2", "tokens unique and strictly increasing per key", ruleP2)
	type keyState struct {
		owner  map[uint64]*lease // token → first lease that had it
		max    uint64
		maxBy  *lease
		maxEv  history.Event
		tokens map[*lease]uint64 // current token of each lease
	}
	keys := map[string]*keyState{}
	issue := func(s *keyState, l *lease, e history.Event, rotation bool) {
		c.check()
		tok := e.Token
		if tok > st.MaxToken {
			st.MaxToken = tok
		}
		if tok == 0 {
			c.violate([]history.Event{e}, "%s: lease %s reported token 0 at %s", e.Key, l.id, m.at(e.T))
			return
		}
		if o := s.owner[tok]; o != nil && o != l {
			c.violate([]history.Event{o.acq, e}, "%s: token %d issued to lease %s and again to lease %s at %s", e.Key, tok, o.id, l.id, m.at(e.T))
		} else if o == nil {
			s.owner[tok] = l
			st.Tokens++
		}
		if s.maxBy != nil && s.maxBy != l && tok <= s.max && !m.unordered(l, s.maxBy) {
			what := "acquired"
			if rotation {
				what = "rotated to"
			}
			c.violate([]history.Event{s.maxEv, e}, "%s: lease %s %s token %d at %s, not above token %d of lease %s reported at %s",
				e.Key, l.id, what, tok, m.at(e.T), s.max, s.maxBy.id, m.at(s.maxEv.T))
		}
		if tok > s.max {
			s.max, s.maxBy, s.maxEv = tok, l, e
		}
	}
	for _, e := range m.h {
		if e.Kind != history.Acquired && e.Kind != history.Belief {
			continue
		}
		l := m.leases[e.Lease]
		if l == nil {
			continue
		}
		s := keys[l.key]
		if s == nil {
			s = &keyState{owner: map[uint64]*lease{}, tokens: map[*lease]uint64{}}
			keys[l.key] = s
		}
		if e.Kind == history.Acquired {
			if l.acq.T == e.T {
				s.tokens[l] = e.Token
				issue(s, l, e, false)
			}
			continue
		}
		prev, ok := s.tokens[l]
		if !ok || e.Token == 0 || e.Token == prev {
			continue
		}
		if e.Token < prev {
			c.check()
			c.violate([]history.Event{l.acq, e}, "%s: lease %s token went down from %d to %d at %s", l.key, l.id, prev, e.Token, m.at(e.T))
		} else {
			st.Rotations++
			issue(s, l, e, true)
		}
		s.tokens[l] = e.Token
	}
	return c.done()
}

// unordered reports whether the history cannot tell which of a and b was
// granted first although a was reported after b: a's process was paused
// between a's Acquire call and its report, and b was reported after a's
// call began.
func (m *model) unordered(a, b *lease) bool {
	if a.acquireStart < 0 || b.start < a.acquireStart {
		return false
	}
	return m.pausedDuring(a.proc, a.acquireStart, a.start)
}

const ruleP3 = `The belief interval of a lease runs from its Acquired event to the earliest of its Lost, its ReleaseStart, the crash of its ` +
	`process and the largest Until it reported. Two leases of one key must not both believe they hold it for longer than the measurement ` +
	`slack: that is mutual exclusion as the holders see it.`

// beliefsDisjoint is P3.
func (m *model) beliefsDisjoint(st *Stats) Property {
	c := m.newCollector("P3", "belief intervals of one key overlap at most by slack", ruleP3)
	for key, ls := range m.byKey {
		var open []*lease // leases whose interval may still overlap later ones
		for _, l := range ls {
			c.check()
			keep := open[:0]
			for _, o := range open {
				if o.end > l.start {
					keep = append(keep, o)
				}
			}
			open = keep
			for _, o := range open {
				end := min(o.end, l.end)
				if end <= l.start {
					continue
				}
				ov := time.Duration(end - l.start)
				if ov > st.MaxOverlap {
					st.MaxOverlap = ov
				}
				if ov > m.cfg.Slack {
					ev := append([]history.Event{o.acq}, o.endEvent()...)
					c.violate(append(ev, l.acq), "%s: leases %s (token %d, believed %s–%s, ended by %s) and %s (token %d, acquired %s) overlap by %v",
						key, o.id, o.acq.Token, m.at(o.start), m.at(o.end), o.cause, l.id, l.acq.Token, m.at(l.start), ov)
				}
			}
			if l.end > l.start {
				open = append(open, l)
			}
		}
	}
	return c.done()
}

const ruleP4 = `A lease that ended without Release and without a crash of its holder (lost, or run out of local validity, e.g. while its holder ` +
	`was paused) must have ended in its holder's belief before the next lease of its key was acquired. The margin (next Acquired minus ` +
	`belief end) is reported as detection_margin; a negative margin is a violation.`

// lossNoticed is P4.
func (m *model) lossNoticed(st *Stats) Property {
	c := m.newCollector("P4", "lost lease noticed before another acquires", ruleP4)
	var margins []time.Duration
	for _, ls := range m.byKey {
		for _, l := range ls {
			if l.release != nil || l.cause == "crash" || l.cause == "open" {
				continue
			}
			next := m.nextAcquired(l.key, l.start, l.id)
			if next == nil {
				continue
			}
			c.check()
			margin := time.Duration(next.start - l.end)
			margins = append(margins, margin)
			if margin < 0 {
				ev := append([]history.Event{l.acq}, l.endEvent()...)
				c.violate(append(ev, next.acq), "%s: lease %s still believed until %s (%s) but lease %s acquired at %s: margin %v",
					l.key, l.id, m.at(l.end), l.cause, next.id, m.at(next.start), margin)
			}
		}
	}
	st.DetectionMargin = dist(margins)
	return c.done()
}

const ruleP5 = `When the process holding a key is killed, a contender waiting for the key acquires it within TTL (or the session timeout) ` +
	`plus poll plus slack; after a Release the same bound holds (a released key is free at once). Checked only when some Acquire of the key ` +
	`was in progress when the key had to be free, and the history runs past the bound. The time to the next acquisition is orphan_time.`

// crashedKeyFreed is P5.
func (m *model) crashedKeyFreed(st *Stats) Property {
	c := m.newCollector("P5", "crashed or released holder's key free within TTL + poll + slack", ruleP5)
	for _, ls := range m.byKey {
		for _, l := range ls {
			var ev history.Event
			var grace time.Duration
			switch {
			case l.crash != nil && l.held == l.crash.T:
				ev = *l.crash // killed while holding: free after TTL
				grace = m.cfg.TTL
			case l.release != nil && l.held == l.release.T:
				ev = *l.release
				grace = m.cfg.TTL // if Release failed, the record lives out its TTL
				if r := l.released; r != nil {
					if r.Ambiguous {
						continue // P8 judges ambiguous releases
					}
					if r.Err == "" {
						ev, grace = *r, 0 // released: free at once
					}
				}
			default:
				continue
			}
			d, ok := m.freedWithin(c, l, ev, grace)
			if ok && ev.Kind == history.Crash {
				m.orphanCrash = append(m.orphanCrash, d)
			}
		}
	}
	return c.done()
}

// freedWithin checks that after ev, which frees l's key at the latest
// grace later, another lease acquires the key within Config.free if a
// contender is waiting when the key must be free. It returns the time to
// that acquisition and whether there was one.
func (m *model) freedWithin(c *collector, l *lease, ev history.Event, grace time.Duration) (time.Duration, bool) {
	bound := m.cfg.free()
	t0 := ev.T
	if m.holder(l.key, t0, l.id) != nil {
		return 0, false // someone else held the key: l was not its holder
	}
	deadline := t0 + int64(bound)
	next := m.nextAcquired(l.key, t0, l.id)
	mustBeFree := t0 + int64(grace)
	if next != nil && next.start <= deadline {
		c.check()
		return time.Duration(next.start - t0), true
	}
	if deadline > m.last || !m.waiting(l.key, mustBeFree, deadline) || m.storeFaultDuring(t0, deadline) {
		if next != nil {
			return time.Duration(next.start - t0), true
		}
		return 0, false
	}
	c.check()
	if next == nil {
		c.violate([]history.Event{l.acq, ev}, "%s: freed by %s of lease %s at %s, a contender was waiting, and no one acquired it by the end of the run (%s)",
			l.key, ev.Kind, l.id, m.at(t0), m.at(m.last))
		return 0, false
	}
	d := time.Duration(next.start - t0)
	c.violate([]history.Event{l.acq, ev, next.acq}, "%s: freed by %s of lease %s at %s, a contender was waiting, next acquired by %s only at %s: %v > %v",
		l.key, ev.Kind, l.id, m.at(t0), next.id, m.at(next.start), d, bound)
	return d, true
}

const ruleP6 = `After a fault ends (FaultEnd), some lease is acquired and the fence accepts some write within the progress bound ` +
	`(default 3×TTL + poll + slack): the system recovers by itself once the fault heals. A fault followed by another fault before the bound ` +
	`is judged after the last one; a run that ends before the bound without progress fails.`

// progressAfterFaults is P6.
func (m *model) progressAfterFaults(st *Stats) Property {
	c := m.newCollector("P6", "progress after faults heal", ruleP6)
	var rec []time.Duration
	for i, e := range m.h {
		if e.Kind != history.FaultEnd {
			continue
		}
		deadline := e.T + int64(m.cfg.Progress)
		var acq, wr *history.Event
		interrupted := false
		for j := i + 1; j < len(m.h) && m.h[j].T <= deadline && (acq == nil || wr == nil); j++ {
			f := &m.h[j]
			switch {
			case f.Kind == history.FaultStart && (acq == nil || wr == nil):
				interrupted = true
			case f.Kind == history.Acquired && acq == nil:
				acq = f
			case f.Kind == history.Write && f.Accepted && wr == nil:
				wr = f
			}
			if interrupted {
				break
			}
		}
		if interrupted {
			continue
		}
		c.check()
		if acq != nil {
			rec = append(rec, time.Duration(acq.T-e.T))
		}
		if acq == nil || wr == nil {
			var missing string
			switch {
			case acq == nil && wr == nil:
				missing = "no lease acquired and no write accepted"
			case acq == nil:
				missing = "no lease acquired"
			default:
				missing = "no write accepted"
			}
			end := "within " + m.cfg.Progress.String()
			if deadline > m.last {
				end = "before the run ended at " + m.at(m.last) + " (keep the workload running for the progress bound after the last fault)"
			}
			c.violate([]history.Event{e}, "fault %q ended at %s: %s %s", e.Note, m.at(e.T), missing, end)
		}
	}
	st.Recovery = dist(rec)
	return c.done()
}

const ruleP7 = `A stale release or renew (StaleOp: an old grant's Release or Renew sent straight to the backend) must not disturb the ` +
	`current holder: the holder must not lose its lease within TTL + slack while no fault is active and it is not paused, and no ` +
	`third lease may acquire the key while the holder still believes it holds it.`

// staleOpsHarmless is P7.
func (m *model) staleOpsHarmless(st *Stats) Property {
	c := m.newCollector("P7", "stale release or renew never disturbs a newer holder", ruleP7)
	for _, e := range m.h {
		if e.Kind != history.StaleOp {
			continue
		}
		h := m.holding(e.Key, e.T, e.Lease)
		if h == nil {
			continue
		}
		c.check()
		if h.cause == "lost" && h.lost.T-e.T <= int64(m.cfg.TTL+m.cfg.Slack) &&
			!m.faultDuring(e.T, h.lost.T) && !m.pausedDuring(h.proc, e.T, h.lost.T) {
			c.violate([]history.Event{h.acq, e, *h.lost}, "%s: holder %s (token %d) lost its lease at %s, %v after a stale %s of lease %s at %s, with no fault active",
				e.Key, h.id, h.acq.Token, m.at(h.lost.T), time.Duration(h.lost.T-e.T), e.Note, e.Lease, m.at(e.T))
		}
		for _, o := range m.byKey[e.Key] {
			if o.start > e.T && o.start < h.end && o.id != h.id && o.id != e.Lease {
				c.violate([]history.Event{h.acq, e, o.acq}, "%s: after a stale %s of lease %s at %s, lease %s acquired at %s while holder %s still believed (until %s)",
					e.Key, e.Note, e.Lease, m.at(e.T), o.id, m.at(o.start), h.id, m.at(h.end))
				break
			}
		}
	}
	return c.done()
}

const ruleP8 = `After an acquire or release whose reply was lost (Ambiguous), the key must not stay stranded: once the holder of the key at ` +
	`that moment (if any) is gone, a waiting contender acquires it within TTL + poll + slack. The time to that acquisition is orphan_time.`

// ambiguousNotStranded is P8.
func (m *model) ambiguousNotStranded(st *Stats) Property {
	c := m.newCollector("P8", "ambiguous acquire or release never strands a key beyond TTL", ruleP8)
	for _, e := range m.h {
		if !e.Ambiguous || e.Key == "" || e.Kind == history.Acquired {
			continue
		}
		t0 := e.T
		if h := m.holder(e.Key, e.T, e.Lease); h != nil {
			if h.held == never {
				continue // held to the end of the run
			}
			t0 = h.held // the key is legitimately held until then
		}
		deadline := t0 + int64(m.cfg.free())
		next := m.nextAcquired(e.Key, t0, "")
		if next != nil && next.start <= deadline {
			c.check()
			m.orphanAmbiguous = append(m.orphanAmbiguous, time.Duration(next.start-t0))
			continue
		}
		if deadline > m.last || !m.waiting(e.Key, t0+int64(m.cfg.TTL), deadline) || m.storeFaultDuring(t0, deadline) {
			if next != nil {
				m.orphanAmbiguous = append(m.orphanAmbiguous, time.Duration(next.start-t0))
			}
			continue
		}
		c.check()
		if next == nil {
			c.violate([]history.Event{e}, "%s: after an ambiguous %s at %s a contender was waiting and no one acquired the key by the end of the run (%s)",
				e.Key, e.Kind, m.at(e.T), m.at(m.last))
			continue
		}
		d := time.Duration(next.start - t0)
		m.orphanAmbiguous = append(m.orphanAmbiguous, d)
		c.violate([]history.Event{e, next.acq}, "%s: after an ambiguous %s at %s, a contender was waiting, next acquired by %s only at %s: stranded %v > %v",
			e.Key, e.Kind, m.at(e.T), next.id, m.at(next.start), d, m.cfg.free())
	}
	return c.done()
}
