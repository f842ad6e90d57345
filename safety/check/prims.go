package check

import (
	"sort"
	"strings"
	"time"

	"github.com/fencelock/fencelock/recipe"
	"github.com/fencelock/fencelock/safety/history"
)

// groupOf returns the key of the semaphore whose permit slot key is, or
// "" if key is not a slot key (see recipe.Keys).
func groupOf(key string) string {
	g, _, ok := strings.Cut(key, permitSeparator)
	if !ok {
		return ""
	}
	return g
}

// groups returns the leases of each semaphore, by the semaphore's key,
// each sorted by start.
func (m *model) groups() map[string][]*lease {
	gs := map[string][]*lease{}
	for key, ls := range m.byKey {
		if g := groupOf(key); g != "" {
			gs[g] = append(gs[g], ls...)
		}
	}
	for _, ls := range gs {
		sort.Slice(ls, func(i, j int) bool { return ls[i].start < ls[j].start })
	}
	return gs
}

const ruleS1 = `A semaphore of N permits (Config.Permits) has at most N holders at once: at no instant may leases of more than N of its ` +
	`slot keys believe they hold their permit (belief intervals as in P3). Believers are counted per slot: two leases of one slot ` +
	`that both believe are P3's to judge, with its slack (a hand-over measured late); leases of different slots have no hand-over ` +
	`between them, so S1 allows no slack. A semaphore that hands out one slot too many breaks it. The largest number of slots ` +
	`believed at once is max_holders.`

// atMostNHolders is S1.
func (m *model) atMostNHolders(st *Stats) Property {
	c := m.newCollector("S1", "never more than N holders of a semaphore", ruleS1)
	n := m.cfg.Permits
	for g, ls := range m.groups() {
		type edge struct {
			t   int64
			up  bool
			one *lease
		}
		var es []edge
		for _, l := range ls {
			c.check()
			if l.end > l.start {
				es = append(es, edge{l.start, true, l}, edge{l.end, false, l})
			}
		}
		// Ends before starts at the same instant: a hand-over is not an
		// overlap.
		sort.Slice(es, func(i, j int) bool {
			if es[i].t != es[j].t {
				return es[i].t < es[j].t
			}
			return !es[i].up && es[j].up
		})
		believers := map[string]map[*lease]bool{} // slot key → its believers
		var over int64 = -1                       // since when more than n slots are believed, -1 if not
		var crowd []*lease                        // a believer per slot when the count first went over n
		most := 0                                 // the largest count during this excess
		for _, e := range es {
			bs := believers[e.one.key]
			if e.up {
				if bs == nil {
					bs = map[*lease]bool{}
					believers[e.one.key] = bs
				}
				bs[e.one] = true
			} else {
				delete(bs, e.one)
				if len(bs) == 0 {
					delete(believers, e.one.key)
				}
			}
			k := len(believers)
			st.MaxHolders = max(st.MaxHolders, k)
			switch {
			case k > n && over < 0:
				over, most = e.t, k
				crowd = crowd[:0]
				for _, bs := range believers {
					for l := range bs {
						crowd = append(crowd, l)
						break
					}
				}
			case k > n:
				most = max(most, k)
			case k <= n && over >= 0:
				m.crowded(c, g, crowd, over, e.t, most)
				over = -1
			}
		}
		if over >= 0 {
			m.crowded(c, g, crowd, over, never, most)
		}
	}
	return c.done()
}

// crowded reports an S1 violation: more than N believers of semaphore g
// from `from` to `to`.
func (m *model) crowded(c *collector, g string, crowd []*lease, from, to int64, most int) {
	sort.Slice(crowd, func(i, j int) bool { return crowd[i].start < crowd[j].start })
	var evs []history.Event
	var ids []string
	for _, l := range crowd {
		evs = append(evs, l.acq)
		ids = append(ids, l.id+" ("+l.key[len(g):]+")")
	}
	dur := "to the end of the run"
	if to != never {
		dur = "for " + time.Duration(to-from).String()
	}
	c.violate(evs, "%s: %d slots believed held at once (it has %d permits) from %s %s: %s",
		g, most, m.cfg.Permits, m.at(from), dur, strings.Join(ids, ", "))
}

const ruleS2 = `When the process holding a permit is killed, or paused past the permit's TTL (it then loses the permit), a contender ` +
	`waiting for the semaphore takes that permit's slot within TTL + poll + slack of the kill or pause: a stopped holder's permit ` +
	`comes back. Checked only when some Acquire of the semaphore was in progress, by a process neither paused nor under a fault, ` +
	`from the TTL on to the bound, and the history runs past the bound.`

// permitsComeBack is S2.
func (m *model) permitsComeBack(st *Stats) Property {
	c := m.newCollector("S2", "a killed or paused holder's permit comes back within TTL + poll + slack", ruleS2)
	bound := m.cfg.free()
	for _, ls := range m.groups() {
		for _, l := range ls {
			// When the holder stopped while holding l: a kill, or a
			// pause that outlived the TTL and cost l its permit.
			var stop history.Event
			switch {
			case l.crash != nil && l.held == l.crash.T:
				stop = *l.crash
			case l.lost != nil && l.held == l.lost.T:
				for _, p := range m.pauses[l.proc] {
					if p.from >= l.start && p.from < l.held && p.to-p.from >= int64(m.cfg.TTL) {
						stop = history.Event{T: p.from, Proc: l.proc, Kind: history.Pause, Key: l.key, Lease: l.id}
						break
					}
				}
			}
			if stop.Kind == "" || m.holder(l.key, stop.T, l.id) != nil {
				continue
			}
			t0 := stop.T
			deadline := t0 + int64(bound)
			next := m.nextAcquired(l.key, t0, l.id)
			if next != nil && next.start <= deadline {
				c.check()
				continue
			}
			if deadline > m.last || !m.waiting(l.key, t0+int64(m.cfg.TTL), deadline) || m.storeFaultDuring(t0, deadline) {
				continue
			}
			c.check()
			if next == nil {
				c.violate([]history.Event{l.acq, stop}, "%s: its holder's process %s stopped (%s) at %s holding lease %s, a contender was waiting, and no one took the permit by the end of the run (%s)",
					l.key, l.proc, stop.Kind, m.at(t0), l.id, m.at(m.last))
				continue
			}
			c.violate([]history.Event{l.acq, stop, next.acq}, "%s: its holder's process %s stopped (%s) at %s holding lease %s, a contender was waiting, next taken by %s only at %s: %v > %v",
				l.key, l.proc, stop.Kind, m.at(t0), l.id, next.id, m.at(next.start), time.Duration(next.start-t0), bound)
		}
	}
	return c.done()
}

// permitSeparator and rwSeparator are what a semaphore's and a read-write
// lock's record keys put after the recipe's key (recipe.Keys of an empty
// key gives them).
var (
	permitSeparator, _ = recipe.Keys("", 1)
	rwSeparator, _     = recipe.Keys("", 0)
)
