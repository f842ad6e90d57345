package check

import (
	"sort"
	"strings"

	"github.com/fencelock/fencelock/safety/history"
)

const ruleM1 = `A multi-key grant is all or nothing. A call is one AcquireStart per key, whose lease ids are the call's id, a dot ` +
	`and a number (contender.Config.Multi); it ends when every one of its keys has its Acquired or AcquireFailed. A call that ` +
	`returned a grant must hold every key it asked for (an Acquired for each, none failed): no partial group is handed out. ` +
	`And every record the store granted the process during the call (StoreAcquired, by owner) must, by the call's end, be one of ` +
	`the grant's leases (an Acquired whose Note is that owner) or have been given back (StoreReleased of that owner): no ` +
	`partial group is left held. The second part is not judged for a call during which its process was paused, or a store-wide ` +
	`fault was active (a record that expired meanwhile is lost, not released), nor for a call its process's crash cut short.`

// multiCall is one multi-key call of a process, as the history says it.
type multiCall struct {
	id         string
	start, end int64
	keys       map[string]string        // lease id → key asked for
	outcome    map[string]history.Event // lease id → Acquired or AcquireFailed
	took       map[string]history.Event // owner → StoreAcquired during the call
	gave       map[string]bool          // owners given back (StoreReleased) during the call
}

// multiID returns the id of the multi-key call a lease id belongs to
// (before its last dot), or "".
func multiID(lease string) string {
	i := strings.LastIndexByte(lease, '.')
	if i <= 0 {
		return ""
	}
	return lease[:i]
}

// allOrNothing is M1.
func (m *model) allOrNothing(st *Stats) Property {
	c := m.newCollector("M1", "a multi-key grant is handed out whole, and a failed call leaves no key held", ruleM1)
	open := map[string]*multiCall{} // proc → its call in progress
	judge := func(proc string, mc *multiCall) {
		c.check()
		var got, failed []string
		var evs []history.Event
		for id, key := range mc.keys {
			e := mc.outcome[id]
			evs = append(evs, e)
			if e.Kind == history.Acquired {
				got = append(got, key)
			} else {
				failed = append(failed, key)
			}
		}
		sort.Strings(got)
		sort.Strings(failed)
		sort.Slice(evs, func(i, j int) bool { return evs[i].T < evs[j].T })
		if len(got) > 0 && len(failed) > 0 {
			c.violate(evs, "%s call %s handed out a partial grant at %s: held %s, not %s",
				proc, mc.id, m.at(mc.end), strings.Join(got, ", "), strings.Join(failed, ", "))
		}
		if m.pausedDuring(proc, mc.start, mc.end) || m.storeFaultDuring(mc.start, mc.end) {
			return
		}
		handed := map[string]bool{}
		for _, e := range mc.outcome {
			if e.Kind == history.Acquired {
				handed[e.Note] = true
			}
		}
		var left []history.Event
		for owner, e := range mc.took {
			if !handed[owner] && !mc.gave[owner] {
				left = append(left, e)
			}
		}
		sort.Slice(left, func(i, j int) bool { return left[i].T < left[j].T })
		for _, e := range left {
			c.violate(append([]history.Event{e}, evs...), "%s call %s ended at %s (%d of %d keys granted) holding the record of %s it took at %s (owner %s), neither handed out nor given back",
				proc, mc.id, m.at(mc.end), len(got), len(mc.keys), e.Key, m.at(e.T), e.Note)
		}
	}
	for _, e := range m.h {
		switch e.Kind {
		case history.AcquireStart:
			id := multiID(e.Lease)
			if id == "" {
				continue
			}
			mc := open[e.Proc]
			if mc == nil || mc.id != id {
				mc = &multiCall{id: id, start: e.T, keys: map[string]string{}, outcome: map[string]history.Event{},
					took: map[string]history.Event{}, gave: map[string]bool{}}
				open[e.Proc] = mc
			}
			mc.keys[e.Lease] = e.Key
		case history.Acquired, history.AcquireFailed:
			mc := open[e.Proc]
			if mc == nil || multiID(e.Lease) != mc.id {
				continue
			}
			if _, asked := mc.keys[e.Lease]; !asked {
				continue
			}
			if _, done := mc.outcome[e.Lease]; !done {
				mc.outcome[e.Lease] = e
			}
			if len(mc.outcome) == len(mc.keys) {
				mc.end = e.T
				delete(open, e.Proc)
				judge(e.Proc, mc)
			}
		case history.StoreAcquired:
			if mc := open[e.Proc]; mc != nil {
				mc.took[e.Note] = e
			}
		case history.StoreReleased:
			if mc := open[e.Proc]; mc != nil {
				mc.gave[e.Note] = true
			}
		case history.Crash:
			delete(open, e.Proc) // cut short: its records expire with the process
		}
	}
	return c.done()
}
