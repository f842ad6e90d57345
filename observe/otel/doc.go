// Package otel exports fencelock's lifecycle events as OpenTelemetry
// metrics and spans, with the go.opentelemetry.io/otel API.
//
// An *Observer is a fencelock.Observer: set it as fencelock.Options.Observer
// (and as fencelock.Fence.Observer to count fence rejections). It records on
// the metric.MeterProvider and trace.TracerProvider given to New; nil means
// the otel globals (otel.GetMeterProvider, otel.GetTracerProvider), which
// forward to whatever providers the program installs later. Pass
// go.opentelemetry.io/otel/trace/noop.NewTracerProvider() for metrics
// without spans.
//
// One Observer may serve any number of Clients and Fences, on any backends:
// every data point carries the backend's name in the "backend" attribute, so
// a dashboard does not change when the backend does.
//
// # Metrics
//
// Instrument names are chosen so that the OpenTelemetry Prometheus exporter
// (which appends the unit and _total) yields exactly the metric names of the
// observe/prometheus adapter, e.g. fencelock.acquire.wait (unit s) becomes
// fencelock_acquire_wait_seconds and fencelock.acquire becomes
// fencelock_acquire_total.
//
//	fencelock.acquire{backend,result}            Int64Counter        result: acquired | not_acquired | failed
//	fencelock.acquire.contended{backend}         Int64Counter        grants that found the key held at least once
//	fencelock.acquire.retry{backend}             Int64Counter        transient failures inside a waiting Acquire
//	fencelock.acquire.wait{backend,result}       Float64Histogram s  time from the call to the grant (or the give-up)
//	fencelock.hold{backend,end}                  Float64Histogram s  end: released | lost
//	fencelock.renew{backend,result}              Int64Counter        result: ok | transient | definite
//	fencelock.renew.latency{backend}             Float64Histogram s  round trip of successful renewals
//	fencelock.token.rotated{backend}             Int64Counter
//	fencelock.danger_zone{backend}               Int64Counter
//	fencelock.lost{backend,cause}                Int64Counter        cause: local_expiry | not_held | token_regressed | other
//	fencelock.release{backend,result}            Int64Counter        result: ok | not_held | failed
//	fencelock.cleanup_failed{backend}            Int64Counter
//	fencelock.fence.rejected                     Int64Counter
//	fencelock.leases.held{backend}               Int64UpDownCounter  leases this process holds now
//
// Lock keys are not an attribute by default, because keys are often
// unbounded and every distinct attribute set is a separate time series.
// Options.KeyLabel maps keys onto a small bounded set (a prefix) to add a
// "key" attribute.
//
// # Spans
//
// The Observer sees events, not calls, so it has no caller context: its
// spans are roots of their own traces, with timestamps reconstructed from the
// event (trace.WithTimestamp):
//
//   - "fencelock.acquire" on every acquire outcome, from now − Event.Wait to
//     now. Status Error when the acquire failed (context ended, backend
//     failed); a TryAcquire that found the key held is not an error
//     (fencelock.result = "not_acquired").
//   - "fencelock.release" on every Release, a zero-length span at the
//     moment the release finished, with fencelock.held. Status Error when
//     the store could not be reached or no longer had the lease.
//   - "fencelock.lost" when a lease is lost, a zero-length span with status
//     Error, fencelock.cause and fencelock.held.
//
// Span attributes: fencelock.backend, fencelock.owner, fencelock.token,
// fencelock.contended, fencelock.result, and fencelock.key only when
// Options.SpanKeys is set (keys may name users or tenants). Times are taken
// from the system clock, not fencelock.Options.Clock.
//
// Held-lease bookkeeping (fencelock.leases.held, fencelock.hold) counts each
// lease once, as in observe/prometheus: a retried Release does not count
// twice.
package otel
