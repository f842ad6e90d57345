package otel_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	flotel "github.com/fencelock/fencelock/observe/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// The overhead of the OpenTelemetry observer: acquire + release on the
// memory backend, without an observer and with one on the SDK providers, in
// the same run.

func benchClient(b *testing.B, obs fencelock.Observer) *fencelock.Client {
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: time.Minute, Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// benchObserver records on an SDK meter provider (a manual reader, never
// collected) and the given tracer provider.
func benchObserver(b *testing.B, tp trace.TracerProvider) *flotel.Observer {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	obs, err := flotel.New(mp, tp, nil)
	if err != nil {
		b.Fatal(err)
	}
	return obs
}

func acquireRelease(b *testing.B, c *fencelock.Client) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, "bench/k")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func acquireReleaseParallel(b *testing.B, c *fencelock.Client) {
	ctx := context.Background()
	b.ReportAllocs()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprint("bench/", n.Add(1))
		for pb.Next() {
			l, err := c.TryAcquire(ctx, key)
			if err != nil {
				b.Error(err)
				return
			}
			l.Release(ctx)
		}
	})
}

func BenchmarkAcquireRelease(b *testing.B) { acquireRelease(b, benchClient(b, nil)) }

// BenchmarkAcquireReleaseWithOTel records metrics and two sampled spans per
// iteration (an SDK tracer provider without exporter: the spans are built and
// ended, then dropped).
func BenchmarkAcquireReleaseWithOTel(b *testing.B) {
	acquireRelease(b, benchClient(b, benchObserver(b, sdktrace.NewTracerProvider())))
}

// BenchmarkAcquireReleaseWithOTelMetricsOnly uses a no-op tracer provider.
func BenchmarkAcquireReleaseWithOTelMetricsOnly(b *testing.B) {
	acquireRelease(b, benchClient(b, benchObserver(b, noop.NewTracerProvider())))
}

func BenchmarkAcquireReleaseParallel(b *testing.B) { acquireReleaseParallel(b, benchClient(b, nil)) }

func BenchmarkAcquireReleaseParallelWithOTel(b *testing.B) {
	acquireReleaseParallel(b, benchClient(b, benchObserver(b, sdktrace.NewTracerProvider())))
}

// BenchmarkObserve is the observer alone: the two events one acquire +
// release emits (acquired, released), without the engine.
func BenchmarkObserve(b *testing.B) {
	for _, tc := range []struct {
		name string
		tp   trace.TracerProvider
	}{{"MetricsOnly", noop.NewTracerProvider()}, {"WithSpans", sdktrace.NewTracerProvider()}} {
		b.Run(tc.name, func(b *testing.B) {
			obs := benchObserver(b, tc.tp)
			acq := fencelock.Event{Kind: fencelock.EventAcquired, Backend: "memory", Key: "bench/k", Owner: "o", Token: 1, Wait: time.Millisecond}
			rel := fencelock.Event{Kind: fencelock.EventReleased, Backend: "memory", Key: "bench/k", Owner: "o", Token: 1, Held: time.Second}
			b.ReportAllocs()
			for b.Loop() {
				obs.Observe(acq)
				obs.Observe(rel)
			}
		})
	}
}
