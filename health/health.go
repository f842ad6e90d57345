// Package health reports the health of a fencelock Client and of the
// leases it holds, for Kubernetes liveness and readiness probes and for
// any framework that wants a yes/no with reasons.
//
// A Probe has two kinds of check:
//
//   - One check per watched lease (Watch): it fails when the lease was
//     lost, and when it is held but in its danger zone, its Remaining
//     validity below a threshold: a renewal is overdue, the store has
//     stopped answering or is answering slowly, and if nothing changes the
//     lease will be lost when Remaining reaches zero. A lease that was
//     released (by the holder, or by Client.Close) passes: ending a lease
//     on purpose is not a fault.
//   - The "store" check, present once the Probe's Observer is installed in
//     the Client's Options.Observer: it fails when the store has failed
//     the Client's requests (renewals, acquires, releases) without
//     answering any of them for longer than Options.StoreBound.
//
// A Probe never calls the store: Check, Err and ServeHTTP read what the
// leases and the Client's events already say, so a probe answers in
// microseconds whatever the store does, and a thousand probe requests make
// no request to the store. The store check therefore judges from the
// Client's own traffic: a Client that holds a lease renews it every
// RenewInterval, which is plenty; a Client that makes no request at all
// gives no evidence, and its store check passes.
//
// An election (recipe.Elect) hands its fn the term's *Lease: Watch it
// under a fixed name at the start of each term, and the check follows the
// leadership: failing in the danger zone and after a loss, passing while
// the next term's lease is held or after a clean resignation.
//
// # Kubernetes
//
// Serve the Probe on the port the kubelet probes:
//
//	livenessProbe:
//	  httpGet: {path: /healthz, port: 8080}
//	  periodSeconds: 5
//	  failureThreshold: 3
//
// Which probe to point at it is a choice about what should happen on a
// failure. A liveness failure restarts the container: right for a
// process whose lease was lost and which cannot recover by itself (as
// client-go's leader election does with its HealthzAdaptor), wrong for a
// store outage, which restarting every replica does not cure. A readiness
// failure only takes the pod out of its Service's endpoints: right for
// "this replica is not the leader just now" and for a store outage.
// Serving two Probes, one watching the leases (liveness) and one with the
// store check (readiness), separates the two.
package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
)

// DefaultStoreBound is Options.StoreBound's default: the default lease
// TTL, after which every lease of a Client with default options has been
// lost to the outage anyway.
const DefaultStoreBound = 15 * time.Second

// Options configures a Probe. A nil *Options, and every zero field, means
// the documented default.
type Options struct {
	// StoreBound is how long the store may fail the Client's requests,
	// without answering any, before the store check fails. Default
	// DefaultStoreBound.
	StoreBound time.Duration

	// DangerBelow, if positive, is the Remaining validity below which a
	// held lease's check fails. By default each lease gets its own
	// threshold from its Client's options, scaled to the lease's TTL as
	// the engine scales them: half of TTL − Margin − RenewInterval (the
	// least validity a lease whose renewals succeed has left just before
	// its next renewal), but at most one RenewInterval (the engine's own
	// danger zone, EventDanger). With default options that is 28% of the
	// TTL (4.25s of a 15s TTL): a lease below it has had a renewal fail,
	// or take longer than half the slack the renewal schedule leaves,
	// whereas a healthy lease never goes below it.
	DangerBelow time.Duration

	// Now is the probe's clock for the store check. Default time.Now.
	// (Lease validity is judged by each Client's own Options.Clock.)
	Now func() time.Time
}

// Probe reports the health of a Client and of watched leases. Its
// methods are safe for concurrent use; the zero value is not usable: call
// New.
type Probe struct {
	o Options

	mu      sync.Mutex
	watched map[string]watch
	// The store check, fed by the Observer. observed says whether the
	// Observer was made at all (without it there is no store check).
	observed    bool
	since       time.Time // the last answer, or when the Observer was made
	failing     bool      // a request failed after the last answer
	firstFail   time.Time // the first such failure
	lastFailure error
}

type watch struct {
	lease  *fencelock.Lease
	danger time.Duration
}

// New returns a Probe with no checks: add the store check by installing
// Observer in the Client's options, and lease checks with Watch.
func New(o *Options) *Probe {
	p := &Probe{watched: map[string]watch{}}
	if o != nil {
		p.o = *o
	}
	if p.o.StoreBound <= 0 {
		p.o.StoreBound = DefaultStoreBound
	}
	if p.o.Now == nil {
		p.o.Now = time.Now
	}
	return p
}

// Observer returns a fencelock.Observer that feeds the probe's store
// check and passes every event on to next (nil for none). Install it as
// the Client's Options.Observer, wrapping the observer that was there (a
// metrics adapter, say), before the Client is opened:
//
//	opts.Observer = probe.Observer(opts.Observer)
//
// One Probe's store check describes one store: share a Probe's Observer
// only between Clients of the same store.
//
// The store counts as answering on every event that carries its answer:
// an acquire (granted, refused or waiting on a holder), a renewal, a
// rotation, a release, and a renewal the store refused (it answered "not
// yours"). It counts as failing on a renewal that failed without an
// answer, a failed attempt inside a waiting Acquire, an Acquire or
// TryAcquire that gave up on a *fencelock.BackendError, and a release or
// clean-up that could not reach it.
func (p *Probe) Observer(next fencelock.Observer) fencelock.Observer {
	p.mu.Lock()
	if !p.observed {
		p.observed = true
		p.since = p.o.Now()
	}
	p.mu.Unlock()
	return observer{p: p, next: next}
}

type observer struct {
	p    *Probe
	next fencelock.Observer
}

func (o observer) Observe(e fencelock.Event) {
	o.p.observe(e)
	if o.next != nil {
		o.next.Observe(e)
	}
}

// answered and failed classify an event as evidence about the store.
func answered(e fencelock.Event) bool {
	switch e.Kind {
	case fencelock.EventAcquired, fencelock.EventNotAcquired, fencelock.EventWaiting,
		fencelock.EventRenewed, fencelock.EventRotated, fencelock.EventReleased:
		return true
	case fencelock.EventRenewFailed:
		return e.Definite
	}
	return false
}

func failed(e fencelock.Event) bool {
	var be *fencelock.BackendError
	switch e.Kind {
	case fencelock.EventRenewFailed:
		return !e.Definite
	case fencelock.EventAcquireRetry, fencelock.EventReleaseFailed, fencelock.EventCleanupFailed:
		return true
	case fencelock.EventAcquireFailed:
		return errors.As(e.Err, &be)
	}
	return false
}

func (p *Probe) observe(e fencelock.Event) {
	ok, bad := answered(e), failed(e)
	if !ok && !bad {
		return
	}
	now := p.o.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if ok {
		p.since, p.failing, p.lastFailure = now, false, nil
		return
	}
	if !p.failing {
		p.failing, p.firstFail = true, now
	}
	p.lastFailure = e.Err
}

// Watch adds (or replaces) the check named name: the health of lease l
// of Client c. c gives the default danger threshold (see
// Options.DangerBelow); it may be nil when DangerBelow is set. For an
// election, Watch each term's lease under the same name as the term
// starts.
func (p *Probe) Watch(name string, c *fencelock.Client, l *fencelock.Lease) {
	if l == nil {
		return
	}
	w := watch{lease: l, danger: p.o.DangerBelow}
	if w.danger <= 0 {
		w.danger = dangerBelow(c, l)
	}
	p.mu.Lock()
	p.watched[name] = w
	p.mu.Unlock()
}

// Forget removes the check named name, if any.
func (p *Probe) Forget(name string) {
	p.mu.Lock()
	delete(p.watched, name)
	p.mu.Unlock()
}

// dangerBelow is the default threshold of a lease of c (see
// Options.DangerBelow). Without a Client, the engine's default ratios
// (RenewInterval TTL/3, Margin TTL/10) stand in for its options.
func dangerBelow(c *fencelock.Client, l *fencelock.Lease) time.Duration {
	ttl := l.TTL()
	ivl, margin := ttl/3, ttl/10
	if c != nil {
		o := c.Options()
		if o.TTL > 0 {
			ivl = scale(o.RenewInterval, ttl, o.TTL)
			margin = scale(o.Margin, ttl, o.TTL)
		}
	}
	return max(0, min(ivl, (ttl-margin-ivl)/2))
}

// scale returns d × num / den without overflow for durations up to
// fencelock.MaxTTL.
func scale(d, num, den time.Duration) time.Duration {
	if num == den || den == 0 {
		return d
	}
	return time.Duration(float64(d) * float64(num) / float64(den))
}

// Result is the outcome of one check.
type Result struct {
	// Name is the check's name: "store", or the name given to Watch.
	Name string `json:"name"`
	// OK reports whether the check passed.
	OK bool `json:"ok"`
	// Reason says what the check found, in a sentence.
	Reason string `json:"reason"`
}

// Report is the outcome of every check, in name order ("store" first).
type Report struct {
	// OK reports whether every check passed (true with no checks).
	OK bool `json:"ok"`
	// Checks are the checks' results.
	Checks []Result `json:"checks"`
}

// Err returns nil if the report is healthy, or an error naming each
// failing check and its reason.
func (r Report) Err() error {
	if r.OK {
		return nil
	}
	var bad []string
	for _, c := range r.Checks {
		if !c.OK {
			bad = append(bad, c.Name+": "+c.Reason)
		}
	}
	return &UnhealthyError{Failing: bad}
}

// UnhealthyError is the error of a failing Report: ErrUnhealthy, with
// each failing check.
type UnhealthyError struct {
	// Failing holds "name: reason" for each failing check.
	Failing []string
}

// Error implements error.
func (e *UnhealthyError) Error() string {
	return "fencelock/health: unhealthy: " + strings.Join(e.Failing, "; ")
}

// Is reports whether target is ErrUnhealthy.
func (e *UnhealthyError) Is(target error) bool { return target == ErrUnhealthy }

// ErrUnhealthy matches the error of every failing check (errors.Is).
var ErrUnhealthy = errors.New("fencelock/health: unhealthy")

// Check runs every check and returns the report. It makes no request to
// the store and does not block on one.
func (p *Probe) Check() Report {
	p.mu.Lock()
	ws := make(map[string]watch, len(p.watched))
	for n, w := range p.watched {
		ws[n] = w
	}
	results := []Result{}
	if p.observed {
		results = append(results, p.storeLocked())
	}
	p.mu.Unlock()
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range ws {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		results = append(results, leaseResult(n, ws[n]))
	}
	r := Report{OK: true, Checks: results}
	for _, c := range results {
		r.OK = r.OK && c.OK
	}
	return r
}

// Err runs every check and returns nil when all pass, or an
// *UnhealthyError (matching ErrUnhealthy) naming each failing one: the
// probe as a plain function, for frameworks other than net/http.
func (p *Probe) Err() error { return p.Check().Err() }

func (p *Probe) storeLocked() Result {
	r := Result{Name: "store", OK: true}
	if !p.failing {
		r.Reason = "the store answered the client's last request"
		return r
	}
	now := p.o.Now()
	silent := now.Sub(p.since)
	cause := "no cause given"
	if p.lastFailure != nil {
		cause = p.lastFailure.Error()
	}
	if silent <= p.o.StoreBound {
		r.Reason = fmt.Sprintf("requests have failed for %v (within the bound of %v): %s", round(now.Sub(p.firstFail)), p.o.StoreBound, cause)
		return r
	}
	r.OK = false
	r.Reason = fmt.Sprintf("the store has not answered for %v, more than the bound of %v; last failure: %s (check the store's address and health, and the network between)", round(silent), p.o.StoreBound, cause)
	return r
}

func leaseResult(name string, w watch) Result {
	l := w.lease
	r := Result{Name: name}
	select {
	case <-l.Done():
		if err := l.Err(); err != nil {
			r.Reason = fmt.Sprintf("lease on %q lost: %v", l.Key(), err)
			return r
		}
		r.OK = true
		r.Reason = fmt.Sprintf("lease on %q was released", l.Key())
		return r
	default:
	}
	rem := l.Remaining()
	if rem < w.danger {
		r.Reason = fmt.Sprintf("lease on %q (token %d) is in its danger zone: %v of validity left, below %v; its renewals are failing or late, and it is lost when none succeeds in time", l.Key(), l.Token(), round(rem), round(w.danger))
		return r
	}
	r.OK = true
	r.Reason = fmt.Sprintf("lease on %q (token %d) held, %v of validity left", l.Key(), l.Token(), round(rem))
	return r
}

func round(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// ServeHTTP writes the report as JSON ({"ok":…,"checks":[{"name",
// "ok","reason"},…]}) with status 200 when every check passes and 503
// Service Unavailable otherwise. It answers every method; a HEAD request
// gets the status alone.
func (p *Probe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rep := p.Check()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	status := http.StatusOK
	if !rep.OK {
		status = http.StatusServiceUnavailable
	}
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	_ = json.NewEncoder(w).Encode(rep)
}
