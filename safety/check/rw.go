package check

import (
	"sort"
	"strings"
	"time"

	"github.com/fencelock/fencelock/safety/history"
)

// rwOf returns the key of the read-write lock whose gate or reader slot
// key is, and whether key is its gate (a writer's grant); "" if key is
// neither (see recipe.Keys).
func rwOf(key string) (lock string, writer bool) {
	g, rest, ok := strings.Cut(key, rwSeparator)
	if !ok {
		return "", false
	}
	return g, rest == "gate"
}

// rwGrant is a lease of a read-write lock: a writer's gate lease or a
// reader's slot lease.
type rwGrant struct {
	*lease
	writer bool
}

// rwLocks returns the grants of each read-write lock, by the lock's key,
// each sorted by start.
func (m *model) rwLocks() map[string][]rwGrant {
	locks := map[string][]rwGrant{}
	for key, ls := range m.byKey {
		lock, writer := rwOf(key)
		if lock == "" {
			continue
		}
		for _, l := range ls {
			locks[lock] = append(locks[lock], rwGrant{l, writer})
		}
	}
	for _, gs := range locks {
		sort.Slice(gs, func(i, j int) bool { return gs[i].start < gs[j].start })
	}
	return locks
}

func role(g rwGrant) string {
	if g.writer {
		return "writer"
	}
	return "reader"
}

const ruleW1 = `A read-write lock has one writer or any number of readers: a writer's belief interval (as in P3) must not overlap ` +
	`another grant's of the same lock, a reader's or a writer's. The measurement slack is allowed only after a grant whose belief ended ` +
	`by its own clock or by a loss (as in P3); a grant that was released, killed or never ended was still held, so any overlap with it ` +
	`is real. Readers may overlap each other; the most readers believing at once is max_holders.`

// writerExcludes is W1.
func (m *model) writerExcludes(st *Stats) Property {
	c := m.newCollector("W1", "no reader overlaps a writer, no two writers overlap", ruleW1)
	for lock, gs := range m.rwLocks() {
		for i, g := range gs {
			c.check()
			for _, o := range gs[i+1:] {
				if o.start >= g.end {
					break
				}
				if !g.writer && !o.writer {
					continue
				}
				ov := time.Duration(min(g.end, o.end) - o.start)
				if ov > st.MaxOverlap {
					st.MaxOverlap = ov
				}
				tol := m.cfg.Slack
				if g.cause != "until" && g.cause != "lost" {
					tol = 0 // released, killed or open: g was still held
				}
				if ov > tol {
					evs := append([]history.Event{g.acq}, g.endEvent()...)
					c.violate(append(evs, o.acq), "%s: %s %s (token %d, believed %s–%s, ended by %s) and %s %s (token %d, acquired %s) overlap by %v",
						lock, role(g), g.id, g.acq.Token, m.at(g.start), m.at(g.end), g.cause, role(o), o.id, o.acq.Token, m.at(o.start), ov)
				}
			}
		}
		// The most readers believing at once.
		type edge struct {
			t  int64
			up int
		}
		var es []edge
		for _, g := range gs {
			if !g.writer && g.end > g.start {
				es = append(es, edge{g.start, 1}, edge{g.end, -1})
			}
		}
		sort.Slice(es, func(i, j int) bool { return es[i].t < es[j].t || es[i].t == es[j].t && es[i].up < es[j].up })
		n := 0
		for _, e := range es {
			n += e.up
			st.MaxHolders = max(st.MaxHolders, n)
		}
	}
	return c.done()
}

const ruleW2 = `A read-write lock's grant carries the token of the gate it entered under: a writer's token must be above the token ` +
	`of every grant of the lock acquired before it, reader's or writer's, and a reader's at least the token of every writer acquired ` +
	`before it, so that a resource can refuse what an older grant sends. Pairs whose order cannot be observed (as in P2) are skipped.`

// rwTokens is W2.
func (m *model) rwTokens(st *Stats) Property {
	c := m.newCollector("W2", "a writer's token above every grant before it, a reader's at least the last writer's", ruleW2)
	for lock, gs := range m.rwLocks() {
		for i, g := range gs {
			for _, e := range gs[:i] {
				if e.start == g.start || (!g.writer && !e.writer) || m.unordered(g.lease, e.lease) {
					continue
				}
				c.check()
				if g.writer && g.acq.Token <= e.acq.Token || !g.writer && g.acq.Token < e.acq.Token {
					c.violate([]history.Event{e.acq, g.acq}, "%s: %s %s acquired at %s with token %d, not above the token %d of %s %s acquired at %s",
						lock, role(g), g.id, m.at(g.start), g.acq.Token, e.acq.Token, role(e), e.id, m.at(e.start))
					break
				}
			}
		}
	}
	return c.done()
}

const ruleW3 = `The lock's fenced resource (accesses with history.Event.Access) must refuse a reader's read once a writer acquired ` +
	`after that reader has sent an access to it (the reader would read what it no longer may rely on), and a writer's write once any ` +
	`grant acquired after that writer has sent an access (it would overwrite a newer grant's view). Earlier stale accesses are counted ` +
	`(stale_accepted_early) but allowed, as in P1. With fencing off this fails.`

// rwFenced is W3. It counts stale accesses into the P1 numbers
// (StaleAttempted, StaleAccepted, StaleAcceptedEarly).
func (m *model) rwFenced(st *Stats) Property {
	c := m.newCollector("W3", "no stale read or write accepted by the read-write lock's resource", ruleW3)
	locks := m.rwLocks()
	type used struct {
		any, writer     int64 // the latest start of a grant (a writer) that has sent an access; -1 if none
		anyBy, writerBy rwGrant
		anyAt, writerAt history.Event
	}
	state := map[string]*used{}
	for _, e := range m.h {
		if e.Kind != history.Write || e.Access == "" {
			continue
		}
		gs := locks[e.Key]
		u := state[e.Key]
		if u == nil {
			u = &used{any: -1, writer: -1}
			state[e.Key] = u
		}
		c.check()
		start := int64(-1) // an access by an unknown grant is older than all
		var self rwGrant
		if l := m.leases[e.Lease]; l != nil {
			start = l.start
			_, w := rwOf(l.key)
			self = rwGrant{l, w}
		}
		read := e.Access == "read"
		// Stale: a newer grant (a writer, for a read) was acquired
		// before the resource received this access.
		stale := false
		for _, g := range gs {
			if g.start > start && g.start < e.T && (g.writer || !read) {
				stale = true
				break
			}
		}
		if stale {
			st.StaleAttempted++
			newer, by, at := u.writer, u.writerBy, u.writerAt
			if !read {
				newer, by, at = u.any, u.anyBy, u.anyAt
			}
			switch {
			case e.Accepted && newer > start:
				st.StaleAccepted++
				c.violate([]history.Event{by.acq, at, e}, "%s: %s of %s (token %d) accepted at %s after %s %s, acquired after it, sent an access at %s (fencing %v)",
					e.Key, e.Access, e.Lease, e.Token, m.at(e.T), role(by), by.id, m.at(at.T), e.Fencing)
			case e.Accepted:
				st.StaleAcceptedEarly++
			}
		}
		if self.lease != nil {
			if start > u.any {
				u.any, u.anyBy, u.anyAt = start, self, e
			}
			if self.writer && start > u.writer {
				u.writer, u.writerBy, u.writerAt = start, self, e
			}
		}
	}
	return c.done()
}

const ruleU1 = `An upgrade of an upgradeable read grant (contender.Config.Upgrade: an AcquireStart of the lock's gate whose lease id ` +
	`is the read grant's with "u" appended) ends, with the write grant or without, within the progress bound (as P6's) of its ` +
	`start: it waits only for the other readers to leave and for readers passing the gate, never for a writer (every writer ` +
	`takes the upgrade record first, which the upgradeable reader holds). An upgrade and a writer that wait for each other ` +
	`until their bounds break it. Not judged for an upgrade during which its process was paused or under a fault, or a store-wide ` +
	`fault was active, nor for one its process's crash or the loss of its read grant cut short, nor where the history ends ` +
	`before the bound.`

// upgradesEnd is U1.
func (m *model) upgradesEnd(st *Stats) Property {
	c := m.newCollector("U1", "an upgrade ends within the progress bound", ruleU1)
	bound := int64(m.cfg.Progress)
	for key, tries := range m.tries {
		lock, writer := rwOf(key)
		if lock == "" || !writer {
			continue
		}
		for _, a := range tries {
			if !strings.HasSuffix(a.lease, "u") {
				continue
			}
			deadline := a.start + bound
			end := min(a.end, m.last)
			if a.end == never && deadline > m.last || m.pausedDuring(a.proc, a.start, end) ||
				m.targetedDuring(a.proc, a.start, end) || m.storeFaultDuring(a.start, end) {
				continue
			}
			read := m.leases[strings.TrimSuffix(a.lease, "u")]
			if read != nil && read.lost != nil && read.lost.T <= end || m.crashedDuring(a.proc, a.start, end) {
				continue
			}
			c.check()
			if a.end <= deadline {
				continue
			}
			what := "had not ended by the end of the history"
			if a.end != never {
				what = "ended only after " + time.Duration(a.end-a.start).String()
			}
			var evs []history.Event
			if read != nil {
				evs = append(evs, read.acq)
			}
			c.violate(evs, "%s: upgrade %s by %s, begun at %s, %s (bound %v)", lock, a.lease, a.proc, m.at(a.start), what, time.Duration(bound))
		}
	}
	return c.done()
}

// crashedDuring reports whether proc was killed at some time in [from, to].
func (m *model) crashedDuring(proc string, from, to int64) bool {
	for _, e := range m.crashes[proc] {
		if e.T >= from && e.T <= to {
			return true
		}
	}
	return false
}
