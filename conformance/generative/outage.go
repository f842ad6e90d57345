package generative

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance"
	"pgregory.net/rapid"
)

// Outage programs: the store fails as a whole and every call must still
// end within its bound (docs/generative.md, "Every call ends within its
// bound"). Two clients; the first may hold the key when the outage
// begins. Then the store, as the clients' wrapping drivers show it:
//
//   - stops answering: every request blocks until its context ends (as
//     a SIGSTOPped server, or a proxy that stops forwarding);
//   - refuses: every request fails at once with "connection refused"
//     (nothing listens on the port any more);
//   - vanishes: refuses from right after Open (the server stopped after
//     the clients connected).
//
// During the outage the clients call TryAcquire and Acquire, with and
// without a deadline, the holder releases, and both close. Each call's
// start, end, deadline and error are recorded and checked for:
//
//   - CallEndsWithinBound: every call ends by its bound in the table of
//     docs/design.md ("The bounds as a caller measures them"), plus
//     slack: a call with a deadline D by D + ReleaseTimeout; a
//     TryAcquire without one by its start + TTL + ReleaseTimeout; an
//     Acquire without one by the later of its start and the outage's
//     beginning + 2×TTL + ReleaseTimeout; Release by its start +
//     ReleaseTimeout; Close by its start + ReleaseTimeout + its grace
//     (a tenth of ReleaseTimeout, at most 0.5s). Slack is the harness's
//     Slack, at least 1s (the safety suite's call-bounds cell judges by
//     the same table and slack policy).
//   - StoreCauseInError: an acquire that failed while the store refused
//     says so (errors.Is(err, syscall.ECONNREFUSED), "connection
//     refused" in its text); one that failed while it did not answer
//     carries the store's error (not a bare context error).
//
// Run logs the largest overrun measured past each kind of call's nominal
// end (its deadline; start + TTL; its start for Release and Close).

type outageKind int

const (
	outageNone   outageKind = iota
	outageStall             // requests block until their context ends
	outageRefuse            // requests fail at once: connection refused
	outageVanish            // refused from right after Open
	outagePause             // requests wait until the pause ends (a paused store), or their context
)

var outageNames = [...]string{"none", "stall", "refuse", "vanish", "pause"}

// verbs says what the store does in each outage, for messages.
var outageVerbs = [...]string{"answers", "stops answering", "refuses connections", "vanished after Open", "pauses"}

func (k outageKind) String() string { return outageNames[k] }

// errNotAnswering is the store's cause for a request that got no answer
// before its context ended: what a driver reports as an I/O timeout.
var errNotAnswering = errors.New("generative: the store did not answer")

// notAnswering is the error of a request the store left unanswered: it
// matches errNotAnswering and the context's error.
type notAnswering struct{ ctxErr error }

func (e notAnswering) Error() string {
	if e.ctxErr == nil {
		return errNotAnswering.Error()
	}
	return errNotAnswering.Error() + ": " + e.ctxErr.Error()
}
func (e notAnswering) Is(target error) bool { return target == errNotAnswering }
func (e notAnswering) Unwrap() error        { return e.ctxErr }

// refused is the error of a request to a store nobody listens for, as
// Go's net package reports it.
func refused() error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
}

// setOutage makes the store, as this client sees it, fail with k from
// now on (outageNone heals it). A stall ends its blocked requests after
// limit at the latest, so that a call the engine does not bound still
// ends (late, and reported).
func (w *faulty) setOutage(k outageKind, limit time.Duration) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	if w.healed != nil && k != outageStall && k != outagePause {
		close(w.healed)
		w.healed = nil
		if w.capTimer != nil {
			w.capTimer.Stop()
		}
	}
	w.out = k
	switch k {
	case outageStall, outagePause:
		if w.healed == nil {
			w.healed = make(chan struct{})
		}
		if limit > 0 && w.capTimer == nil {
			capped := make(chan struct{})
			w.capped = capped
			w.capTimer = time.AfterFunc(limit, func() { close(capped) })
		}
	}
}

// outage applies the current outage to one request: nil at once if the
// store answers; the refusal; or, for a stall, blocks until ctx ends (or
// the stall's limit passes) and returns the unanswered request's error.
// In a pause, the request takes its turn in the paused store's queue
// (turn, never nil then) and blocks until the pause ends and every
// request that reached the store before it was applied (nil: the request
// goes on, and its caller calls turn.done once it was applied), or ctx
// ends; then healed is the channel closed at the pause's end, after which
// the store applies the request in its turn.
func (w *faulty) outage(ctx context.Context) (healed <-chan struct{}, turn *pauseTurn, err error) {
	w.outMu.Lock()
	k, h, capped := w.out, w.healed, w.capped
	if k == outageNone && w.pauseTail != nil {
		select {
		case <-w.pauseTail:
			w.pauseTail = nil // the queue of the last pause is applied
		default:
		}
	}
	if k == outagePause || k == outageNone && w.pauseTail != nil {
		// Behind what reached the store before: in a pause, or just
		// after one while the store still applies its queue.
		turn = &pauseTurn{prev: w.pauseTail, mine: make(chan struct{})}
		w.pauseTail = turn.mine
	}
	w.outMu.Unlock()
	switch k {
	case outageRefuse, outageVanish:
		return nil, nil, refused()
	case outageStall:
		select {
		case <-ctx.Done():
			return nil, nil, notAnswering{ctx.Err()}
		case <-capped:
			return nil, nil, notAnswering{}
		case <-h:
			return nil, nil, nil
		}
	case outagePause:
		select {
		case <-ctx.Done():
			return h, turn, notAnswering{ctx.Err()}
		case <-h:
		}
		if err := turn.wait(ctx); err != nil {
			return h, turn, notAnswering{err}
		}
		return nil, turn, nil
	case outageNone:
		if err := turn.wait(ctx); err != nil {
			return healedAlready, turn, notAnswering{err}
		}
		return nil, turn, nil
	}
	return nil, nil, nil
}

// healedAlready is the healed channel of a request that queued behind a
// pause that has ended.
var healedAlready = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// pauseTurn is a request's place in a paused store's queue. A paused
// server (SIGSTOPped, or a stalled disk) reads what its connection
// delivered once it runs again, in the order it arrived: a clean-up the
// engine sent after the acquire it gave up on is applied after that
// acquire, never before it, whichever of their callers gave up.
type pauseTurn struct {
	prev <-chan struct{} // closed once the request before it was applied; nil: none
	mine chan struct{}   // closed by done
	once sync.Once
}

// wait blocks until the requests before t were applied, or ctx ends; nil
// at once for a nil t.
func (t *pauseTurn) wait(ctx context.Context) error {
	if t == nil || t.prev == nil {
		return nil
	}
	select {
	case <-t.prev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// done lets the next request in the queue go once the requests before t
// were applied too (a request whose caller gave up may be done before
// the late request ahead of it was applied, and the queue stays in
// order); nil-safe, and idempotent.
func (t *pauseTurn) done() {
	if t == nil {
		return
	}
	t.once.Do(func() {
		if t.prev == nil {
			close(t.mine)
			return
		}
		select {
		case <-t.prev:
			close(t.mine)
		default:
			go func() {
				<-t.prev
				close(t.mine)
			}()
		}
	})
}

type boundOp int

const (
	boundTry boundOp = iota
	boundTryDeadline
	boundAcquire
	boundAcquireDeadline
	boundRelease
	boundClose
)

var boundOpNames = [...]string{"TryAcquire", "TryAcquire with deadline", "Acquire", "Acquire with deadline", "Release", "Close"}

func (o boundOp) String() string { return boundOpNames[o] }

type boundCall struct {
	op       boundOp
	client   int
	start    int // tenths of the TTL after the outage began
	deadline int // tenths of the TTL after the call's start (the *Deadline ops)
}

type outageProg struct {
	kind   outageKind
	at     int  // tenths of the TTL after the start when the outage begins
	holder bool // client 0 holds the key when the outage begins
	calls  []boundCall
}

func (p outageProg) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  the store %s at %d/10 TTL, holder %v\n", outageVerbs[p.kind], p.at, p.holder)
	for _, c := range p.calls {
		fmt.Fprintf(&b, "  client %d: %s at +%d/10 TTL", c.client, c.op, c.start)
		if c.op == boundTryDeadline || c.op == boundAcquireDeadline {
			fmt.Fprintf(&b, ", deadline +%d/10", c.deadline)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func genOutage(t *rapid.T) outageProg {
	p := outageProg{kind: rapid.SampledFrom([]outageKind{outageStall, outageRefuse, outageVanish}).Draw(t, "outage")}
	if p.kind != outageVanish {
		p.at = rapid.IntRange(1, 5).Draw(t, "outageAt")
		p.holder = rapid.Bool().Draw(t, "holder")
	}
	for range rapid.IntRange(1, 4).Draw(t, "boundCalls") {
		c := boundCall{
			op:       boundOp(rapid.IntRange(0, int(boundAcquireDeadline)).Draw(t, "boundOp")),
			client:   rapid.IntRange(0, 1).Draw(t, "boundClient"),
			start:    rapid.IntRange(0, 5).Draw(t, "boundStart"),
			deadline: rapid.SampledFrom([]int{1, 5, 30}).Draw(t, "boundDeadline"),
		}
		p.calls = append(p.calls, c)
	}
	if p.holder {
		p.calls = append(p.calls, boundCall{op: boundRelease, client: 0, start: rapid.IntRange(0, 15).Draw(t, "releaseAt")})
	}
	return p
}

// callRec is one call of an outage program as its caller saw it.
type callRec struct {
	op            boundOp
	client        int
	start, end    time.Time
	deadline      time.Time // zero: none
	outageAt      time.Time // when the outage began (zero: not yet when the call started)
	ttl, overrun  time.Duration
	err           error
	bound, nomEnd time.Time
}

// boundStats keeps the largest overrun past each kind of call's nominal
// end, across a Run.
type boundStats struct {
	mu    sync.Mutex
	max   map[string]time.Duration
	calls int64
}

func (b *boundStats) add(c callRec) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.max == nil {
		b.max = map[string]time.Duration{}
	}
	b.calls++
	name := c.op.String()
	if d, ok := b.max[name]; !ok || c.overrun > d {
		b.max[name] = c.overrun
	}
}

func (b *boundStats) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := make([]string, 0, len(b.max))
	for n := range b.max {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %v", n, b.max[n].Round(time.Millisecond)))
	}
	return fmt.Sprintf("%d calls during outages; largest overrun past the nominal end: %s", b.calls, strings.Join(parts, ", "))
}

// boundSlack is the slack of CallEndsWithinBound: h.Slack, at least 1s
// (docs/design.md, "The bounds as a caller measures them").
func boundSlack(h conformance.Harness) time.Duration { return max(h.Slack, time.Second) }

// outageCheck runs one generated outage program as Run's property does
// for lock programs.
func outageCheck(rt *rapid.T, h conformance.Harness, o *Options, stats *Stats, bs *boundStats, failed *failures) {
	p := genOutage(rt)
	body := func(rt *rapid.T) {
		if o.Fresh != nil {
			o.Fresh()
		}
		rec, calls, err := runOutage(rt.Context(), h, p)
		if err != nil {
			rt.Fatalf("generative: outage: %v", err)
		}
		atomic.AddInt64(&stats.Programs, 1)
		var fail []string
		for _, c := range calls {
			bs.add(c)
		}
		for _, v := range checkBounds(calls, p.kind) {
			if why, ok := o.Known[v.property]; ok {
				atomic.AddInt64(&stats.Known, 1)
				rt.Logf("known violation (%s): %s", why, v)
				continue
			}
			fail = append(fail, v.String())
		}
		if len(fail) > 0 {
			failed.add(fail)
			rt.Fatalf("outage invariants violated:\n  %s\noutage program:\n%s\nhistory:\n%s", strings.Join(fail, "\n  "), p, rec.trace())
		}
	}
	if o.SyncTest {
		rapid.SyncTest(rt, body)
	} else {
		body(rt)
	}
}

func runOutage(ctx context.Context, h conformance.Harness, p outageProg) (*recorder, []callRec, error) {
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	key := "generative-" + hex.EncodeToString(rnd[:]) + "/outage"
	tenth := h.TTL / 10
	rt := releaseTimeout(h.TTL)
	rec := newRecorder()
	limit := 2 * (h.TTL + rt + boundSlack(h))

	type client struct {
		c *fencelock.Client
		w *faulty
	}
	var clients [2]client
	for i := range clients {
		inner, err := h.Open(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("Harness.Open: %w", err)
		}
		w := newFaulty(inner, faults{}, tenth, rt, rec, i)
		c, err := fencelock.New(w.backend(), &fencelock.Options{
			TTL:            h.TTL,
			MinBackoff:     2 * time.Millisecond,
			MaxBackoff:     max(h.TTL/8, 10*time.Millisecond),
			ReleaseTimeout: rt,
			Owner:          fmt.Sprintf("generative-outage-%d", i),
		})
		if err != nil {
			inner.Close()
			return nil, nil, fmt.Errorf("fencelock.New: %w", err)
		}
		clients[i] = client{c, w}
	}
	defer func() {
		for _, cl := range clients {
			cl.w.setOutage(outageNone, 0)
			cl.w.settle()
			_ = cl.w.b.Close()
		}
	}()
	var held *fencelock.Lease
	if p.holder {
		l, err := clients[0].c.TryAcquire(ctx, key)
		if err != nil {
			rec.note("holder's TryAcquire: %v", err)
		} else {
			held = l
			rec.note("client 0 holds %q, token %d", key, l.Token())
		}
	}
	start := time.Now()
	sleepCtx(ctx, time.Duration(p.at)*tenth)
	outageAt := time.Now()
	for _, cl := range clients {
		cl.w.setOutage(p.kind, limit)
	}
	rec.note("the store %s", outageVerbs[p.kind])
	_ = start

	var (
		mu    sync.Mutex
		calls []callRec
		wg    sync.WaitGroup
	)
	record := func(c callRec) {
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
		rec.note("client %d %s: %v after %v", c.client, c.op, c.err, c.end.Sub(c.start).Round(time.Millisecond))
	}
	for _, bc := range p.calls {
		wg.Go(func() {
			sleepCtx(ctx, time.Duration(bc.start)*tenth-time.Since(outageAt))
			c := callRec{op: bc.op, client: bc.client, ttl: h.TTL, outageAt: outageAt}
			// A watchdog ends a call the engine does not bound (it
			// is then reported), without giving it a deadline.
			cctx, stop := context.WithCancel(ctx)
			defer stop()
			watchdog := time.AfterFunc(limit, stop)
			defer watchdog.Stop()
			if bc.op == boundTryDeadline || bc.op == boundAcquireDeadline {
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(cctx, time.Duration(bc.deadline)*tenth)
				defer cancel()
				c.deadline, _ = cctx.Deadline()
			}
			cl := clients[bc.client].c
			c.start = time.Now()
			var l *fencelock.Lease
			switch bc.op {
			case boundTry, boundTryDeadline:
				l, c.err = cl.TryAcquire(cctx, key)
			case boundAcquire, boundAcquireDeadline:
				l, c.err = cl.Acquire(cctx, key)
			case boundRelease:
				if held == nil {
					return
				}
				c.err = held.Release(cctx)
			}
			c.end = time.Now()
			if l != nil {
				rec.violate("NoGrantWithoutStore", "client %d %s returned a lease (token %d) while the store %s", bc.client, bc.op, l.Token(), outageVerbs[p.kind])
				_ = l.Release(ctx)
			}
			record(c)
		})
	}
	wg.Wait()
	for i, cl := range clients {
		c := callRec{op: boundClose, client: i, ttl: h.TTL, outageAt: outageAt, start: time.Now()}
		c.err = cl.c.Close()
		c.end = time.Now()
		record(c)
	}
	for i := range calls {
		calls[i].bound, calls[i].nomEnd = callBound(calls[i], h)
		calls[i].overrun = calls[i].end.Sub(calls[i].nomEnd)
	}
	return rec, calls, nil
}

// callBound returns when c must have ended, and its nominal end (what
// the bound adds ReleaseTimeout and slack to).
func callBound(c callRec, h conformance.Harness) (bound, nominal time.Time) {
	rt := releaseTimeout(h.TTL)
	slack := boundSlack(h)
	switch {
	case !c.deadline.IsZero():
		nominal = c.deadline
	case c.op == boundTry:
		nominal = c.start.Add(c.ttl)
	case c.op == boundAcquire:
		// Failure from the outage's beginning, or the call's start if
		// later: one TTL of failure, after a request (a queue wait)
		// that may itself take a TTL.
		from := c.start
		if c.outageAt.After(from) {
			from = c.outageAt
		}
		nominal = from.Add(2 * c.ttl)
	case c.op == boundClose:
		nominal = c.start.Add(closeGrace(rt))
	default: // Release
		nominal = c.start
	}
	return nominal.Add(rt + slack), nominal
}

// closeGrace is the time Client.Close may take past ReleaseTimeout rt: a
// tenth of it, at most 0.5s (docs/design.md, "Bounds").
func closeGrace(rt time.Duration) time.Duration { return min(rt/10, 500*time.Millisecond) }

// queuedBehind reports whether acquire call i may have had its attempt
// end while it waited for its client's lane (the engine coalesces a
// client's acquire attempts: docs/internals.md, "Coalescing"): another
// acquire call of its client ran at the same time, so a request of the
// lane may have been in flight for the whole of the attempt's bound, and
// the attempt never reached the store to get its error. Its error must
// still say that the store did not answer within the request's bound
// (a context.DeadlineExceeded that asks whether the store is reachable),
// not be a bare context error.
func queuedBehind(calls []callRec, i int) bool {
	c := calls[i]
	if !errors.Is(c.err, context.DeadlineExceeded) || !strings.Contains(c.err.Error(), "is the store reachable?") {
		return false
	}
	for j, d := range calls {
		if j != i && d.client == c.client && d.op != boundRelease && d.op != boundClose &&
			d.start.Before(c.end) && d.end.After(c.start) {
			return true
		}
	}
	return false
}

// checkBounds checks an outage program's calls.
func checkBounds(calls []callRec, kind outageKind) []violation {
	var vs []violation
	for i, c := range calls {
		if c.end.After(c.bound) {
			dl := "no deadline"
			if !c.deadline.IsZero() {
				dl = fmt.Sprintf("deadline +%v", c.deadline.Sub(c.start).Round(time.Millisecond))
			}
			vs = append(vs, violation{"CallEndsWithinBound", fmt.Sprintf("client %d's %s (%s, TTL %v) while the store %s took %v, %v past its bound (%v after its nominal end): %v",
				c.client, c.op, dl, c.ttl, outageVerbs[kind], c.end.Sub(c.start).Round(time.Millisecond), c.end.Sub(c.bound).Round(time.Millisecond), c.bound.Sub(c.nomEnd), c.err)})
		}
		if c.err == nil || c.op == boundRelease || c.op == boundClose || c.start.Before(c.outageAt) {
			continue
		}
		switch kind {
		case outageRefuse, outageVanish:
			if !errors.Is(c.err, syscall.ECONNREFUSED) || !strings.Contains(c.err.Error(), "connection refused") {
				vs = append(vs, violation{"StoreCauseInError", fmt.Sprintf("client %d's %s while the store refused connections returned %q, which does not say so (errors.Is(err, syscall.ECONNREFUSED) %v)",
					c.client, c.op, c.err, errors.Is(c.err, syscall.ECONNREFUSED))})
			}
		case outageStall:
			if !errors.Is(c.err, errNotAnswering) && !queuedBehind(calls, i) {
				vs = append(vs, violation{"StoreCauseInError", fmt.Sprintf("client %d's %s while the store did not answer returned %q, without the store's error %q",
					c.client, c.op, c.err, errNotAnswering)})
			}
		}
	}
	return vs
}
