package redisbench

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkInterleaved measures the same shapes as BenchmarkUncontended
// and BenchmarkDistinct16, but runs the libraries in turns of 50
// acquire+release each, round after round (b.N rounds), and adds up the
// time each library took. On a shared, busy machine every library then
// meets the same noise, so the ratios to raw (reported as "x-raw"
// metrics) are far steadier than ratios of separate runs.
func BenchmarkInterleaved(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) { interleaved(b, g) })
	}
}

func interleaved(b *testing.B, g int) {
	const turn = 50
	rdb := client(b)
	base := unique()
	type runner struct {
		name  string
		tries []func(context.Context, string) (func() error, error)
		spent time.Duration
	}
	var rs []*runner
	for _, l := range libs {
		r := &runner{name: l.name}
		for i := range g {
			try, _ := l.setup(b, rdb, i)
			r.tries = append(r.tries, try)
		}
		rs = append(rs, r)
	}
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		for _, r := range rs {
			var wg sync.WaitGroup
			start := time.Now()
			for i := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := base + "-" + r.name + "-" + strconv.Itoa(i)
					for range turn {
						rel, err := r.tries[i](ctx, key)
						if err != nil {
							b.Error(err)
							return
						}
						if err := rel(); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			r.spent += time.Since(start)
		}
	}
	b.StopTimer()
	ops := float64(b.N * turn * g)
	rawRate := ops / rs[0].spent.Seconds()
	for _, r := range rs {
		rate := ops / r.spent.Seconds()
		b.ReportMetric(rate, r.name+"-acq+rel/s")
		if r != rs[0] {
			b.ReportMetric(rate/rawRate, r.name+"-x-raw")
		}
	}
}
