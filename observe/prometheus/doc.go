// Package prometheus exports fencelock's lifecycle events as Prometheus
// metrics, with github.com/prometheus/client_golang.
//
// An *Observer is both a fencelock.Observer (set it as
// fencelock.Options.Observer, and as fencelock.Fence.Observer to count fence
// rejections) and a prometheus.Collector (register it on any Registerer):
//
//	obs, err := prometheus.New(nil)
//	if err != nil { … }
//	registry.MustRegister(obs)
//	client, err := fencelock.Open(ctx, url, &fencelock.Options{Observer: obs})
//
// One Observer may serve any number of Clients and Fences, on any backends:
// every series carries the backend's name in the "backend" label, so a
// dashboard does not change when the backend does.
//
// # Metrics
//
// The names are stable; they are the same names the observe/otel adapter's
// instruments get when exported through the OpenTelemetry Prometheus
// exporter.
//
//	fencelock_acquire_total{backend,result}        counter   result: acquired | not_acquired | failed
//	fencelock_acquire_contended_total{backend}     counter   grants that found the key held at least once
//	fencelock_acquire_retry_total{backend}         counter   transient failures inside a waiting Acquire
//	fencelock_acquire_wait_seconds{backend,result} histogram time from the call to the grant (or the give-up)
//	fencelock_hold_seconds{backend,end}            histogram end: released | lost
//	fencelock_renew_total{backend,result}          counter   result: ok | transient | definite
//	fencelock_renew_latency_seconds{backend}       histogram round trip of successful renewals
//	fencelock_token_rotated_total{backend}         counter
//	fencelock_danger_zone_total{backend}           counter
//	fencelock_lost_total{backend,cause}            counter   cause: local_expiry | not_held | token_regressed | other
//	fencelock_release_total{backend,result}        counter   result: ok | not_held | failed
//	fencelock_cleanup_failed_total{backend}        counter
//	fencelock_fence_rejected_total                 counter
//	fencelock_leases_held{backend}                 gauge     leases this process holds now
//
// Every series of a backend is created, at zero, the first time the backend
// is seen, so rate() and increase() work from the first event and an alert
// such as increase(fencelock_lost_total[5m]) > 0 fires on the first loss.
//
// # Cardinality
//
// Lock keys are not a label by default: keys are often unbounded (one per
// job, per user, per row), and a label per key would grow the series count
// without limit. Set Options.KeyLabel to map each key to a value from a small,
// bounded set (a prefix, a tenant class) to get a "key" label on every
// series; the Observer keeps one set of series per (backend, label) pair for
// its lifetime. Owners and tokens are never labels. To add constant labels
// (service, region), wrap the Registerer with
// prometheus.WrapRegistererWith.
//
// # Held leases
//
// fencelock_leases_held and fencelock_hold_seconds count each lease once: the
// Observer remembers the owner of every lease it saw acquired until it sees
// the lease end (released, release failed, or lost), so a retried Release
// does not count twice. That bookkeeping is one small map entry per held
// lease.
package prometheus
