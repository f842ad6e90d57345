package suite

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/faultproxy"
	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/report"
)

// FaultCallBounds is the call-bound cell: every call of the engine ends
// within its bound, with the store's cause in its error, while the store
// is paused, refuses connections, or vanished after Open (see
// docs/safety-suite.md, "Every call ends within its bound").
const FaultCallBounds = fCallBounds

const fCallBounds = "call-bounds"

// The store faults of the call-bound cell (report.CallBound.Fault).
const (
	// boundPaused: the store stops answering. Every client reaches it
	// through its own faultproxy, which holds every byte (Blackhole) as a
	// SIGSTOPped server would: connections stay open, nothing comes back.
	boundPaused = "paused"
	// boundRefused: nothing listens on the store's port, from Open on.
	boundRefused = "refused"
	// boundVanished: the store's listener and connections go away after
	// Open (the proxy closes), as when the server is stopped.
	boundVanished = "vanished"
)

// Sizes of the call-bound cell.
const (
	// boundDeadline is the caller's deadline of the calls that have one.
	boundDeadline = 2 * time.Second
	// boundReleaseTimeout is the clients' Options.ReleaseTimeout: the one
	// overrun a call may take past its deadline.
	boundReleaseTimeout = 2 * time.Second
	// boundMinSlack is the least slack a call gets past its bound.
	boundMinSlack = time.Second
	// boundCloseGrace is what Close may take past ReleaseTimeout: a tenth
	// of it, at most 0.5s (docs/design.md, "Bounds").
	boundCloseGrace = min(boundReleaseTimeout/10, 500*time.Millisecond)
)

// boundSlackFor is the slack of the cell's bounds: the backend's timing
// slack, at least boundMinSlack, as the generative mode's
// CallEndsWithinBound allows (docs/design.md, "The bounds as a caller
// measures them").
func boundSlackFor(be *backendEnv) time.Duration { return max(boundMinSlack, be.slack) }

// boundCall is one measured call: its name in the report, its bound for
// a client of TTL ttl, and the call itself (l is a lease taken before the
// fault, for the calls that need one).
type boundCall struct {
	name      string
	needLease bool
	bound     func(ttl time.Duration) time.Duration
	call      func(c *fencelock.Client, key string, l *fencelock.Lease) error
}

// boundCalls are the calls the cell measures under each fault, with the
// bounds of the call-bound contract as a caller measures them (the table
// in docs/design.md, "Bounds"; the fault begins before the calls start):
// with a deadline D (the context's, or WithWait's), D plus the one
// overrun (ReleaseTimeout); TryAcquire without one, the TTL plus the
// overrun; Acquire without one, a TTL of continuous failure after a
// request (a queue wait) that may itself take a TTL, plus the overrun;
// Release, ReleaseTimeout. Close: ReleaseTimeout plus its grace.
var boundCalls = []boundCall{
	{name: "TryAcquire", bound: func(ttl time.Duration) time.Duration { return ttl + boundReleaseTimeout },
		call: func(c *fencelock.Client, key string, _ *fencelock.Lease) error {
			return dropLease(c.TryAcquire(context.Background(), key))
		}},
	{name: "TryAcquire, 2s deadline", bound: func(time.Duration) time.Duration { return boundDeadline + boundReleaseTimeout },
		call: func(c *fencelock.Client, key string, _ *fencelock.Lease) error {
			ctx, cancel := context.WithTimeout(context.Background(), boundDeadline)
			defer cancel()
			return dropLease(c.TryAcquire(ctx, key))
		}},
	{name: "Acquire, 2s deadline", bound: func(time.Duration) time.Duration { return boundDeadline + boundReleaseTimeout },
		call: func(c *fencelock.Client, key string, _ *fencelock.Lease) error {
			ctx, cancel := context.WithTimeout(context.Background(), boundDeadline)
			defer cancel()
			return dropLease(c.Acquire(ctx, key))
		}},
	{name: "Acquire, WithWait(2s)", bound: func(time.Duration) time.Duration { return boundDeadline + boundReleaseTimeout },
		call: func(c *fencelock.Client, key string, _ *fencelock.Lease) error {
			return dropLease(c.Acquire(context.Background(), key, fencelock.WithWait(boundDeadline)))
		}},
	{name: "Acquire", bound: func(ttl time.Duration) time.Duration { return 2*ttl + boundReleaseTimeout },
		call: func(c *fencelock.Client, key string, _ *fencelock.Lease) error {
			return dropLease(c.Acquire(context.Background(), key))
		}},
	{name: "Release", needLease: true, bound: func(time.Duration) time.Duration { return boundReleaseTimeout },
		call: func(_ *fencelock.Client, _ string, l *fencelock.Lease) error {
			return l.Release(context.Background())
		}},
}

// errGrantedUnreachable is a measured call's error when an acquire
// succeeded although the store could not be reached.
var errGrantedUnreachable = errors.New("granted while the store was unreachable")

// dropLease turns an acquire's result into its error (a grant under a
// store fault is one too: the store cannot have made it).
func dropLease(l *fencelock.Lease, err error) error {
	if err == nil {
		_ = l.Release(context.Background())
		return errGrantedUnreachable
	}
	return err
}

// callBoundsCell measures every call of boundCalls, and Open and Close,
// under each store fault, on clients of the test process itself (no
// contenders): each call on a client of its own behind a proxy of its
// own, all of a fault's calls at once.
func callBoundsCell(be *backendEnv) cellSpec {
	slack := boundSlackFor(be)
	return cellSpec{fault: fCallBounds,
		setup: fmt.Sprintf("store paused (proxy holds every byte), refusing connections (nothing listening from Open on), vanished after Open (proxy closed); "+
			"ReleaseTimeout %v, deadlines %v, slack %v", boundReleaseTimeout, boundDeadline, slack),
		direct: func(ctx context.Context, c *cell) ([]report.CallBound, error) {
			host, err := singleHost(be.url)
			if err != nil {
				return nil, err
			}
			var all []report.CallBound
			for _, f := range []string{boundPaused, boundVanished, boundRefused} {
				cs, err := measureFault(ctx, be, c.keys[0], host, f, slack)
				all = append(all, cs...)
				if err != nil {
					return all, fmt.Errorf("%s: %w", f, err)
				}
			}
			return all, nil
		}}
}

// singleHost returns the host:port of a URL that names exactly one.
func singleHost(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("the URL does not parse")
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return "", errors.New("the URL does not name exactly one host:port")
	}
	return u.Host, nil
}

// withHost returns raw with its host:port replaced.
func withHost(raw, host string) string {
	u, _ := url.Parse(raw) // parsed by singleHost before
	u.Host = host
	return u.String()
}

// boundOptions are the Options of the cell's clients.
func boundOptions(ttl time.Duration) *fencelock.Options {
	return &fencelock.Options{TTL: ttl, ReleaseTimeout: boundReleaseTimeout, Owner: "safety-bounds"}
}

// closedPort returns a loopback address nothing listens on.
func closedPort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// measured is one client of a fault's measurement, ready for its call.
type measured struct {
	call  boundCall
	key   string
	proxy *faultproxy.Proxy
	cli   *fencelock.Client
	lease *fencelock.Lease
}

// measureFault measures every call under one fault.
func measureFault(ctx context.Context, be *backendEnv, keyBase, host, fault string, slack time.Duration) ([]report.CallBound, error) {
	ttl := be.ttl
	record := func(call string, bound, took time.Duration, err error) report.CallBound {
		cb := report.CallBound{Fault: fault, Call: call, Bound: bound, Slack: slack, Elapsed: took.Round(time.Millisecond)}
		if err != nil {
			cb.Err = driver.RedactText(err.Error(), be.url)
			cb.Cause = namesCause(err)
		}
		return cb
	}
	if fault == boundRefused {
		return measureRefused(ctx, be, keyBase, record)
	}
	// Every call on a client of its own, behind a proxy of its own.
	ms := make([]*measured, 0, len(boundCalls))
	defer func() {
		for _, m := range ms {
			if m.proxy != nil {
				m.proxy.Close()
			}
		}
	}()
	for i, bc := range boundCalls {
		p, err := faultproxy.Listen(host)
		if err != nil {
			return nil, err
		}
		m := &measured{call: bc, key: fmt.Sprintf("%s-%s-%d", keyBase, fault, i), proxy: p}
		ms = append(ms, m)
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		m.cli, err = fencelock.Open(octx, withHost(be.url, p.Addr()), boundOptions(ttl))
		if err == nil && bc.needLease {
			m.lease, err = m.cli.TryAcquire(octx, m.key)
		} else if err == nil {
			// A connection in the pool before the fault.
			_, err = m.cli.Inspect(octx, m.key)
		}
		cancel()
		if err != nil {
			closeAll(ms)
			return nil, fmt.Errorf("setting up %s with the store up: %s", bc.name, driver.RedactText(err.Error(), be.url))
		}
	}
	for _, m := range ms {
		if fault == boundPaused {
			m.proxy.SetMode(faultproxy.Blackhole)
		} else {
			m.proxy.Close()
		}
	}
	out := make([]report.CallBound, len(ms))
	closes := make([]report.CallBound, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := m.call.call(m.cli, m.key, m.lease)
			out[i] = record(m.call.name, m.call.bound(ttl), time.Since(start), err)
			// Close while the fault lasts: bounded by ReleaseTimeout.
			start = time.Now()
			err = m.cli.Close()
			closes[i] = record("Close after "+m.call.name, boundReleaseTimeout+boundCloseGrace, time.Since(start), err)
			closes[i].Err, closes[i].Cause = "", true // Close is judged by its time only
		}()
	}
	// The calls are bounded by the engine, not by the harness: past every
	// bound (and a margin) the harness lifts the fault and closes the
	// clients (a waiting Acquire returns), so that a call that would wait on ends and is
	// measured late.
	if err := awaitBounded(&wg, 2*ttl+boundReleaseTimeout+slack+2*time.Second, func() {
		if fault == boundPaused {
			for _, m := range ms {
				m.proxy.SetMode(faultproxy.Pass)
			}
		}
		closeEach(&wg, ms)
	}); err != nil {
		return nil, err
	}
	if fault == boundPaused {
		for _, m := range ms {
			m.proxy.SetMode(faultproxy.Pass)
		}
	}
	return append(out, slowest(closes)), nil
}

// measureRefused measures Open against a port nothing listens on, and if
// Open succeeds (a driver that connects lazily) every call but Release.
func measureRefused(ctx context.Context, be *backendEnv, keyBase string, record func(string, time.Duration, time.Duration, error) report.CallBound) ([]report.CallBound, error) {
	addr, err := closedPort()
	if err != nil {
		return nil, err
	}
	u := withHost(be.url, addr)
	octx, cancel := context.WithTimeout(ctx, boundDeadline)
	start := time.Now()
	cli, err := fencelock.Open(octx, u, boundOptions(be.ttl))
	took := time.Since(start)
	cancel()
	out := []report.CallBound{record("Open, 2s deadline", boundDeadline+boundReleaseTimeout, took, err)}
	if err != nil {
		return out, nil
	}
	ms := []*measured{{call: boundCalls[0], key: keyBase + "-refused-0", cli: cli}}
	for i, bc := range boundCalls[1:] {
		if bc.needLease {
			continue
		}
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		c, err := fencelock.Open(octx, u, boundOptions(be.ttl))
		cancel()
		if err != nil {
			closeAll(ms)
			return out, fmt.Errorf("a second Open against the same closed port failed where the first succeeded: %s", driver.RedactText(err.Error(), be.url))
		}
		ms = append(ms, &measured{call: bc, key: fmt.Sprintf("%s-refused-%d", keyBase, i+1), cli: c})
	}
	res := make([]report.CallBound, len(ms))
	closes := make([]report.CallBound, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := m.call.call(m.cli, m.key, nil)
			res[i] = record(m.call.name, m.call.bound(be.ttl), time.Since(start), err)
			start = time.Now()
			m.cli.Close()
			closes[i] = record("Close after "+m.call.name, boundReleaseTimeout+boundCloseGrace, time.Since(start), nil)
			closes[i].Cause = true
		}()
	}
	// A call still running past every bound is ended by closing its
	// client, and measured late.
	if err := awaitBounded(&wg, 2*be.ttl+boundReleaseTimeout+2*boundMinSlack, func() { closeEach(&wg, ms) }); err != nil {
		return out, err
	}
	return append(append(out, res...), slowest(closes)), nil
}

// awaitBounded waits for wg; after limit it calls lift (which ends the
// calls still running) and waits a minute more before it gives up.
func awaitBounded(wg *sync.WaitGroup, limit time.Duration, lift func()) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
	}
	lift()
	t.Reset(time.Minute)
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("calls still running %v after they started, the last minute with their clients closed", limit+time.Minute)
	}
}

// closeEach closes every client at once, each Close counted in wg (whose
// count is not zero: calls are still running).
func closeEach(wg *sync.WaitGroup, ms []*measured) {
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.cli.Close()
		}()
	}
}

// closeAll closes the clients of a measurement that could not start.
func closeAll(ms []*measured) {
	for _, m := range ms {
		if m.cli != nil {
			m.cli.Close()
		}
	}
}

// slowest returns the Close that took longest, named "Close (slowest of N)".
func slowest(cs []report.CallBound) report.CallBound {
	s := slices.MaxFunc(cs, func(a, b report.CallBound) int { return int(a.Elapsed - b.Elapsed) })
	s.Call = fmt.Sprintf("Close (slowest of %d: %s)", len(cs), strings.TrimPrefix(s.Call, "Close after "))
	return s
}

// causeWords are what an error must say, besides a context's own
// "context deadline exceeded" or "context canceled", to name the store's
// cause: the network's or the driver's words for a store that refuses,
// resets, closes or does not answer.
var causeWords = []string{
	"refused", "reset", "eof", "broken pipe", "closed", "timeout", "timed out", "i/o", "dial",
	"unreachable", "unavailable", "no reachable", "server selection", "connect", "socket", "lost",
	"no answer from the store",
}

// namesCause reports whether err names the store's cause: not a bare
// context error, not a claim that the key is held without the store's
// failure beside it (an Acquire whose WithWait bound passed matches
// ErrNotAcquired and carries the store's last failure, a
// *fencelock.BackendError), and in its words a network or driver cause
// (causeWords).
func namesCause(err error) bool {
	var be *fencelock.BackendError
	if err == nil || errors.Is(err, errGrantedUnreachable) || errors.Is(err, fencelock.ErrNotAcquired) && !errors.As(err, &be) {
		return false
	}
	msg := strings.ToLower(err.Error())
	msg = strings.ReplaceAll(msg, "context deadline exceeded", "")
	msg = strings.ReplaceAll(msg, "context canceled", "")
	for _, w := range causeWords {
		if strings.Contains(msg, w) {
			return true
		}
	}
	return false
}

// judgeBounds turns the measured calls into the cell's check result: B1
// (every call ended by its bound plus slack) and B2 (every failed call
// named the store's cause; an acquire that succeeded with the store
// unreachable fails it too).
func judgeBounds(calls []report.CallBound) check.Result {
	b1 := check.Property{ID: "B1", Name: "every call ends within its bound",
		Rule: "(call-bounds) With the store paused, refusing connections, or gone after Open, every call returns by its bound plus slack: " +
			"with a deadline D, D + Options.ReleaseTimeout; TryAcquire without one, TTL + ReleaseTimeout; Acquire without one, 2×TTL + ReleaseTimeout; " +
			"Release, ReleaseTimeout; Close, ReleaseTimeout + min(ReleaseTimeout/10, 0.5s) (docs/design.md, \"Bounds\"). A call still waiting past that leaves its caller without an answer it was promised.",
		OK: true}
	b2 := check.Property{ID: "B2", Name: "a failed call names the store's cause",
		Rule: "(call-bounds) The error of a call that failed because of the store says why (connection refused, reset, EOF, a timeout reading it): " +
			"a bare context error, or ErrNotAcquired without the store's failure beside it (the key is not known to be held), hides what to fix. An acquire that succeeds with the store unreachable fails this too.",
		OK: true}
	for _, c := range calls {
		b1.Checked++
		if c.Violation() {
			b1.Count++
			b1.Violations = append(b1.Violations, check.Violation{Msg: fmt.Sprintf("store %s: %s took %v, bound %v + slack %v: %s",
				c.Fault, c.Call, c.Elapsed, c.Bound, c.Slack, orNone(c.Err))})
		}
		if strings.HasPrefix(c.Call, "Close") {
			continue
		}
		if c.Err == "" {
			continue
		}
		b2.Checked++
		if !c.Cause {
			b2.Count++
			b2.Violations = append(b2.Violations, check.Violation{Msg: fmt.Sprintf("store %s: %s after %v: %s", c.Fault, c.Call, c.Elapsed, c.Err)})
		}
	}
	b1.OK, b2.OK = b1.Count == 0, b2.Count == 0
	return check.Result{Properties: []check.Property{b1, b2}}
}

func orNone(s string) string {
	if s == "" {
		return "no error"
	}
	return s
}
