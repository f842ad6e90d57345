package prometheus

import (
	"errors"
	"sync"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/histogram"
	prom "github.com/prometheus/client_golang/prometheus"
)

// Default histogram buckets, in seconds.
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
	// KeyLabel, if set, adds a "key" label to every series, with the value
	// KeyLabel(key) (for fencelock_fence_rejected_total, KeyLabel(resource)).
	// It must map the unbounded space of keys onto a small, bounded set,
	// such as a prefix ("jobs/", "tenants/"): every distinct value creates a
	// full set of series that lives as long as the Observer. It must be safe
	// for concurrent use. Default nil: no key label.
	KeyLabel func(key string) string

	// WaitBuckets are the buckets of fencelock_acquire_wait_seconds.
	// Default DefaultWaitBuckets.
	WaitBuckets []float64

	// HoldBuckets are the buckets of fencelock_hold_seconds. Default
	// DefaultHoldBuckets.
	HoldBuckets []float64

	// LatencyBuckets are the buckets of fencelock_renew_latency_seconds.
	// Default DefaultLatencyBuckets.
	LatencyBuckets []float64
}

// Validate reports the first option that is out of range, as a
// *fencelock.InvalidOptionError: bucket lists must be strictly increasing.
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

// Observer turns fencelock events into Prometheus metrics. It implements
// fencelock.Observer and prometheus.Collector, and is safe for concurrent
// use. Create it with New.
type Observer struct {
	keyLabel func(string) string

	acquire       *prom.CounterVec
	contended     *prom.CounterVec
	retry         *prom.CounterVec
	wait          *prom.HistogramVec
	hold          *prom.HistogramVec
	renew         *prom.CounterVec
	latency       *prom.HistogramVec
	rotated       *prom.CounterVec
	danger        *prom.CounterVec
	lost          *prom.CounterVec
	release       *prom.CounterVec
	cleanupFailed *prom.CounterVec
	fenceRejected *prom.CounterVec
	held          *prom.GaugeVec

	collectors []prom.Collector

	// series caches the children of each (backend, key label) pair.
	mu     sync.RWMutex
	series map[seriesKey]*series
	// leases holds the owner of every lease seen acquired and not yet seen
	// ending, so each lease ends once in fencelock_leases_held and
	// fencelock_hold_seconds.
	leasesMu sync.Mutex
	leases   map[string]struct{} // by owner
}

var (
	_ fencelock.Observer = (*Observer)(nil)
	_ prom.Collector     = (*Observer)(nil)
)

type seriesKey struct{ backend, key string }

// series holds one (backend, key label) pair's children, resolved once so
// that an event costs no label hashing.
type series struct {
	acquired, notAcquired, acquireFailed      prom.Counter
	contended, retry                          prom.Counter
	waitAcquired, waitNotAcquired, waitFailed prom.Observer
	holdReleased, holdLost                    prom.Observer
	renewOK, renewTransient, renewDefinite    prom.Counter
	latency                                   prom.Observer
	rotated, danger                           prom.Counter
	lostExpiry, lostNotHeld, lostRegressed    prom.Counter
	lostOther                                 prom.Counter
	releaseOK, releaseNotHeld, releaseFailed  prom.Counter
	cleanupFailed                             prom.Counter
	held                                      prom.Gauge
}

// New returns an Observer. A nil opts means defaults; invalid options return
// a *fencelock.InvalidOptionError. Register the Observer on a
// prometheus.Registerer to export its metrics.
func New(opts *Options) (*Observer, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	var base []string // labels every backend series has
	base = append(base, "backend")
	var fenceLabels []string
	if o.KeyLabel != nil {
		base = append(base, "key")
		fenceLabels = []string{"key"}
	}
	with := func(extra ...string) []string { return append(append([]string(nil), base...), extra...) }
	counter := func(name, help string, labels []string) *prom.CounterVec {
		return prom.NewCounterVec(prom.CounterOpts{Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels []string) *prom.HistogramVec {
		return prom.NewHistogramVec(prom.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	ob := &Observer{
		keyLabel:      o.KeyLabel,
		series:        make(map[seriesKey]*series),
		leases:        make(map[string]struct{}),
		acquire:       counter("fencelock_acquire_total", "Acquire and TryAcquire calls by result: acquired, not_acquired (TryAcquire found the key held), failed (context ended or backend failed).", with("result")),
		contended:     counter("fencelock_acquire_contended_total", "Grants that found the key held by someone else at least once before succeeding.", with()),
		retry:         counter("fencelock_acquire_retry_total", "Attempts inside a waiting Acquire that failed transiently and were retried.", with()),
		wait:          histogram("fencelock_acquire_wait_seconds", "Time from an Acquire or TryAcquire call to its grant, refusal or failure.", o.WaitBuckets, with("result")),
		hold:          histogram("fencelock_hold_seconds", "How long leases were held, by how they ended: released or lost.", o.HoldBuckets, with("end")),
		renew:         counter("fencelock_renew_total", "Renewals by result: ok, transient (failed, will be retried), definite (refused by the store; the lease is lost).", with("result")),
		latency:       histogram("fencelock_renew_latency_seconds", "Round trip of successful renewals.", o.LatencyBuckets, with()),
		rotated:       counter("fencelock_token_rotated_total", "Renewals that issued a new, higher fencing token.", with()),
		danger:        counter("fencelock_danger_zone_total", "Leases that entered the danger zone: renewals failing and less than one renew interval of validity left.", with()),
		lost:          counter("fencelock_lost_total", "Leases that ended without Release, by cause: local_expiry, not_held (taken or expired in the store), token_regressed, other.", with("cause")),
		release:       counter("fencelock_release_total", "Release calls by result: ok, not_held (the store no longer had the lease: work may not have been exclusive), failed (store unreachable).", with("result")),
		cleanupFailed: counter("fencelock_cleanup_failed_total", "Failed removals of what an abandoned acquire or a lost lease left in the store (it expires with its TTL).", with()),
		fenceRejected: counter("fencelock_fence_rejected_total", "Writes a fencelock.Fence refused because they carried a stale fencing token.", fenceLabels),
		held:          prom.NewGaugeVec(prom.GaugeOpts{Name: "fencelock_leases_held", Help: "Leases this process holds now."}, with()),
	}
	ob.collectors = []prom.Collector{ob.acquire, ob.contended, ob.retry, ob.wait, ob.hold, ob.renew, ob.latency,
		ob.rotated, ob.danger, ob.lost, ob.release, ob.cleanupFailed, ob.fenceRejected, ob.held}
	if o.KeyLabel == nil {
		ob.fenceRejected.WithLabelValues() // the one series exists from the start
	}
	return ob, nil
}

// Describe implements prometheus.Collector.
func (o *Observer) Describe(ch chan<- *prom.Desc) {
	for _, c := range o.collectors {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (o *Observer) Collect(ch chan<- prom.Metric) {
	for _, c := range o.collectors {
		c.Collect(ch)
	}
}

// seriesFor returns the children for e's backend and key label, creating
// them (at zero) on first use.
func (o *Observer) seriesFor(e *fencelock.Event) *series {
	k := seriesKey{backend: e.Backend}
	if o.keyLabel != nil {
		k.key = o.keyLabel(e.Key)
	}
	o.mu.RLock()
	s, ok := o.series[k]
	o.mu.RUnlock()
	if ok {
		return s
	}
	lv := []string{k.backend}
	if o.keyLabel != nil {
		lv = append(lv, k.key)
	}
	with := func(extra ...string) []string { return append(append([]string(nil), lv...), extra...) }
	o.mu.Lock()
	defer o.mu.Unlock()
	if s, ok := o.series[k]; ok {
		return s
	}
	s = &series{
		acquired:        o.acquire.WithLabelValues(with("acquired")...),
		notAcquired:     o.acquire.WithLabelValues(with("not_acquired")...),
		acquireFailed:   o.acquire.WithLabelValues(with("failed")...),
		contended:       o.contended.WithLabelValues(lv...),
		retry:           o.retry.WithLabelValues(lv...),
		waitAcquired:    o.wait.WithLabelValues(with("acquired")...),
		waitNotAcquired: o.wait.WithLabelValues(with("not_acquired")...),
		waitFailed:      o.wait.WithLabelValues(with("failed")...),
		holdReleased:    o.hold.WithLabelValues(with("released")...),
		holdLost:        o.hold.WithLabelValues(with("lost")...),
		renewOK:         o.renew.WithLabelValues(with("ok")...),
		renewTransient:  o.renew.WithLabelValues(with("transient")...),
		renewDefinite:   o.renew.WithLabelValues(with("definite")...),
		latency:         o.latency.WithLabelValues(lv...),
		rotated:         o.rotated.WithLabelValues(lv...),
		danger:          o.danger.WithLabelValues(lv...),
		lostExpiry:      o.lost.WithLabelValues(with("local_expiry")...),
		lostNotHeld:     o.lost.WithLabelValues(with("not_held")...),
		lostRegressed:   o.lost.WithLabelValues(with("token_regressed")...),
		lostOther:       o.lost.WithLabelValues(with("other")...),
		releaseOK:       o.release.WithLabelValues(with("ok")...),
		releaseNotHeld:  o.release.WithLabelValues(with("not_held")...),
		releaseFailed:   o.release.WithLabelValues(with("failed")...),
		cleanupFailed:   o.cleanupFailed.WithLabelValues(lv...),
		held:            o.held.WithLabelValues(lv...),
	}
	o.series[k] = s
	return s
}

// Observe implements fencelock.Observer.
func (o *Observer) Observe(e fencelock.Event) {
	if e.Kind == fencelock.EventFenceRejected {
		if o.keyLabel != nil {
			o.fenceRejected.WithLabelValues(o.keyLabel(e.Key)).Inc()
		} else {
			o.fenceRejected.WithLabelValues().Inc()
		}
		return
	}
	s := o.seriesFor(&e)
	switch e.Kind {
	case fencelock.EventAcquired:
		s.acquired.Inc()
		s.waitAcquired.Observe(e.Wait.Seconds())
		if e.Contended {
			s.contended.Inc()
		}
		if o.track(e.Owner) {
			s.held.Inc()
		}
	case fencelock.EventNotAcquired:
		s.notAcquired.Inc()
		s.waitNotAcquired.Observe(e.Wait.Seconds())
	case fencelock.EventAcquireFailed:
		s.acquireFailed.Inc()
		s.waitFailed.Observe(e.Wait.Seconds())
	case fencelock.EventAcquireRetry:
		s.retry.Inc()
	case fencelock.EventRenewed:
		s.renewOK.Inc()
		s.latency.Observe(e.Latency.Seconds())
	case fencelock.EventRenewFailed:
		if e.Definite {
			s.renewDefinite.Inc()
		} else {
			s.renewTransient.Inc()
		}
	case fencelock.EventRotated:
		s.rotated.Inc()
	case fencelock.EventDanger:
		s.danger.Inc()
	case fencelock.EventLost:
		switch LostCause(e.Err) {
		case "local_expiry":
			s.lostExpiry.Inc()
		case "not_held":
			s.lostNotHeld.Inc()
		case "token_regressed":
			s.lostRegressed.Inc()
		default:
			s.lostOther.Inc()
		}
		o.ended(s, s.holdLost, &e)
	case fencelock.EventReleased:
		if errors.Is(e.Err, fencelock.ErrNotHeld) {
			s.releaseNotHeld.Inc()
		} else {
			s.releaseOK.Inc()
		}
		o.ended(s, s.holdReleased, &e)
	case fencelock.EventReleaseFailed:
		s.releaseFailed.Inc()
		// The lease has ended locally; the store's record expires with its
		// TTL if no retried Release removes it.
		o.ended(s, s.holdReleased, &e)
	case fencelock.EventCleanupFailed:
		s.cleanupFailed.Inc()
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
func (o *Observer) ended(s *series, hold prom.Observer, e *fencelock.Event) {
	if !o.untrack(e.Owner) {
		return // a retried Release, or a lease acquired before we looked
	}
	s.held.Dec()
	hold.Observe(e.Held.Seconds())
}

// LostCause classifies the Err of an EventLost as the cause label of
// fencelock_lost_total: "local_expiry" (no renewal succeeded in time,
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
