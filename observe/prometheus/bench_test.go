package prometheus_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	flprom "github.com/fencelock/fencelock/observe/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
)

// The overhead of the Prometheus observer: acquire + release on the memory
// backend, without an observer and with one, in the same run.

func benchClient(b *testing.B, obs fencelock.Observer) *fencelock.Client {
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: time.Minute, Observer: obs})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func benchObserver(b *testing.B, o *flprom.Options) *flprom.Observer {
	obs, err := flprom.New(o)
	if err != nil {
		b.Fatal(err)
	}
	prom.NewRegistry().MustRegister(obs)
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

func BenchmarkAcquireReleaseWithPrometheus(b *testing.B) {
	acquireRelease(b, benchClient(b, benchObserver(b, nil)))
}

func BenchmarkAcquireReleaseWithPrometheusKeyLabel(b *testing.B) {
	prefix := func(string) string { return "bench" }
	acquireRelease(b, benchClient(b, benchObserver(b, &flprom.Options{KeyLabel: prefix})))
}

func BenchmarkAcquireReleaseParallel(b *testing.B) { acquireReleaseParallel(b, benchClient(b, nil)) }

func BenchmarkAcquireReleaseParallelWithPrometheus(b *testing.B) {
	acquireReleaseParallel(b, benchClient(b, benchObserver(b, nil)))
}

// BenchmarkObserve is the observer alone: the two events one acquire +
// release emits (acquired, released), without the engine.
func BenchmarkObserve(b *testing.B) {
	obs := benchObserver(b, nil)
	acq := fencelock.Event{Kind: fencelock.EventAcquired, Backend: "memory", Key: "bench/k", Owner: "o", Token: 1, Wait: time.Millisecond}
	rel := fencelock.Event{Kind: fencelock.EventReleased, Backend: "memory", Key: "bench/k", Owner: "o", Token: 1, Held: time.Second}
	b.ReportAllocs()
	for b.Loop() {
		obs.Observe(acq)
		obs.Observe(rel)
	}
}
