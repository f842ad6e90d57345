package zookeeper_test

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/benchkit"
)

// countedGrants is how many acquire+release cycles (or handoffs) the
// untimed counting pass of BenchmarkInterleaved's 16 goroutines and of
// BenchmarkInterleavedContended runs per library (benchkit.Counted).
const countedGrants = 400

// counted is the benchkit.Counted option of this package's interleaved
// benchmarks: round trips through a counting proxy, the server's mntr
// counters (when its four-letter words allow mntr) and the CPU of this
// process and, when scripts/testenv started it, of the server.
func counted(b *testing.B) benchkit.Option {
	u := setup(b).url
	route := func(*testing.B) benchkit.Route { return benchkit.Route{Var: "FENCELOCK_TEST_ZOOKEEPER", URL: u} }
	counters := mntrCounters(b, u)
	counters = append(counters, benchkit.CPUCounters(benchkit.TestenvCPU("zookeeper"))...)
	return benchkit.Counted(countedGrants, route, counters...)
}

// mntrCounters reads, with the mntr four-letter word, what the server at
// rawURL counts: the requests it received (requests: zk_packets_received,
// pings included), the writes and reads it served (writes:
// zk_cnt_updatelatency; reads: zk_cnt_readlatency) and its transaction
// log fsyncs (fsyncs: zk_cnt_fsynctime). None if the URL names several
// servers or the server does not answer mntr (a server whose
// 4lw.commands.whitelist leaves it out, such as the distribution's stock
// configuration).
func mntrCounters(b *testing.B, rawURL string) []benchkit.Counter {
	u, err := url.Parse(rawURL)
	if err != nil || strings.Contains(u.Host, ",") {
		return nil
	}
	if _, err := mntr(u.Host); err != nil {
		b.Logf("no server counters: %v", err)
		return nil
	}
	stat := func(name string) func() (float64, error) {
		return func() (float64, error) {
			m, err := mntr(u.Host)
			if err != nil {
				return 0, err
			}
			v, ok := m[name]
			if !ok {
				return 0, fmt.Errorf("mntr of %s has no %s", u.Host, name)
			}
			return v, nil
		}
	}
	return []benchkit.Counter{
		{Name: "requests", Read: stat("zk_packets_received")},
		{Name: "writes", Read: stat("zk_cnt_updatelatency")},
		{Name: "reads", Read: stat("zk_cnt_readlatency")},
		{Name: "fsyncs", Read: stat("zk_cnt_fsynctime")},
	}
}

// mntr sends the mntr four-letter word to the server at host and returns
// its numeric lines.
func mntr(host string) (map[string]float64, error) {
	c, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte("mntr")); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "\t")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[k] = f
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s does not answer mntr (not in its 4lw.commands.whitelist?)", host)
	}
	return out, nil
}
