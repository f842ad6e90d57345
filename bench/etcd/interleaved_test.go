package etcdbench

import (
	"strconv"
	"testing"

	"github.com/fencelock/fencelock/internal/benchkit"
)

// BenchmarkInterleaved measures the same shapes as BenchmarkUncontended
// and BenchmarkDistinct16, but runs the libraries in turns of 50
// acquire+release per goroutine, round after round (b.N rounds), and adds
// up the time each library took, so that on a shared, busy machine every
// library meets the same noise; it reports each one's rate and its ratio
// to raw ("<library>/raw").
func BenchmarkInterleaved(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) { benchkit.Interleaved(b, g, 50*g, libs) })
	}
}
