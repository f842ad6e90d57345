// Package zookeeper_test benchmarks fencelock's ZooKeeper backend against
// the raw store operations (create an EPHEMERAL|SEQUENTIAL znode, delete
// it: the limit) and against go-zookeeper's own zk.Lock.
//
//	eval "$(scripts/testenv up zookeeper)"
//	cd bench/zookeeper && go test -bench . -benchtime 3s
package zookeeper_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/zookeeper"
	"github.com/fencelock/fencelock/internal/benchkit"
	"github.com/go-zookeeper/zk"
)

// sessTO is the session timeout of the raw and zk.Lock connections:
// fencelock's URL default, which its clients get.
const sessTO = 15 * time.Second

type env struct {
	url     string
	servers []string
	root    string // for raw
	zkRoot  string // for zk.Lock
}

// setup gives a run the server's URL as a URL user writes it, so
// fencelock runs under its default prefix ("/fencelock"), and roots of
// the same length for raw and zk.Lock (the znodes' own names are each
// library's: raw's lock-<seq>, zk.Lock's _c_<32 hex>-lock-<seq>). Runs do not share keys: every
// benchmark's keys start with a fresh benchkit.UniqueKey.
func setup(b *testing.B) env {
	u, err := url.Parse(benchkit.ServerURL(b, "FENCELOCK_TEST_ZOOKEEPER"))
	if err != nil {
		b.Fatal(err)
	}
	return env{url: u.String(), servers: strings.Split(u.Host, ","), root: "/bench-raw", zkRoot: "/bench-zkl"}
}

func (e env) conn(b *testing.B) *zk.Conn {
	c, _, err := zk.Connect(e.servers, sessTO, zk.WithLogInfo(false))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	// Wait for the session.
	for c.State() != zk.StateHasSession {
		time.Sleep(time.Millisecond)
	}
	return c
}

// ensureParent creates the key's parent p, once per run (parents holds
// the ones created), and returns it.
func ensureParent(c *zk.Conn, parents *sync.Map, p string) (string, error) {
	if _, ok := parents.Load(p); !ok {
		if err := ensure(c, p); err != nil {
			return "", err
		}
		parents.Store(p, true)
	}
	return p, nil
}

func ensure(c *zk.Conn, p string) error {
	cur := ""
	for _, seg := range strings.Split(p[1:], "/") {
		cur += "/" + seg
		if _, err := c.Create(cur, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// raw is the store's limit: create an ephemeral sequential znode under the
// key's parent and delete it. It excludes nobody, so it cannot wait.
var raw = benchkit.Lib{Name: "raw", Setup: func(b *testing.B) benchkit.Lockers {
	e := setup(b)
	c := e.conn(b)
	var parents sync.Map // parents created
	return benchkit.Same(func(_ context.Context, key string) (func() error, error) {
		parent, err := ensureParent(c, &parents, e.root+"/"+key)
		if err != nil {
			return nil, err
		}
		p, err := c.Create(parent+"/lock-", []byte("owner"), zk.FlagEphemeralSequential, zk.WorldACL(zk.PermAll))
		if err != nil {
			return nil, err
		}
		return func() error { return c.Delete(p, -1) }, nil
	}, nil)
}}

// zklock is go-zookeeper's zk.Lock, which can only wait: on one session
// shared by the goroutines, or one session each, as separate processes.
func zklock(shared bool) benchkit.Lib {
	return benchkit.Lib{Name: "zklock", Setup: func(b *testing.B) benchkit.Lockers {
		e := setup(b)
		var conn *zk.Conn
		if shared {
			conn = e.conn(b)
		}
		return func(int) (try, wait benchkit.LockFunc) {
			c := conn
			if c == nil {
				c = e.conn(b)
			}
			return nil, func(_ context.Context, key string) (func() error, error) {
				l := zk.NewLock(c, e.zkRoot+"/"+key, zk.WorldACL(zk.PermAll))
				if err := l.Lock(); err != nil {
					return nil, err
				}
				return l.Unlock, nil
			}
		}
	}}
}

// fencelockLib is the fencelock client as a URL user gets it,
// fencelock.Open(ctx, URL, nil): one for the goroutines (one session), or
// one each, as separate processes.
func fencelockLib(shared bool) benchkit.Lib {
	return benchkit.FencelockLib("fencelock", shared, func(b *testing.B) func() (*fencelock.Client, error) {
		e := setup(b)
		return func() (*fencelock.Client, error) {
			return fencelock.Open(context.Background(), e.url, nil)
		}
	})
}

var (
	libs       = []benchkit.Lib{raw, zklock(true), fencelockLib(true)}
	contenders = []benchkit.Lib{zklock(false), fencelockLib(false)}
)

// BenchmarkUncontended: one goroutine, one key, acquire+release.
func BenchmarkUncontended(b *testing.B) { benchkit.Uncontended(b, libs, benchkit.Rate("ops/s")) }

// BenchmarkDistinct16: 16 goroutines of one process (one session), each on
// its own key.
func BenchmarkDistinct16(b *testing.B) { benchkit.Distinct(b, 16, libs, benchkit.Rate("ops/s")) }

// BenchmarkContended8: 8 contenders (each its own session, as separate
// processes would be) on one key, looping freely; the wait is one acquire
// call.
func BenchmarkContended8(b *testing.B) {
	benchkit.Contended(b, 8, contenders, benchkit.Barging(), benchkit.Unit(time.Millisecond),
		benchkit.ServerCPU(benchkit.TestenvCPU("zookeeper")))
}

// BenchmarkInterleaved measures the ratios on a noisy machine: each
// iteration runs a round of 100 acquire+release cycles (by 1 goroutine)
// or 400 (spread over 16 goroutines of one process, one key each) of each
// variant back to back (raw, zk.Lock, fencelock), and reports each
// one's rate and ratio to raw over all rounds. Run it with -benchtime 15x
// or so. With 16 goroutines it also counts, untimed, per grant (see
// counted): round trips, the server's requests, writes, reads and fsyncs,
// and the client's and the server's CPU.
func BenchmarkInterleaved(b *testing.B) {
	for _, r := range []struct{ goroutines, turn int }{{1, 100}, {16, 400}} {
		b.Run("goroutines="+strconv.Itoa(r.goroutines), func(b *testing.B) {
			opts := []benchkit.Option{benchkit.Rate("ops/s")}
			if r.goroutines > 1 {
				opts = append(opts, counted(b))
			}
			benchkit.Interleaved(b, r.goroutines, r.turn, libs, opts...)
		})
	}
}

// BenchmarkInterleavedContended alternates rounds of 200 handoffs among 8
// contenders (own sessions) on one key with zk.Lock and with fencelock,
// and reports the handoff rate of each and their ratio, plus wait
// percentiles over all rounds; and, untimed, the same counts as
// BenchmarkInterleaved per handoff.
func BenchmarkInterleavedContended(b *testing.B) {
	benchkit.InterleavedContended(b, 8, 200, contenders, benchkit.Barging(), benchkit.Unit(time.Millisecond), counted(b))
}
