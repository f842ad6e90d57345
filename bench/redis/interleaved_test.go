package redisbench

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/benchkit"
)

// BenchmarkInterleaved measures the same shapes as BenchmarkUncontended
// and BenchmarkDistinct16, but runs the libraries in turns of 50
// acquire+release per goroutine, round after round (b.N rounds), and adds
// up the time each library took. On a shared, busy machine every library
// then meets the same noise, so the ratios to raw (reported as
// "<library>/raw" metrics) are far steadier than ratios of separate runs.
//
// With 16 goroutines it also counts, untimed, per grant (benchkit.Counted):
// each library's round trips, and what the server's INFO stats add up
// (server-reads: the reads of client connections, the round trips the
// server saw; commands; net-bytes, in and out). Redis does not count its
// AOF fsyncs: with appendfsync always it fsyncs at most once per event
// loop iteration that wrote, so at most once per server read.
func BenchmarkInterleaved(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
			var opts []benchkit.Option
			if g > 1 {
				u := fencelockURL(b)
				route := func(*testing.B) benchkit.Route { return benchkit.Route{Var: "FENCELOCK_BENCH_REDIS", URL: u} }
				opts = append(opts, benchkit.Counted(countedGrants, route, statsCounters(client(b))...))
			}
			benchkit.Interleaved(b, g, 50*g, libs, opts...)
		})
	}
}

// countedGrants is how many acquire+release cycles the untimed counting
// pass of the 16-goroutine workload runs per library.
const countedGrants = 1600

// statsCounters are INFO stats' total_reads_processed,
// total_commands_processed and total_net_input_bytes plus
// total_net_output_bytes, read on rdb (connected to the server itself).
func statsCounters(rdb *goredis.Client) []benchkit.Counter {
	stat := func(fields ...string) func() (float64, error) {
		return func() (float64, error) {
			info, err := rdb.Info(context.Background(), "stats").Result()
			if err != nil {
				return 0, err
			}
			var total float64
			for _, line := range strings.Split(info, "\n") {
				k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
				if ok && slices.Contains(fields, k) {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return 0, err
					}
					total += f
				}
			}
			return total, nil
		}
	}
	return []benchkit.Counter{
		{Name: "server-reads", Read: stat("total_reads_processed")},
		{Name: "commands", Read: stat("total_commands_processed")},
		{Name: "net-bytes", Read: stat("total_net_input_bytes", "total_net_output_bytes")},
	}
}
