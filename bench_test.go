package fencelock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
)

// BenchmarkAcquireRelease measures the engine's overhead: acquire + release
// through a Client on the memory backend. BenchmarkRawMemory is the same
// work straight on the backend; the difference is the engine. Each also
// reports cpu-ns/op (benchkit.CPUPerOp), the process's CPU time per
// iteration, which a loaded machine moves far less than ns/op.
func BenchmarkAcquireRelease(b *testing.B) {
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	defer benchkit.CPUPerOp(b)()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireReleaseCancellable is BenchmarkAcquireRelease with a
// caller's context that can end, as a request's does: the engine then
// watches it for the attempt's grace period (see Options.ReleaseTimeout).
func BenchmarkAcquireReleaseCancellable(b *testing.B) {
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	defer benchkit.CPUPerOp(b)()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRawMemory(b *testing.B) {
	m := memory.New()
	ctx := context.Background()
	b.ReportAllocs()
	defer benchkit.CPUPerOp(b)()
	i := 0
	for b.Loop() {
		i++
		g, err := m.Acquire(ctx, driver.AcquireRequest{Key: "bench", Owner: fmt.Sprint(i), TTL: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Release(ctx, g); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAcquireReleaseParallel(b *testing.B) {
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	var n atomic.Int64
	defer benchkit.CPUPerOp(b)()
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
