package otel

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/histogram"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the Observer's meter and tracer.
const ScopeName = "github.com/fencelock/fencelock/observe/otel"

// Default histogram bucket boundaries, in seconds.
var (
	// DefaultWaitBuckets cover an uncontended grant (a millisecond) up to a
	// wait of five minutes.
	DefaultWaitBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	// DefaultHoldBuckets cover a short critical section (10ms) up to a lease
	// held for a day.
	DefaultHoldBuckets = []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600}
	// DefaultLatencyBuckets cover a renewal's round trip from half a
	// millisecond to five seconds.
	DefaultLatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
)

// Options configures an Observer. A nil *Options, and every zero field,
// means the documented default.
type Options struct {
	// KeyLabel, if set, adds a "key" attribute to every data point, with the
	// value KeyLabel(key) (for fencelock.fence.rejected, KeyLabel(resource)).
	// It must map the unbounded space of keys onto a small, bounded set, such
	// as a prefix: every distinct value is a full set of time series. It
	// must be safe for concurrent use. Default nil: no key attribute.
	KeyLabel func(key string) string

	// SpanKeys puts the full lock key on spans as fencelock.key. Default
	// false: keys may carry user or tenant identifiers.
	SpanKeys bool

	// WaitBuckets are the bucket boundaries of fencelock.acquire.wait.
	// Default DefaultWaitBuckets.
	WaitBuckets []float64

	// HoldBuckets are the bucket boundaries of fencelock.hold. Default
	// DefaultHoldBuckets.
	HoldBuckets []float64

	// LatencyBuckets are the bucket boundaries of fencelock.renew.latency.
	// Default DefaultLatencyBuckets.
	LatencyBuckets []float64
}

// Validate reports the first option that is out of range, as a
// *fencelock.InvalidOptionError: bucket boundaries must be strictly
// increasing.
func (o *Options) Validate() error {
	_, err := o.resolve()
	return err
}

func (o *Options) resolve() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	for _, b := range []struct {
		name string
		v    *[]float64
		def  []float64
	}{
		{"WaitBuckets", &r.WaitBuckets, DefaultWaitBuckets},
		{"HoldBuckets", &r.HoldBuckets, DefaultHoldBuckets},
		{"LatencyBuckets", &r.LatencyBuckets, DefaultLatencyBuckets},
	} {
		v, err := histogram.Buckets(b.name, *b.v, b.def)
		if err != nil {
			return r, err
		}
		*b.v = v
	}
	return r, nil
}

// Observer turns fencelock events into OpenTelemetry metrics and spans. It
// implements fencelock.Observer and is safe for concurrent use. Create it
// with New.
type Observer struct {
	o      Options
	tracer trace.Tracer

	acquire       metric.Int64Counter
	contended     metric.Int64Counter
	retry         metric.Int64Counter
	wait          metric.Float64Histogram
	hold          metric.Float64Histogram
	renew         metric.Int64Counter
	latency       metric.Float64Histogram
	rotated       metric.Int64Counter
	danger        metric.Int64Counter
	lost          metric.Int64Counter
	release       metric.Int64Counter
	cleanupFailed metric.Int64Counter
	fenceRejected metric.Int64Counter
	held          metric.Int64UpDownCounter

	// sets caches the attribute sets of each (backend, key label) pair.
	mu   sync.RWMutex
	sets map[setKey]*attrSets
	// leases holds the owner of every lease seen acquired and not yet seen
	// ending, so each lease ends once in fencelock.leases.held and
	// fencelock.hold.
	leasesMu sync.Mutex
	leases   map[string]struct{} // by owner
}

var _ fencelock.Observer = (*Observer)(nil)

type setKey struct{ backend, key string }

// attrSets holds one (backend, key label) pair's measurement options, built
// once so that an event costs no attribute sorting and no allocation.
type attrSets struct {
	base                                              opt
	acquired, notAcquired, acquireFailed              opt
	holdReleased, holdLost                            opt
	renewOK, renewTransient, renewDefinite            opt
	lostExpiry, lostNotHeld, lostRegressed, lostOther opt
	releaseOK, releaseNotHeld, releaseFailed          opt
}

// opt is one attribute set as ready-made option lists for Add and Record.
type opt struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newOpt(kv ...attribute.KeyValue) opt {
	o := metric.WithAttributeSet(attribute.NewSet(kv...))
	return opt{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

// New returns an Observer that records on mp and tp; a nil provider means
// the otel global one. With a noop.TracerProvider the Observer does no span
// work at all. A nil opts means defaults; invalid options return a
// *fencelock.InvalidOptionError, and a failure to create an instrument is
// returned as is.
func New(mp metric.MeterProvider, tp trace.TracerProvider, opts *Options) (*Observer, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(ScopeName)
	var tracer trace.Tracer
	if _, off := tp.(noop.TracerProvider); !off {
		tracer = tp.Tracer(ScopeName) // nil: no span work at all
	}
	ob := &Observer{o: o, tracer: tracer, sets: make(map[setKey]*attrSets), leases: make(map[string]struct{})}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	ob.acquire = counter("fencelock.acquire", "{acquire}", "Acquire and TryAcquire calls by result: acquired, not_acquired (TryAcquire found the key held), failed (context ended or backend failed).")
	ob.contended = counter("fencelock.acquire.contended", "{acquire}", "Grants that found the key held by someone else at least once before succeeding.")
	ob.retry = counter("fencelock.acquire.retry", "{attempt}", "Attempts inside a waiting Acquire that failed transiently and were retried.")
	ob.wait = histogram("fencelock.acquire.wait", "Time from an Acquire or TryAcquire call to its grant, refusal or failure.", o.WaitBuckets)
	ob.hold = histogram("fencelock.hold", "How long leases were held, by how they ended: released or lost.", o.HoldBuckets)
	ob.renew = counter("fencelock.renew", "{renewal}", "Renewals by result: ok, transient (failed, will be retried), definite (refused by the store; the lease is lost).")
	ob.latency = histogram("fencelock.renew.latency", "Round trip of successful renewals.", o.LatencyBuckets)
	ob.rotated = counter("fencelock.token.rotated", "{rotation}", "Renewals that issued a new, higher fencing token.")
	ob.danger = counter("fencelock.danger_zone", "{lease}", "Leases that entered the danger zone: renewals failing and less than one renew interval of validity left.")
	ob.lost = counter("fencelock.lost", "{lease}", "Leases that ended without Release, by cause: local_expiry, not_held (taken or expired in the store), token_regressed, other.")
	ob.release = counter("fencelock.release", "{release}", "Release calls by result: ok, not_held (the store no longer had the lease: work may not have been exclusive), failed (store unreachable).")
	ob.cleanupFailed = counter("fencelock.cleanup_failed", "{cleanup}", "Failed removals of what an abandoned acquire or a lost lease left in the store (it expires with its TTL).")
	ob.fenceRejected = counter("fencelock.fence.rejected", "{write}", "Writes a fencelock.Fence refused because they carried a stale fencing token.")
	held, err := m.Int64UpDownCounter("fencelock.leases.held", metric.WithUnit("{lease}"), metric.WithDescription("Leases this process holds now."))
	ob.held = held
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.KeyLabel == nil {
		ob.fenceRejected.Add(context.Background(), 0) // the one series exists from the start
	}
	return ob, nil
}

// setsFor returns the measurement options for e's backend and key label.
func (o *Observer) setsFor(e *fencelock.Event) *attrSets {
	k := setKey{backend: e.Backend}
	if o.o.KeyLabel != nil {
		k.key = o.o.KeyLabel(e.Key)
	}
	o.mu.RLock()
	s, ok := o.sets[k]
	o.mu.RUnlock()
	if ok {
		return s
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if s, ok := o.sets[k]; ok {
		return s
	}
	base := []attribute.KeyValue{attribute.String("backend", k.backend)}
	if o.o.KeyLabel != nil {
		base = append(base, attribute.String("key", k.key))
	}
	with := func(name, value string) opt {
		return newOpt(append(append([]attribute.KeyValue(nil), base...), attribute.String(name, value))...)
	}
	s = &attrSets{
		base:           newOpt(base...),
		acquired:       with("result", "acquired"),
		notAcquired:    with("result", "not_acquired"),
		acquireFailed:  with("result", "failed"),
		holdReleased:   with("end", "released"),
		holdLost:       with("end", "lost"),
		renewOK:        with("result", "ok"),
		renewTransient: with("result", "transient"),
		renewDefinite:  with("result", "definite"),
		lostExpiry:     with("cause", "local_expiry"),
		lostNotHeld:    with("cause", "not_held"),
		lostRegressed:  with("cause", "token_regressed"),
		lostOther:      with("cause", "other"),
		releaseOK:      with("result", "ok"),
		releaseNotHeld: with("result", "not_held"),
		releaseFailed:  with("result", "failed"),
	}
	// Every counter series of the pair exists from the start, at zero, so
	// that rate() and increase() see the first event.
	ctx := context.Background()
	for _, c := range []struct {
		c   metric.Int64Counter
		set opt
	}{
		{o.acquire, s.acquired}, {o.acquire, s.notAcquired}, {o.acquire, s.acquireFailed},
		{o.contended, s.base}, {o.retry, s.base},
		{o.renew, s.renewOK}, {o.renew, s.renewTransient}, {o.renew, s.renewDefinite},
		{o.rotated, s.base}, {o.danger, s.base},
		{o.lost, s.lostExpiry}, {o.lost, s.lostNotHeld}, {o.lost, s.lostRegressed}, {o.lost, s.lostOther},
		{o.release, s.releaseOK}, {o.release, s.releaseNotHeld}, {o.release, s.releaseFailed},
		{o.cleanupFailed, s.base},
	} {
		c.c.Add(ctx, 0, c.set.add...)
	}
	o.held.Add(ctx, 0, s.base.add...)
	o.sets[k] = s
	return s
}

// Observe implements fencelock.Observer.
func (o *Observer) Observe(e fencelock.Event) {
	ctx := context.Background()
	if e.Kind == fencelock.EventFenceRejected {
		if o.o.KeyLabel != nil {
			o.fenceRejected.Add(ctx, 1, metric.WithAttributes(attribute.String("key", o.o.KeyLabel(e.Key))))
		} else {
			o.fenceRejected.Add(ctx, 1)
		}
		return
	}
	s := o.setsFor(&e)
	switch e.Kind {
	case fencelock.EventAcquired:
		o.acquire.Add(ctx, 1, s.acquired.add...)
		o.wait.Record(ctx, e.Wait.Seconds(), s.acquired.rec...)
		if e.Contended {
			o.contended.Add(ctx, 1, s.base.add...)
		}
		if o.track(e.Owner) {
			o.held.Add(ctx, 1, s.base.add...)
		}
		o.acquireSpan(&e, "acquired")
	case fencelock.EventNotAcquired:
		o.acquire.Add(ctx, 1, s.notAcquired.add...)
		o.wait.Record(ctx, e.Wait.Seconds(), s.notAcquired.rec...)
		o.acquireSpan(&e, "not_acquired")
	case fencelock.EventAcquireFailed:
		o.acquire.Add(ctx, 1, s.acquireFailed.add...)
		o.wait.Record(ctx, e.Wait.Seconds(), s.acquireFailed.rec...)
		o.acquireSpan(&e, "failed")
	case fencelock.EventAcquireRetry:
		o.retry.Add(ctx, 1, s.base.add...)
	case fencelock.EventRenewed:
		o.renew.Add(ctx, 1, s.renewOK.add...)
		o.latency.Record(ctx, e.Latency.Seconds(), s.base.rec...)
	case fencelock.EventRenewFailed:
		if e.Definite {
			o.renew.Add(ctx, 1, s.renewDefinite.add...)
		} else {
			o.renew.Add(ctx, 1, s.renewTransient.add...)
		}
	case fencelock.EventRotated:
		o.rotated.Add(ctx, 1, s.base.add...)
	case fencelock.EventDanger:
		o.danger.Add(ctx, 1, s.base.add...)
	case fencelock.EventLost:
		cause := LostCause(e.Err)
		switch cause {
		case "local_expiry":
			o.lost.Add(ctx, 1, s.lostExpiry.add...)
		case "not_held":
			o.lost.Add(ctx, 1, s.lostNotHeld.add...)
		case "token_regressed":
			o.lost.Add(ctx, 1, s.lostRegressed.add...)
		default:
			o.lost.Add(ctx, 1, s.lostOther.add...)
		}
		o.ended(ctx, s, s.holdLost, &e)
		o.pointSpan(&e, "fencelock.lost", codes.Error, attribute.String("fencelock.cause", cause))
	case fencelock.EventReleased:
		if errors.Is(e.Err, fencelock.ErrNotHeld) {
			o.release.Add(ctx, 1, s.releaseNotHeld.add...)
			o.pointSpan(&e, "fencelock.release", codes.Error, attribute.String("fencelock.result", "not_held"))
		} else {
			o.release.Add(ctx, 1, s.releaseOK.add...)
			o.pointSpan(&e, "fencelock.release", codes.Unset, attribute.String("fencelock.result", "ok"))
		}
		o.ended(ctx, s, s.holdReleased, &e)
	case fencelock.EventReleaseFailed:
		o.release.Add(ctx, 1, s.releaseFailed.add...)
		o.pointSpan(&e, "fencelock.release", codes.Error, attribute.String("fencelock.result", "failed"))
		// The lease has ended locally; the store's record expires with its
		// TTL if no retried Release removes it.
		o.ended(ctx, s, s.holdReleased, &e)
	case fencelock.EventCleanupFailed:
		o.cleanupFailed.Add(ctx, 1, s.base.add...)
	}
}

// track remembers a held lease's owner; it reports whether it was new.
func (o *Observer) track(owner string) bool {
	o.leasesMu.Lock()
	defer o.leasesMu.Unlock()
	if _, dup := o.leases[owner]; dup {
		return false
	}
	o.leases[owner] = struct{}{}
	return true
}

// untrack forgets a lease's owner; it reports whether it was held.
func (o *Observer) untrack(owner string) bool {
	o.leasesMu.Lock()
	defer o.leasesMu.Unlock()
	if _, ok := o.leases[owner]; !ok {
		return false
	}
	delete(o.leases, owner)
	return true
}

// ended records the end of e's lease, once per lease.
func (o *Observer) ended(ctx context.Context, s *attrSets, end opt, e *fencelock.Event) {
	if !o.untrack(e.Owner) {
		return // a retried Release, or a lease acquired before we looked
	}
	o.held.Add(ctx, -1, s.base.add...)
	o.hold.Record(ctx, e.Held.Seconds(), end.rec...)
}

// spanAttrs returns the attributes every span of e has.
func (o *Observer) spanAttrs(e *fencelock.Event, extra ...attribute.KeyValue) []attribute.KeyValue {
	a := make([]attribute.KeyValue, 0, 6+len(extra))
	a = append(a, attribute.String("fencelock.backend", e.Backend), attribute.String("fencelock.owner", e.Owner))
	if o.o.SpanKeys {
		a = append(a, attribute.String("fencelock.key", e.Key))
	}
	if e.Token != 0 {
		a = append(a, attribute.Int64("fencelock.token", int64(e.Token)))
	}
	return append(a, extra...)
}

// acquireSpan records "fencelock.acquire" from now − e.Wait to now.
func (o *Observer) acquireSpan(e *fencelock.Event, result string) {
	if o.tracer == nil {
		return
	}
	end := time.Now()
	_, span := o.tracer.Start(context.Background(), "fencelock.acquire", trace.WithTimestamp(end.Add(-e.Wait)))
	if !span.IsRecording() {
		return // no tracing, or not sampled: build nothing
	}
	span.SetAttributes(o.spanAttrs(e, attribute.String("fencelock.result", result), attribute.Bool("fencelock.contended", e.Contended || result == "not_acquired"))...)
	if result == "failed" {
		span.RecordError(e.Err, trace.WithTimestamp(end))
		span.SetStatus(codes.Error, errString(e.Err))
	}
	span.End(trace.WithTimestamp(end))
}

// pointSpan records a zero-length span at now.
func (o *Observer) pointSpan(e *fencelock.Event, name string, status codes.Code, extra ...attribute.KeyValue) {
	if o.tracer == nil {
		return
	}
	now := time.Now()
	_, span := o.tracer.Start(context.Background(), name, trace.WithTimestamp(now))
	if !span.IsRecording() {
		return
	}
	extra = append(extra, attribute.Float64("fencelock.held", e.Held.Seconds()))
	span.SetAttributes(o.spanAttrs(e, extra...)...)
	if status == codes.Error {
		if e.Err != nil {
			span.RecordError(e.Err, trace.WithTimestamp(now))
		}
		span.SetStatus(codes.Error, errString(e.Err))
	}
	span.End(trace.WithTimestamp(now))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// LostCause classifies the Err of an EventLost as the cause attribute of
// fencelock.lost: "local_expiry" (no renewal succeeded in time,
// fencelock.ErrLocalExpiry), "not_held" (the store said the lease is no
// longer ours: it expired there or was taken, fencelock.ErrNotHeld),
// "token_regressed" (fencelock.ErrTokenRegressed), or "other" (the client
// was closed, or the backend pushed a loss of its own).
func LostCause(err error) string {
	switch {
	case errors.Is(err, fencelock.ErrLocalExpiry):
		return "local_expiry"
	case errors.Is(err, fencelock.ErrTokenRegressed):
		return "token_regressed"
	case errors.Is(err, fencelock.ErrNotHeld):
		return "not_held"
	}
	return "other"
}
