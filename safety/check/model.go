package check

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fencelock/fencelock/safety/history"
)

// never is the end of an interval that does not end within the history.
const never = math.MaxInt64

// lease is everything the history says about one lease.
type lease struct {
	id, proc, key string
	rank          int // position among its key's leases, by Acquired T
	acq           history.Event
	start         int64 // acq.T
	until         int64 // largest Until reported; 0 if none
	lost          *history.Event
	release       *history.Event // ReleaseStart
	released      *history.Event // Released (the outcome of Release)
	crash         *history.Event // first Crash of its process after start
	end           int64          // end of the belief interval
	cause         string         // what ended it: "lost", "release", "crash", "until", "open"
	held          int64          // end of holding by events alone: Lost, ReleaseStart or crash; never if none
	acquireStart  int64          // T of the AcquireStart that led to it; -1 if unknown
}

// attempt is one Acquire call: from AcquireStart to its outcome.
type attempt struct {
	proc, lease string // lease: as AcquireStart named it, if it did
	start, end  int64  // end is never if the attempt did not end
}

// interval is a span of the history, e.g. an active fault; proc is the
// process it concerns ("" for all).
type interval struct {
	from, to int64
	proc     string
}

// model indexes a sorted history.
type model struct {
	cfg     Config
	h       history.History // sorted by T
	first   int64
	last    int64
	leases  map[string]*lease
	byKey   map[string][]*lease // by start
	tries   map[string][]attempt
	crashes map[string][]history.Event // by proc
	pauses  map[string][]interval      // by proc: Pause to Resume
	faults  []interval                 // FaultStart to FaultEnd; proc "" for a store-wide fault

	orphanCrash, orphanAmbiguous []time.Duration // filled by P5 and P8
}

func newModel(in history.History, cfg Config) *model {
	h := append(history.History(nil), in...)
	h.Sort()
	m := &model{
		cfg:     cfg,
		h:       h,
		leases:  make(map[string]*lease),
		byKey:   make(map[string][]*lease),
		tries:   make(map[string][]attempt),
		crashes: make(map[string][]history.Event),
		pauses:  make(map[string][]interval),
	}
	if len(h) > 0 {
		m.first, m.last = h[0].T, h[len(h)-1].T
	}
	// proc, key → indexes in tries[key] of its open attempts, oldest
	// first (a contender with several workers may try a key twice at
	// once; an outcome ends the attempt of its lease, else the oldest).
	pending := map[[2]string][]int{}
	paused := map[string]int64{}    // proc → Pause T
	var faultStarts []history.Event // open faults, in order
	for i := range h {
		e := &h[i]
		switch e.Kind {
		case history.AcquireStart:
			m.tries[e.Key] = append(m.tries[e.Key], attempt{proc: e.Proc, start: e.T, end: never})
			pk := [2]string{e.Proc, e.Key}
			m.tries[e.Key][len(m.tries[e.Key])-1].lease = e.Lease
			pending[pk] = append(pending[pk], len(m.tries[e.Key])-1)
		case history.Acquired, history.AcquireFailed:
			pk := [2]string{e.Proc, e.Key}
			if len(pending[pk]) == 0 && e.Lease != "" {
				// The call named another key than its grant: a
				// semaphore's (the grant is a slot key's permit) or a
				// read-write lock's (a reader's slot). Find it by lease.
				for opk, open := range pending {
					if opk[0] == e.Proc && slices.ContainsFunc(open, func(j int) bool { return m.tries[opk[1]][j].lease == e.Lease }) {
						pk = opk
						break
					}
				}
			}
			tk := pk[1]
			st := int64(-1)
			if open := pending[pk]; len(open) > 0 {
				i := slices.IndexFunc(open, func(j int) bool { return e.Lease != "" && m.tries[tk][j].lease == e.Lease })
				if i < 0 {
					i = 0
				}
				j := open[i]
				m.tries[tk][j].end = e.T
				st = m.tries[tk][j].start
				if open = slices.Delete(open, i, i+1); len(open) == 0 {
					delete(pending, pk)
				} else {
					pending[pk] = open
				}
			}
			if e.Kind == history.Acquired && e.Lease != "" && m.leases[e.Lease] == nil {
				l := &lease{id: e.Lease, proc: e.Proc, key: e.Key, acq: *e, start: e.T, until: e.Until, acquireStart: st}
				l.rank = len(m.byKey[e.Key])
				m.leases[e.Lease] = l
				m.byKey[e.Key] = append(m.byKey[e.Key], l)
			}
		case history.Belief:
			if l := m.leases[e.Lease]; l != nil && e.Until > l.until {
				l.until = e.Until
			}
		case history.Lost:
			if l := m.leases[e.Lease]; l != nil && l.lost == nil {
				l.lost = e
			}
		case history.ReleaseStart:
			if l := m.leases[e.Lease]; l != nil && l.release == nil {
				l.release = e
			}
		case history.Released:
			if l := m.leases[e.Lease]; l != nil && l.released == nil {
				l.released = e
			}
		case history.Crash:
			m.crashes[e.Proc] = append(m.crashes[e.Proc], *e)
			for pk, open := range pending { // a killed process's attempts end with it
				if pk[0] == e.Proc {
					for _, j := range open {
						m.tries[pk[1]][j].end = e.T
					}
					delete(pending, pk)
				}
			}
			if t, ok := paused[e.Proc]; ok {
				m.pauses[e.Proc] = append(m.pauses[e.Proc], interval{t, e.T, e.Proc})
				delete(paused, e.Proc)
			}
		case history.Pause:
			if _, ok := paused[e.Proc]; !ok {
				paused[e.Proc] = e.T
			}
		case history.Resume:
			if t, ok := paused[e.Proc]; ok {
				m.pauses[e.Proc] = append(m.pauses[e.Proc], interval{t, e.T, e.Proc})
				delete(paused, e.Proc)
			}
		case history.FaultStart:
			faultStarts = append(faultStarts, *e)
		case history.FaultEnd:
			// End the open fault with the same note and target, else the
			// oldest one.
			j := slices.IndexFunc(faultStarts, func(f history.Event) bool { return f.Note == e.Note && f.Proc == e.Proc })
			if j < 0 && len(faultStarts) > 0 {
				j = 0
			}
			if j >= 0 {
				f := faultStarts[j]
				m.faults = append(m.faults, interval{f.T, e.T, target(f.Proc)})
				faultStarts = slices.Delete(faultStarts, j, j+1)
			}
		}
	}
	for p, t := range paused {
		m.pauses[p] = append(m.pauses[p], interval{t, never, p})
	}
	for _, f := range faultStarts {
		m.faults = append(m.faults, interval{f.T, never, target(f.Proc)})
	}
	for _, l := range m.leases {
		m.settle(l)
	}
	return m
}

// settle computes the end of l's belief interval and of its holding.
func (m *model) settle(l *lease) {
	for _, c := range m.crashes[l.proc] {
		if c.T >= l.start {
			l.crash = &c
			break
		}
	}
	l.end, l.cause = never, "open"
	consider := func(t int64, cause string) {
		if t < l.end {
			l.end, l.cause = t, cause
		}
	}
	if l.lost != nil {
		consider(l.lost.T, "lost")
	}
	if l.release != nil {
		consider(l.release.T, "release")
	}
	if l.crash != nil {
		consider(l.crash.T, "crash")
	}
	// A holder reports Until only before its writes, and its lease may
	// have been renewed since: as a holder (not as a believer), count it
	// until an event ends it.
	l.held = l.end
	if l.until != 0 {
		consider(l.until, "until")
	}
}

// endEvents returns the event that ended l's belief, if it was one.
func (l *lease) endEvent() []history.Event {
	switch l.cause {
	case "lost":
		return []history.Event{*l.lost}
	case "release":
		return []history.Event{*l.release}
	case "crash":
		return []history.Event{*l.crash}
	}
	return nil
}

// holding returns the lease of key whose belief interval contains t,
// other than except (the latest such lease if several).
func (m *model) holding(key string, t int64, except string) *lease {
	var h *lease
	for _, l := range m.byKey[key] {
		if l.start > t {
			break
		}
		if l.id != except && l.end > t {
			h = l
		}
	}
	return h
}

// holder returns the lease of key that held it at t by its events (see
// lease.held), other than except, or nil.
func (m *model) holder(key string, t int64, except string) *lease {
	var h *lease
	for _, l := range m.byKey[key] {
		if l.start > t {
			break
		}
		if l.id != except && l.held > t {
			h = l
		}
	}
	return h
}

// nextAcquired returns the first lease of key acquired after t other than
// except, or nil.
func (m *model) nextAcquired(key string, t int64, except string) *lease {
	ls := m.byKey[key]
	i := sort.Search(len(ls), func(i int) bool { return ls[i].start > t })
	for ; i < len(ls); i++ {
		if ls[i].id != except {
			return ls[i]
		}
	}
	return nil
}

// target returns the process a fault targets, "" for a store-wide one.
func target(proc string) string {
	if proc == "harness" || proc == "fence" {
		return ""
	}
	return proc
}

// waiting reports whether some Acquire of key was in progress at t by a
// process that was neither paused nor the target of a fault between t
// and until (a contender cut off from the store cannot take a free key).
//
// An Acquire of a semaphore (named by the semaphore's key) waits for
// every one of its slot keys.
func (m *model) waiting(key string, t, until int64) bool {
	tries := m.tries[key]
	if g := groupOf(key); g != "" {
		tries = append(slices.Clip(tries), m.tries[g]...)
	}
	for _, a := range tries {
		if a.start <= t && a.end > t && !m.pausedDuring(a.proc, t, until) && !m.targetedDuring(a.proc, t, until) {
			return true
		}
	}
	return false
}

// targetedDuring reports whether a fault targeting proc was active at
// some time in [from, to].
func (m *model) targetedDuring(proc string, from, to int64) bool {
	for _, f := range m.faults {
		if f.proc == proc && f.from <= to && f.to >= from {
			return true
		}
	}
	return false
}

// storeFaultDuring reports whether a store-wide fault was active at some
// time in [from, to].
func (m *model) storeFaultDuring(from, to int64) bool {
	return m.targetedDuring("", from, to)
}

// pausedDuring reports whether proc was paused at some time in [from, to].
func (m *model) pausedDuring(proc string, from, to int64) bool {
	for _, p := range m.pauses[proc] {
		if p.from <= to && p.to >= from {
			return true
		}
	}
	return false
}

// faultDuring reports whether a fault was active at some time in [from, to].
func (m *model) faultDuring(from, to int64) bool {
	for _, f := range m.faults {
		if f.from <= to && f.to >= from {
			return true
		}
	}
	return false
}

// at formats a time relative to the start of the history.
func (m *model) at(t int64) string {
	if t == never {
		return "never"
	}
	return "+" + time.Duration(t-m.first).Round(time.Microsecond).String()
}

// collector gathers one property's violations.
type collector struct {
	p   Property
	max int
}

func (m *model) newCollector(id, name, rule string) *collector {
	return &collector{p: Property{ID: id, Name: name, Rule: rule}, max: m.cfg.MaxViolations}
}

func (c *collector) check() { c.p.Checked++ }

func (c *collector) violate(events []history.Event, format string, args ...any) {
	c.p.Count++
	if len(c.p.Violations) < c.max {
		c.p.Violations = append(c.p.Violations, Violation{Msg: fmt.Sprintf(format, args...), Events: events})
	}
}

func (c *collector) done() Property {
	c.p.OK = c.p.Count == 0
	return c.p
}

// String returns Msg followed by the events, one per line.
func (v Violation) String() string {
	var b strings.Builder
	b.WriteString(v.Msg)
	for _, e := range v.Events {
		b.WriteString("\n    ")
		b.WriteString(FormatEvent(e))
	}
	return b.String()
}

// FormatEvent formats an event on one line, with the fields that are set.
func FormatEvent(e history.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "t=%d %s %s", e.T, e.Proc, e.Kind)
	if e.Key != "" {
		fmt.Fprintf(&b, " key=%s", e.Key)
	}
	if e.Lease != "" {
		fmt.Fprintf(&b, " lease=%s", e.Lease)
	}
	if e.Token != 0 {
		fmt.Fprintf(&b, " token=%d", e.Token)
	}
	if e.Until != 0 {
		fmt.Fprintf(&b, " until=%d(%+v)", e.Until, time.Duration(e.Until-e.T))
	}
	if e.Kind == history.Write {
		fmt.Fprintf(&b, " accepted=%v reason=%s fencing=%v", e.Accepted, e.Reason, e.Fencing)
	}
	if e.Ambiguous {
		b.WriteString(" ambiguous")
	}
	if e.Err != "" {
		fmt.Fprintf(&b, " err=%q", e.Err)
	}
	if e.Note != "" {
		fmt.Fprintf(&b, " note=%q", e.Note)
	}
	return b.String()
}

// dist summarises durations.
func dist(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		if i < 0 {
			i = 0
		}
		return s[i]
	}
	return Dist{N: len(s), Min: s[0], P50: q(0.50), P99: q(0.99), Max: s[len(s)-1]}
}
