package benchkit

import (
	"strconv"
	"strings"
	"time"
)

// Option adapts a loop's behaviour or the names of its metrics.
type Option func(*config)

type config struct {
	rate     string
	unit     time.Duration
	barging  bool
	fresh    bool
	holds    []time.Duration
	server   CPUFunc
	counters []counter
	counted  *countPass
}

type counter struct {
	name string
	read func() (float64, error)
}

func newConfig(opts []Option) config {
	c := config{rate: "acq+rel/s", unit: time.Microsecond}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// Rate names the throughput metric of Uncontended and Distinct, and the
// suffix of each Lib's rate in Interleaved ("acq+rel/s" by default).
func Rate(name string) Option { return func(c *config) { c.rate = name } }

// Unit sets the unit of every latency and wait metric, and of its name:
// time.Microsecond ("p50-wait-µs", the default) or time.Millisecond
// ("p50-wait-ms").
func Unit(d time.Duration) Option { return func(c *config) { c.unit = d } }

// Barging makes Contended and InterleavedContended loop freely: a goroutine
// that released the lock may take it straight back, and the wait is
// measured from the call to wait to its return. Without it a goroutine that
// released does not try again until another one has taken the lock (so
// every acquisition is a real handoff), and the wait of a handoff runs from
// the start of the holder's release to the next holder's return.
func Barging() Option { return func(c *config) { c.barging = true } }

// FreshKeys makes Uncontended, Distinct and Interleaved acquire a new key
// in every cycle instead of one key per goroutine (for stores that keep a
// record after release, this measures creating it rather than reusing it).
func FreshKeys() Option { return func(c *config) { c.fresh = true } }

// Holds runs Contended once for each duration, as a sub-benchmark
// "hold=<d>" in which every holder keeps the lock for d before releasing
// it. Without it the holder releases at once, with no sub-benchmark level.
func Holds(d ...time.Duration) Option { return func(c *config) { c.holds = d } }

// ServerCPU makes Contended report the server's CPU during the run as
// "server-cpu-%" (of one core); nil, or a CPUFunc that cannot tell, reports
// nothing.
func ServerCPU(f CPUFunc) Option { return func(c *config) { c.server = f } }

// PerHandoff makes Contended report, as metric name, how much the value
// read returns grew during the run per handoff (commands or transactions
// the server counted, say). read is called outside the timed loop, so it
// may wait for a lazily updated statistic.
func PerHandoff(name string, read func() (float64, error)) Option {
	return func(c *config) { c.counters = append(c.counters, counter{name, read}) }
}

// in converts d to the configured unit.
func (c config) in(d time.Duration) float64 { return float64(d) / float64(c.unit) }

// unitName is the configured unit as metric names spell it.
func (c config) unitName() string { return strings.TrimPrefix(c.unit.String(), "1") }

// keyer returns the function naming the key of goroutine i in cycle n.
func (c config) keyer(base string) func(i, n int) string {
	if c.fresh {
		return func(i, n int) string { return base + "-" + strconv.Itoa(i) + "-" + strconv.Itoa(n) }
	}
	return func(i, _ int) string { return base + "-" + strconv.Itoa(i) }
}
