package benchkit

import (
	"bufio"
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
)

// lineServer answers every line it reads with "ok\n" and counts the lines:
// a stand-in for a store's wire, to check what the counting proxy counts.
func lineServer(t *testing.T) (addr string, lines *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lines = new(atomic.Int64)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					lines.Add(1)
					if _, err := c.Write([]byte("ok\n")); err != nil {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String(), lines
}

// lineLib is a "lock" on a lineServer whose address it reads from
// environment variable v at Setup, a connection per goroutine (its try and
// its wait are the same, and exclude nobody): an acquire+release is two
// requests, each answered before the next
// (pipelined false), or both written at once (true).
func lineLib(name, v string, pipelined bool) Lib {
	return Lib{Name: name, Setup: func(b *testing.B) Lockers {
		return func(int) (try, wait LockFunc) {
			c, err := net.Dial("tcp", os.Getenv(v)[len("line://"):])
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			r := bufio.NewReader(c)
			ask := func(req string, answers int) error {
				if _, err := c.Write([]byte(req)); err != nil {
					return err
				}
				for range answers {
					if _, err := r.ReadString('\n'); err != nil {
						return err
					}
				}
				return nil
			}
			lock := func(context.Context, string) (func() error, error) {
				if pipelined {
					return func() error { return nil }, ask("acquire\nrelease\n", 2)
				}
				if err := ask("acquire\n", 1); err != nil {
					return nil, err
				}
				return func() error { return ask("release\n", 1) }, nil
			}
			return lock, lock
		}
	}}
}

// Counted reports, per grant, the round trips the proxy saw (a pipeline of
// two requests is one) and each counter's growth, for every Lib; and the
// lone caller's latencies come with a one-goroutine Interleaved.
func TestCountedRoundTripsAndCounters(t *testing.T) {
	if testing.Short() {
		t.Skip("Counted does not run with -short")
	}
	addr, lines := lineServer(t)
	const v = "BENCHKIT_TEST_LINE_SERVER"
	t.Setenv(v, "line://"+addr)
	libs := []Lib{lineLib("sequential", v, false), lineLib("pipelined", v, true)}
	route := func(*testing.B) Route { return Route{Var: v, URL: "line://" + addr} }
	count := Counter{Name: "requests", Read: func() (float64, error) { return float64(lines.Load()), nil }}
	r := bench(t, 2, func(b *testing.B) { Interleaved(b, 4, 8, libs, Counted(40, route, count)) })
	want := map[string]float64{
		"sequential-rtt/grant": 2, "sequential-requests/grant": 2,
		"pipelined-rtt/grant": 1, "pipelined-requests/grant": 2,
	}
	for m, w := range want {
		if got, ok := r.Extra[m]; !ok || got != w {
			t.Errorf("%s = %v (reported: %v); want %v", m, got, ok, w)
		}
	}
	if _, ok := r.Extra["sequential-p50-µs"]; ok {
		t.Error("latencies reported for 4 goroutines; want them for a lone caller only")
	}
	r = bench(t, 2, func(b *testing.B) { Interleaved(b, 1, 8, libs) })
	wantMetrics(t, "Interleaved", r, "sequential-p50-µs", "sequential-p99-µs", "pipelined-p50-µs", "pipelined-p99-µs")
	if r.Extra["pipelined-p99-µs"] < r.Extra["pipelined-p50-µs"] {
		t.Errorf("p99 %v below p50 %v", r.Extra["pipelined-p99-µs"], r.Extra["pipelined-p50-µs"])
	}
}

// With InterleavedContended, Counted reports the same per handoff, divided
// by the acquisitions the counting pass made (at least its cycles).
func TestCountedPerHandoff(t *testing.T) {
	if testing.Short() {
		t.Skip("Counted does not run with -short")
	}
	addr, lines := lineServer(t)
	const v = "BENCHKIT_TEST_LINE_SERVER"
	t.Setenv(v, "line://"+addr)
	libs := []Lib{lineLib("sequential", v, false), lineLib("pipelined", v, true)}
	route := func(*testing.B) Route { return Route{Var: v, URL: "line://" + addr} }
	count := Counter{Name: "requests", Read: func() (float64, error) { return float64(lines.Load()), nil }}
	for _, barging := range []bool{false, true} {
		opts := []Option{Counted(40, route, count)}
		if barging {
			opts = append(opts, Barging())
		}
		r := bench(t, 1, func(b *testing.B) { InterleavedContended(b, 3, 6, libs, opts...) })
		want := map[string]float64{
			"sequential-rtt/handoff": 2, "sequential-requests/handoff": 2,
			"pipelined-rtt/handoff": 1, "pipelined-requests/handoff": 2,
		}
		for m, w := range want {
			if got, ok := r.Extra[m]; !ok || got != w {
				t.Errorf("barging %v: %s = %v (reported: %v); want %v", barging, m, got, ok, w)
			}
		}
		if _, ok := r.Extra["sequential-rtt/grant"]; ok {
			t.Errorf("barging %v: a contended pass reported per grant; want per handoff", barging)
		}
	}
}
