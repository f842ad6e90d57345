package otel_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	flotel "github.com/fencelock/fencelock/observe/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func Example() {
	ctx := context.Background()
	// In a program these are the providers it exports with (OTLP,
	// Prometheus); nil means the otel globals.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	obs, err := flotel.New(mp, tp, nil)
	if err != nil {
		panic(err)
	}
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: 15 * time.Second, Observer: obs})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "jobs/nightly")
	if err != nil {
		panic(err)
	}
	l.Release(ctx)

	var rm metricdata.ResourceMetrics
	reader.Collect(ctx, &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "fencelock.acquire" {
			for _, p := range sum.DataPoints {
				if result, _ := p.Attributes.Value("result"); p.Value > 0 {
					fmt.Println(m.Name, result.AsString(), p.Value)
				}
			}
		}
	}
	for _, s := range spans.Ended() {
		fmt.Println("span", s.Name())
	}
	// Output:
	// fencelock.acquire acquired 1
	// span fencelock.acquire
	// span fencelock.release
}
