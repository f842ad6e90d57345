package redisbench

import (
	"context"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/benchkit"
	"github.com/fencelock/fencelock/recipe"
)

// rwLib is a read-write lock of fencelock (generic: a gate lease and 16
// reader slot leases) as a URL user gets it, one shared client: each
// cycle an RLock and its Release (write false) or a Lock and its Release
// (write true) on the cycle's key, every grant admitted by an RWFence.
func rwLib(name string, write bool) benchkit.Lib {
	return benchkit.Lib{Name: name, Setup: func(b *testing.B) benchkit.Lockers {
		c, err := fencelock.Open(context.Background(), fencelockURL(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		var fence recipe.RWFence
		lock := func(try bool) benchkit.LockFunc {
			return func(ctx context.Context, key string) (func() error, error) {
				rw, err := recipe.NewRWLock(c, key)
				if err != nil {
					return nil, err
				}
				var g *recipe.RWGrant
				switch {
				case write && try:
					g, err = rw.TryLock(ctx)
				case write:
					g, err = rw.Lock(ctx)
				case try:
					g, err = rw.TryRLock(ctx)
				default:
					g, err = rw.RLock(ctx)
				}
				if err != nil {
					return nil, err
				}
				if err := fence.Admit(key, g); err != nil {
					return nil, err
				}
				return func() error { return g.Release(context.Background()) }, nil
			}
		}
		return benchkit.Same(lock(true), lock(false))
	}}
}

// BenchmarkRWUncontended: one goroutine, a read grant (RLock+Release) and
// a write grant (Lock+Release) of one key, beside the raw store
// operations and a plain fencelock lock in the same run.
func BenchmarkRWUncontended(b *testing.B) {
	benchkit.Uncontended(b, []benchkit.Lib{raw, fencelockLib("fencelock-lock", true), rwLib("fencelock-rlock", false), rwLib("fencelock-rwlock-write", true)})
}
