package etcdbench

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/fencelock/fencelock/internal/benchkit"
)

// BenchmarkInterleaved measures the same shapes as BenchmarkUncontended
// and BenchmarkDistinct16, but runs the libraries in turns of 50
// acquire+release per goroutine, round after round (b.N rounds), and adds
// up the time each library took, so that on a shared, busy machine every
// library meets the same noise; it reports each one's rate and its ratio
// to raw ("<library>/raw").
//
// With 16 goroutines it also counts, untimed, per grant (benchkit.Counted):
// each library's round trips (gRPC multiplexes the requests of goroutines
// sharing a connection: concurrent requests sent before an answer count
// once), and what the server's /metrics add up: the gRPC requests it
// received (requests: unary requests and stream messages; txns, ranges,
// lease-msgs and watch-msgs of them), the Raft proposals it committed
// (proposals) and its WAL fsyncs (wal-fsyncs); and the CPU time per grant
// of this process (client-cpu-µs, the counting proxy's included) and of
// the server, when scripts/testenv started it (server-cpu-µs).
func BenchmarkInterleaved(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
			var opts []benchkit.Option
			if g > 1 {
				u := fencelockURL(b)
				route := func(*testing.B) benchkit.Route { return benchkit.Route{Var: "FENCELOCK_BENCH_ETCD", URL: u} }
				var server benchkit.CPUFunc
				if os.Getenv("FENCELOCK_BENCH_ETCD") == "" {
					server = benchkit.TestenvCPU("etcd")
				}
				counters := append(metricsCounters(b, u), benchkit.CPUCounters(server)...)
				opts = append(opts, benchkit.Counted(countedGrants, route, counters...))
			}
			benchkit.Interleaved(b, g, 50*g, libs, opts...)
		})
	}
}

// countedGrants is how many acquire+release cycles the untimed counting
// pass of the 16-goroutine workload runs per library.
const countedGrants = 800

// metricsCounters reads the Prometheus counters of the etcd server at
// rawURL (its client port serves /metrics over plain HTTP); none for an
// etcds:// URL or a URL of several servers, whose counters would need a
// client certificate or a sum. The gRPC messages the server received count
// unary requests and the messages of streams alike (a lease keep-alive, a
// watch created or cancelled).
func metricsCounters(b *testing.B, rawURL string) []benchkit.Counter {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "etcd" || strings.Contains(u.Host, ",") {
		return nil
	}
	endpoint := "http://" + u.Host + "/metrics"
	hc := &http.Client{Timeout: 10 * time.Second}
	metric := func(name string, methods ...string) func() (float64, error) {
		return func() (float64, error) { return scrape(hc, endpoint, name, methods) }
	}
	const msgs = "grpc_server_msg_received_total"
	return []benchkit.Counter{
		{Name: "requests", Read: metric(msgs)},
		{Name: "txns", Read: metric(msgs, "Txn")},
		{Name: "ranges", Read: metric(msgs, "Range")},
		{Name: "lease-msgs", Read: metric(msgs, "LeaseGrant", "LeaseKeepAlive", "LeaseRevoke", "LeaseTimeToLive")},
		{Name: "watch-msgs", Read: metric(msgs, "Watch")},
		{Name: "proposals", Read: metric("etcd_server_proposals_committed_total")},
		// The WAL fsyncs' latency histogram counts them.
		{Name: "wal-fsyncs", Read: metric("etcd_disk_wal_fsync_duration_seconds")},
	}
}

// scrape sums the samples of counter, gauge or histogram's count name, of the
// gRPC methods named if any, in the Prometheus text endpoint serves.
func scrape(hc *http.Client, endpoint, name string, methods []string) (float64, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, endpoint, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", endpoint, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", endpoint, err)
	}
	f, ok := families[name]
	if !ok {
		return 0, fmt.Errorf("%s serves no %s", endpoint, name)
	}
	var total float64
	for _, m := range f.GetMetric() {
		if len(methods) > 0 && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
			return l.GetName() == "grpc_method" && slices.Contains(methods, l.GetValue())
		}) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			total += m.GetCounter().GetValue()
		case m.GetGauge() != nil: // etcd_server_proposals_committed_total is one
			total += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total, nil
}
