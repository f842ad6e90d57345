package redisbench

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/benchkit"
	"github.com/fencelock/fencelock/recipe"
)

// semLib is a semaphore of n permits of fencelock (generic: a lease per
// permit slot) as a URL user gets it, one shared client: each cycle takes
// one permit of the cycle's key and releases it.
func semLib(name string, n int) benchkit.Lib {
	return benchkit.Lib{Name: name, Setup: func(b *testing.B) benchkit.Lockers {
		c, err := fencelock.Open(context.Background(), fencelockURL(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		lock := func(try bool) benchkit.LockFunc {
			return func(ctx context.Context, key string) (func() error, error) {
				s, err := recipe.NewSemaphore(c, key, n)
				if err != nil {
					return nil, err
				}
				var l *fencelock.Lease
				if try {
					l, err = s.TryAcquire(ctx)
				} else {
					l, err = s.Acquire(ctx)
				}
				if err != nil {
					return nil, err
				}
				return func() error { return l.Release(context.Background()) }, nil
			}
		}
		return benchkit.Same(lock(true), lock(false))
	}}
}

// BenchmarkSemaphoreUncontended: one goroutine, one permit of a
// semaphore of 1 and of 8 taken and released, beside the raw store
// operations and a plain fencelock lock in the same run.
func BenchmarkSemaphoreUncontended(b *testing.B) {
	benchkit.Uncontended(b, []benchkit.Lib{raw, fencelockLib("fencelock-lock", true), semLib("fencelock-semaphore-1", 1), semLib("fencelock-semaphore-8", 8)})
}
