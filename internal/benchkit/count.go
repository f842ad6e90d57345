package benchkit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Counter is a count a store keeps of its own work (WAL syncs, commands
// processed, bytes received), read before and after a Lib's counted cycles
// (see Counted). Read may wait for a lazily updated statistic; it runs
// outside every timed loop.
type Counter struct {
	// Name names the metric "<lib>-<Name>/grant".
	Name string
	Read func() (float64, error)
}

// Route is how the counted cycles reach the server through a counting
// proxy: Var is the environment variable the Libs' Setup reads the
// server's URL from (ServerURL's first), URL the server's URL. The proxy
// listens on the loopback and forwards every connection to URL's host;
// Var is set to URL with the proxy's address for the counted Setups.
type Route struct {
	Var string
	URL string
}

// Counted makes Interleaved run, after its timed rounds and untimed,
// every Lib once more on cycles acquire+release cycles spread over the same
// goroutines, each Lib set up anew behind a counting proxy (route), and
// report per cycle (per grant) for each Lib:
//
//   - "<lib>-rtt/grant": client round trips, counted by the proxy on every
//     connection as the turns from the server talking to the client
//     talking (requests the client sends before an answer arrives count
//     once: a pipeline is one round trip; so do the concurrent requests of
//     goroutines sharing a multiplexed connection, such as gRPC's);
//   - "<lib>-<name>/grant" for every counter, its growth.
//
// With InterleavedContended the pass runs at least cycles handoffs among
// the same goroutines on one key, as the timed rounds do (Barging
// included), and reports the same metrics per handoff
// ("<lib>-rtt/handoff", "<lib>-<name>/handoff"), divided by the
// acquisitions the pass made.
//
// One warm-up cycle per goroutine runs before the counts are taken, so
// that pools, tables and sessions opened on first use are not counted.
// The server's own counters count whatever else the server serves
// meanwhile: on a shared server they are upper bounds. With -short the
// pass does not run.
func Counted(cycles int, route func(b *testing.B) Route, counters ...Counter) Option {
	return func(c *config) {
		c.counted = &countPass{cycles: cycles, route: route, counters: counters}
	}
}

type countPass struct {
	cycles   int
	route    func(b *testing.B) Route
	counters []Counter
}

// run is the counting pass of Interleaved (see Counted).
func (p *countPass) run(b *testing.B, goroutines int, libs []Lib, keyer func(string) func(i, n int) string) {
	base := UniqueKey()
	p.each(b, libs, goroutines, false, "grant", func(li int, locks []LockFunc, warm bool) (int, error) {
		key := keyer(base + "-" + libTag(li))
		if warm {
			_, _, err := cycles(locks, goroutines, 0, key, false)
			return goroutines, err
		}
		_, _, err := cycles(locks, p.cycles, goroutines, key, false)
		return p.cycles, err
	})
}

// runContended is the counting pass of InterleavedContended (see Counted).
func (p *countPass) runContended(b *testing.B, goroutines int, libs []Lib, barging bool) {
	ctx, cancel := context.WithTimeout(context.Background(), contendedTimeout)
	defer cancel()
	keys := make([]string, len(libs))
	for li := range keys {
		keys[li] = UniqueKey()
	}
	p.each(b, libs, goroutines, true, "handoff", func(li int, locks []LockFunc, warm bool) (int, error) {
		n := p.cycles
		if warm {
			n = goroutines
		}
		r := handoffs(ctx, locks, keys[li], n, 0, barging)
		return r.count, r.err
	})
}

// each sets every Lib up anew behind the counting proxy and reports its
// round trips and counters per unit: loop(li, locks, warm) runs the
// warm-up (warm) or the counted work and returns how many units it did.
func (p *countPass) each(b *testing.B, libs []Lib, goroutines int, blocking bool, unit string, loop func(li int, locks []LockFunc, warm bool) (int, error)) {
	if testing.Short() || p.cycles <= 0 {
		return
	}
	r := p.route(b)
	px, via, err := startProxy(r.URL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(px.close)
	b.Setenv(r.Var, via)
	for li, lib := range libs {
		locks := lockers(b, lib, goroutines, blocking)
		if _, err := loop(li, locks, true); err != nil {
			b.Fatalf("%s (counted warm-up): %v", lib.Name, err)
		}
		before, err := p.read()
		if err != nil {
			b.Fatalf("%s: %v", lib.Name, err)
		}
		trips := px.trips.Load()
		done, err := loop(li, locks, false)
		if err != nil {
			b.Fatalf("%s (counted): %v", lib.Name, err)
		}
		trips = px.trips.Load() - trips
		after, err := p.read()
		if err != nil {
			b.Fatalf("%s: %v", lib.Name, err)
		}
		n := float64(max(done, 1))
		b.ReportMetric(float64(trips)/n, lib.Name+"-rtt/"+unit)
		for i, ct := range p.counters {
			b.ReportMetric((after[i]-before[i])/n, lib.Name+"-"+ct.Name+"/"+unit)
		}
	}
}

func (p *countPass) read() ([]float64, error) {
	v := make([]float64, len(p.counters))
	for i, ct := range p.counters {
		x, err := ct.Read()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", ct.Name, err)
		}
		v[i] = x
	}
	return v, nil
}

// Settled wraps read, a statistic the server updates lazily, so that it
// returns only once two reads interval apart agree and at least least has
// passed (or after most, with the last value read): PostgreSQL's
// cumulative statistics, for one, reach the views up to a second after
// the transactions they count.
func Settled(read func() (float64, error), interval, least, most time.Duration) func() (float64, error) {
	return func() (float64, error) {
		start := time.Now()
		last, err := read()
		if err != nil {
			return 0, err
		}
		for {
			time.Sleep(interval) // polling a statistic nothing signals
			v, err := read()
			if err != nil {
				return 0, err
			}
			el := time.Since(start)
			if (v == last && el >= least) || el >= most {
				return v, nil
			}
			last = v
		}
	}
}

// proxy forwards loopback connections to a server and counts round trips.
type proxy struct {
	ln     net.Listener
	target string
	trips  atomic.Int64
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

// startProxy starts a proxy for the server of rawURL and returns it with
// rawURL naming the proxy instead.
func startProxy(rawURL string) (*proxy, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return nil, "", errors.New("benchkit: the counting proxy needs a URL with a host (scheme://host:port/...)")
	}
	if strings.Contains(u.Host, ",") {
		return nil, "", errors.New("benchkit: the counting proxy forwards to one server; the URL names several")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	p := &proxy{ln: ln, target: u.Host}
	p.wg.Go(p.accept)
	u.Host = ln.Addr().String()
	return p, u.String(), nil
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 10*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var dir atomic.Int32 // 0: nothing yet, 1: client talking, 2: server talking
		pipe := func(dst, src net.Conn, up bool) {
			defer dst.Close()
			defer src.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					if up {
						if dir.Swap(1) != 1 {
							p.trips.Add(1)
						}
					} else {
						dir.Store(2)
					}
					if _, werr := dst.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil { // io.EOF or a closed connection
					return
				}
			}
		}
		p.wg.Go(func() { pipe(s, c, true) })
		p.wg.Go(func() { pipe(c, s, false) })
	}
}

// close stops accepting, cuts every forwarded connection and waits for the
// proxy's goroutines.
func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// CPUCounters returns Counters of CPU time in µs for Counted: this
// process's ("client-cpu-µs": the libraries' client side, with the
// counting proxy's copying, which grows with the round trips) and, if
// server is not nil, the server's ("server-cpu-µs"). The server's is
// counted in clock ticks (10 ms): count enough cycles for it to mean
// something. A CPUFunc that cannot tell fails the run.
func CPUCounters(server CPUFunc) []Counter {
	cs := []Counter{{Name: "client-cpu-µs", Read: func() (float64, error) {
		d := processCPU()
		if d < 0 {
			return 0, errors.New("benchkit: this process's CPU time is unknown")
		}
		return float64(d) / float64(time.Microsecond), nil
	}}}
	if server != nil {
		cs = append(cs, Counter{Name: "server-cpu-µs", Read: func() (float64, error) {
			d, ok := server()
			if !ok {
				return 0, errors.New("benchkit: the server's CPU time is unknown (did it stop?)")
			}
			return float64(d) / float64(time.Microsecond), nil
		}})
	}
	return cs
}
