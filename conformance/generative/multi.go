package generative

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"pgregory.net/rapid"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
)

// Multi-key steps: a lock program's step of kind stepMulti takes its key
// and one or two others (step.also, in the order drawn, so that two steps
// may name a shared pair in opposite orders) all or nothing, with
// recipe.AcquireAll (bounded by 3×TTL, or WithWait) or, with step.late,
// recipe.TryAcquireAll. Each key of the grant is registered in the
// history as a lease of its own, like a lock's, so that NoTwoHolders,
// the token and fence checks and NothingLeftBehind judge every member;
// the grant's members are written to with their own tokens, held, and
// released together (MultiGrant.Release). Two checks are the grant's
// own: MultiGrantWhole (a grant holds every key asked for, each lease
// valid when it is handed out) and, through NothingHeldButTheGrant, that
// a call leaves no key it took and did not hand out.
//
// A third check, MultiNoWaitCycle, is the canonical order's: while
// waiting calls are in progress, the store is listed every tenth of a
// TTL, and no two of them may each hold a key of the other's set for a
// TTL or more (a wait-for cycle: both would wait until their bounds).
// Taken in canonical order, the one holding the smaller of the two keys
// holds every smaller key of its set too, so the other cannot hold one;
// only a member lost while its call waits (a forced release) makes such
// a pair, for the moment the call takes to notice and start again.
// Calls of clients whose driver injects faults, or while the store
// stalls, are not judged.
//
// The keys must share one lock delay (WithLockDelay applies to every key
// of the call, and every call of a key uses the key's delay): the keys
// whose delay differs from step.key's are left out, and a set left with
// one key is an ordinary acquire.

// drawAlso draws the other keys of a multi-key step on key: one or two,
// or with five keys or more up to four (a grant of five keys releases
// them at once, more than a coalescing lane keeps in flight, so its
// releases go in a batch).
func drawAlso(t *rapid.T, keys, key int) []int {
	var rest []int
	for k := range keys {
		if k != key {
			rest = append(rest, k)
		}
	}
	var also []int
	most := 2
	if keys >= 5 {
		most = 4
	}
	for range min(rapid.IntRange(1, most).Draw(t, "alsoKeys"), len(rest)) {
		n := rapid.IntRange(0, len(rest)-1).Draw(t, "also")
		also = append(also, rest[n])
		rest = slices.Delete(rest, n, n+1)
	}
	return also
}

// multiKeys returns the keys of multi-key step s, in the order drawn:
// step.key's and those of s.also with its lock delay.
func (r *runner) multiKeys(s step) []string {
	keys := []string{r.keys[s.key]}
	for _, k := range s.also {
		if r.delayOf(k) == r.delayOf(s.key) {
			keys = append(keys, r.keys[k])
		}
	}
	return keys
}

func (r *runner) delayOf(key int) time.Duration {
	if key < len(r.delays) {
		return r.delays[key]
	}
	return 0
}

// multi runs multi-key step k of worker j of client i on keys.
func (r *runner) multi(ctx context.Context, i, j, k int, c *fencelock.Client, s step, keys []string) {
	label := fmt.Sprintf("gen c%d w%d s%d", i, j, k)
	opts := []fencelock.AcquireOption{fencelock.WithLabel(label)}
	if s.ttl > 0 {
		opts = append(opts, fencelock.WithTTL(time.Duration(s.ttl)*r.tenth))
	}
	if s.minHold > 0 {
		opts = append(opts, fencelock.WithMinHold(time.Duration(s.minHold)*r.tenth))
	}
	try := s.late
	if s.wait > 0 && !try {
		opts = append(opts, fencelock.WithWait(time.Duration(s.wait)*r.tenth))
	}
	delay := r.delayOf(s.key)
	if delay > 0 {
		opts = append(opts, fencelock.WithLockDelay(delay))
	}
	invAt := time.Now()
	inv := r.rec.tick()
	var (
		g   *recipe.MultiGrant
		err error
	)
	if try {
		g, err = recipe.TryAcquireAll(ctx, c, keys, opts...)
	} else {
		stop := r.waitingFor(ctx, i, label, keys)
		actx, cancel := context.WithTimeout(ctx, 3*r.h.TTL)
		g, err = recipe.AcquireAll(actx, c, keys, opts...)
		cancel()
		stop()
	}
	var ls []*fencelock.Lease
	if err == nil {
		ls = g.Leases()
	}
	r.onlyGrantsHeld(ctx, i, stepMulti, label, ls, err)
	if err != nil {
		r.rec.note("client %d worker %d multi %q: %v", i, j, keys, err)
		return
	}
	if want := recipe.CanonicalKeys(keys); !slices.Equal(g.Keys(), want) {
		r.rec.violate("MultiGrantWhole", "client %d's multi-key call on %q returned a grant of %q", i, want, g.Keys())
	}
	r.rec.mu.Lock()
	r.rec.multis++
	r.rec.mu.Unlock()
	recs := make([]*leaseRec, len(ls))
	for n, l := range ls {
		recs[n] = r.rec.lease(i, l, "multi", inv)
		r.rec.options(recs[n], invAt, l.MinHold(), label, "", inv)
		r.rec.delayed(recs[n], delay)
	}
	r.rec.grouped(recs)
	for n, l := range ls {
		r.writeWith(l, recs[n], false)
	}
	if d := time.Duration(s.hold) * r.tenth; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-g.Done():
		case <-ctx.Done():
		}
		t.Stop()
	}
	for n, l := range ls {
		// After the grant's end (a member lost), every member's write is
		// a stale one: the grant releases the others.
		r.writeWith(l, recs[n], isDone(l) || g.Context().Err() != nil)
		r.rec.ended(recs[n], nil)
	}
	closed := false
	select {
	case <-g.Done():
		// Lost, or released by Close: the grant released the others.
		closed = g.Err() == nil && errors.Is(context.Cause(g.Context()), fencelock.ErrClosed)
	default:
	}
	var rerr error
	if !closed {
		rerr = g.Release(ctx)
	}
	now := time.Now()
	for n, l := range ls {
		switch {
		case closed:
		case rerr == nil:
			r.rec.releasedOK(recs[n], l, now)
			r.rec.released(recs[n], !r.rec.heldForMinimum(recs[n], l))
		case l.Err() == nil && errors.Is(rerr, fencelock.ErrNotHeld):
			// The grant ended with another member's loss, or the store
			// no longer had one of its records: not known gone.
		}
		r.after(ctx, l, recs[n], step{late: false, stale: s.stale})
	}
}

// multiCall is a waiting multi-key call in progress.
type multiCall struct {
	client int
	keys   []string
}

// waitingFor registers a waiting multi-key call of client i and watches
// it for wait-for cycles until the returned function is called.
func (r *runner) waitingFor(ctx context.Context, i int, label string, keys []string) (stop func()) {
	r.multiMu.Lock()
	if r.waiting == nil {
		r.waiting = map[string]multiCall{}
	}
	r.waiting[label] = multiCall{i, keys}
	r.multiMu.Unlock()
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		since := map[string]time.Time{} // another call in a cycle with this one: since when
		for {
			t := time.NewTimer(r.tenth)
			select {
			case <-done:
				t.Stop()
				return
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if r.waitCycle(ctx, label, since) {
				return
			}
		}
	}()
	return func() {
		close(done)
		<-watched
		r.multiMu.Lock()
		delete(r.waiting, label)
		r.multiMu.Unlock()
	}
}

// waitCycle lists the store once and reports (and records) whether the
// call label has been in a wait-for cycle with another for a TTL.
func (r *runner) waitCycle(ctx context.Context, label string, since map[string]time.Time) bool {
	if r.stall.Load() {
		return false
	}
	infos, err := r.raw.List(ctx, r.prefix)
	if err != nil {
		return false
	}
	r.multiMu.Lock()
	calls := maps.Clone(r.waiting)
	r.multiMu.Unlock()
	me, ok := calls[label]
	if !ok || r.faults[me.client] {
		return false
	}
	held := map[string][]string{}
	for _, info := range infos {
		if _, ok := calls[info.Label()]; ok {
			held[info.Label()] = append(held[info.Label()], info.Key)
		}
	}
	now := time.Now()
	for other, oc := range calls {
		if other == label || r.faults[oc.client] || r.stall.Load() {
			continue
		}
		mine := slices.ContainsFunc(held[label], func(k string) bool { return slices.Contains(oc.keys, k) })
		theirs := slices.ContainsFunc(held[other], func(k string) bool { return slices.Contains(me.keys, k) })
		if !mine || !theirs {
			delete(since, other)
			continue
		}
		first, ok := since[other]
		if !ok {
			since[other] = now
			continue
		}
		if now.Sub(first) >= r.h.TTL {
			r.rec.violate("MultiNoWaitCycle", "waiting multi-key calls %q (keys %q, holding %q) and %q (keys %q, holding %q) each held a key of the other's set for %v",
				label, me.keys, held[label], other, oc.keys, held[other], now.Sub(first))
			return true
		}
	}
	return false
}
