package redisbench

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/internal/benchkit"
)

// longer is lib with every key name made n bytes longer (and nothing else
// changed).
func longer(lib benchkit.Lib, n int) benchkit.Lib {
	pad := strings.Repeat("k", n)
	return benchkit.Lib{Name: lib.Name + "+" + strconv.Itoa(n) + "B", Setup: func(b *testing.B) benchkit.Lockers {
		ls := lib.Setup(b)
		return func(i int) (try, wait benchkit.LockFunc) {
			t, w := ls(i)
			return pad2(t, pad), pad2(w, pad)
		}
	}}
}

func pad2(f benchkit.LockFunc, pad string) benchkit.LockFunc {
	if f == nil {
		return nil
	}
	return func(ctx context.Context, key string) (func() error, error) { return f(ctx, key+pad) }
}

// BenchmarkKeyLength is raw against itself with longer key names, in one
// interleaved run: what the length of a key name alone costs. With the
// test environment's appendfsync always, each write's bytes go through the
// fsync that every event-loop turn waits for. It is why the interleaved
// benchmarks give every library keys of one length, and why fencelock's
// runs use the URL's default prefix (see docs/performance.md).
func BenchmarkKeyLength(b *testing.B) {
	libs := []benchkit.Lib{raw, longer(raw, 16), longer(raw, 32), longer(raw, 64)}
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) { benchkit.Interleaved(b, g, 50*g, libs) })
	}
}
