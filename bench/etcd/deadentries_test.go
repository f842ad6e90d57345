package etcdbench

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/benchkit"
)

// deadRounds and deadPerRound shape BenchmarkDeadEntries: each
// sub-benchmark runs deadRounds rounds in which 16 goroutines, each on its
// own key, acquire and release deadPerRound times.
const (
	deadRounds   = 6
	deadPerRound = 300
)

// BenchmarkDeadEntries shows what an owner name used once costs on etcd.
// Every acquisition writes its queue entry under the key's prefix, named
// by the owner; released, the entry is deleted, but etcd keeps the name in
// its index until the store is compacted, and every later acquisition's
// compare over the prefix walks it. The engine names a new owner for every
// lease (fresh-owner); same-owner reuses one name per goroutine. The test
// server is never compacted. It reports the first and the last round's
// rate and their ratio. b.N is ignored: run it with -benchtime 1x. With
// -short (CI's smoke run) it makes 2 rounds of 20.
func BenchmarkDeadEntries(b *testing.B) {
	rounds, perRound := deadRounds, deadPerRound
	if testing.Short() {
		rounds, perRound = 2, 20
	}
	for _, fresh := range []bool{true, false} {
		name := "same-owner"
		if fresh {
			name = "fresh-owner"
		}
		b.Run(name, func(b *testing.B) {
			be, _, err := fencelock.OpenBackend(context.Background(), fencelockURL(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { be.Close() })
			keys := make([]string, 16)
			for g := range keys {
				keys[g] = benchkit.UniqueKey()
			}
			round := func(r int) float64 {
				start := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, len(keys))
				for g, key := range keys {
					wg.Go(func() {
						for n := range perRound {
							owner := "bench-" + strconv.Itoa(g)
							if fresh {
								owner += "." + strconv.Itoa(r*perRound+n)
							}
							gr, err := be.Acquire(context.Background(), driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl})
							if err == nil {
								err = be.Release(context.Background(), gr)
							}
							if err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
				return float64(len(keys)*perRound) / time.Since(start).Seconds()
			}
			b.ResetTimer()
			first := round(0)
			last := first
			for r := 1; r < rounds; r++ {
				last = round(r)
			}
			b.ReportMetric(first, "first-round-acq+rel/s")
			b.ReportMetric(last, "last-round-acq+rel/s")
			b.ReportMetric(last/first, "last/first")
		})
	}
}
