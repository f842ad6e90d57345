package suite

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/cluster"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/report"
)

// Redis eviction faults: a Redis of the cell's own (started with
// scripts/testenv's helpers, so redis-server must be installed on the
// machine that runs the suite) under a maxmemory-policy, whose memory a
// filler pushes past maxmemory while contenders hold locks. They run on
// redis:// backends when named in Config.Faults (or GroupEviction); they
// are not in DefaultFaults, because they start a server of their own
// rather than measuring the caller's.
const (
	FaultEvictAllkeysLRU = "redis-evict-allkeys-lru"  // maxmemory-policy allkeys-lru
	FaultEvictVolatile   = "redis-evict-volatile-lru" // maxmemory-policy volatile-lru
	FaultEvictVolTTL     = "redis-evict-volatile-ttl" // maxmemory-policy volatile-ttl
	FaultEvictNone       = "redis-evict-noeviction"   // maxmemory-policy noeviction

	// GroupEviction is every Redis eviction fault, for Config.Faults.
	GroupEviction = "redis-eviction"
)

// EvictionFaults are the Redis eviction faults, one per maxmemory-policy.
var EvictionFaults = []string{FaultEvictAllkeysLRU, FaultEvictVolatile, FaultEvictVolTTL, FaultEvictNone}

// evictionPolicy is the maxmemory-policy of an eviction fault.
func evictionPolicy(fault string) string { return strings.TrimPrefix(fault, "redis-evict-") }

// The expectations of the eviction cells (added to expectations below).
var evictionExpectations = report.Table{
	{Backend: "*", Fault: FaultEvictAllkeysLRU, Expectation: report.Expectation{
		Unsafe:     true,
		Properties: []string{"P1", "P2", "P3", "P4", "P5", "P6"},
		Why: "allkeys-lru may evict any key: a live lock record (a waiting contender acquires while its holder still " +
			"believes: two holders) and a token counter (the next grant starts again from 1: tokens repeat or go " +
			"backwards, and the fenced resource can no longer tell holders apart or refuses the new holder). Lock " +
			"records and counters are touched often, so LRU usually evicts other keys first: whether a run shows it " +
			"depends on how many other keys are colder; the setup column counts what was evicted.",
		Fix: "`maxmemory-policy noeviction` on the lock Redis (fencelock's Describe warns about allkeys-* and volatile-*), " +
			"or a Redis of its own for locks with no memory pressure.",
	}},
	{Backend: "*", Fault: FaultEvictVolatile, Expectation: report.Expectation{
		Unsafe:     true,
		Properties: []string{"P3", "P4", "P5", "P6"},
		Why: "volatile-lru evicts only keys with a TTL. Every lock record has one (its lease) and the counters do not, so " +
			"when the other data has no TTL the live locks are the only candidates: they go first, a waiting contender " +
			"acquires while the holder still believes (two holders, until its next renewal fails), and once no lock is " +
			"left Redis refuses writes (OOM) so acquisitions fail. The counters survive: the fenced resource still " +
			"refuses the old holder's writes once the new holder has written.",
		Fix: "`maxmemory-policy noeviction`; pass the fencing token with every write to the protected resource.",
	}},
	{Backend: "*", Fault: FaultEvictVolTTL, Expectation: report.Expectation{
		Unsafe:     true,
		Properties: []string{"P3", "P4", "P5", "P6"},
		Why: "volatile-ttl evicts the keys with a TTL, shortest remaining TTL first: lock records are exactly those (the " +
			"counters have no TTL), so under memory pressure live locks are evicted before anything else; two holders " +
			"as under volatile-lru, tokens intact.",
		Fix: "`maxmemory-policy noeviction`; pass the fencing token with every write to the protected resource.",
	}},
	{Backend: "*", Fault: FaultEvictNone, Expectation: report.Expectation{
		Tolerate: []string{"P5", "P6"},
		Why: "noeviction never removes a key: locks and counters stay, so exclusion and fencing hold. Above maxmemory Redis " +
			"refuses commands that may grow memory (OOM), so acquisitions fail while the memory stays full: a liveness " +
			"loss (P5, P6), not a safety one.",
	}},
}

func init() { expectations = append(expectations, evictionExpectations...) }

// evictionCells are the eviction cells of a redis:// backend.
func evictionCells(be *backendEnv, prof profile) []cellSpec {
	var specs []cellSpec
	for _, f := range EvictionFaults {
		specs = append(specs, evictionCell(be, prof, f))
	}
	return specs
}

// evictionWindow is how long a round keeps the memory full, in TTLs.
const evictionWindow = 2

// evictionCell: a Redis of the cell's own under policy; in each round,
// once a fresh holder holds a lock, maxmemory is set just above the
// memory in use and a filler writes keys without a TTL (in database 15,
// apart from the locks) for evictionWindow TTLs, then the filler's keys
// are deleted and the limit lifted. The server's keyspace notifications
// count what was evicted: lock records, token counters, filler keys.
func evictionCell(be *backendEnv, prof profile, fault string) cellSpec {
	ttl := be.ttl
	policy := evictionPolicy(fault)
	var ev evictionCounts
	oom := 0
	return cellSpec{fault: fault, fencing: true, keys: 2, hold: ttl,
		server: func(ctx context.Context) (string, func(), error) { return startEvictionRedis(ctx, policy) },
		run: func(ctx context.Context, c *cell) (int, error) {
			w, err := watchEvictions(ctx, c.be.url)
			if err != nil {
				return 0, err
			}
			defer func() { ev = w.stop() }()
			for i := range prof.rounds {
				mark := c.log.mark()
				if _, err := c.awaitEvent(ctx, 10*ttl, mark, "a new holder", func(e history.Event) bool {
					return e.Kind == history.Acquired
				}); err != nil {
					return i, err
				}
				if err := c.round("", "memory filled past maxmemory ("+policy+")", func() error {
					return fillMemory(ctx, c.be.url, evictionWindow*ttl, &oom)
				}); err != nil {
					return i + 1, err
				}
				if err := between(ctx, i, prof.rounds, ttl); err != nil {
					return i + 1, err
				}
			}
			return prof.rounds, nil
		},
		after: func(c *cell, res check.Result) error {
			// What the contenders managed while the memory was full.
			acq, lost := 0, 0
			for _, e := range c.log.snapshot() {
				for _, r := range c.rounds {
					if e.T >= r.from && e.T <= r.to {
						switch e.Kind {
						case history.Acquired:
							acq++
						case history.Lost:
							lost++
						}
					}
				}
			}
			c.spec.setup = fmt.Sprintf("own Redis, maxmemory-policy %s, maxmemory set just above the memory in use while a filler "+
				"writes keys without TTL for %d×TTL per round: %d keys evicted (%d lock records, %d token counters, %d filler keys), "+
				"%d filler writes refused (OOM); while the memory was full %d leases acquired and %d lost",
				policy, evictionWindow, ev.total(), ev.locks, ev.counters, ev.filler, oom, acq, lost)
			return nil
		},
	}
}

// startEvictionRedis starts a Redis with scripts/testenv's helpers in a
// state dir of its own, sets its maxmemory-policy, turns its AOF off
// (the cells measure eviction, not persistence; the filler's writes
// need not reach the disk) and turns on the keyspace notifications of
// evictions.
func startEvictionRedis(ctx context.Context, policy string) (string, func(), error) {
	uctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	te, err := cluster.Up(uctx, "redis")
	if err != nil {
		return "", nil, err
	}
	stop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = te.Down(dctx)
	}
	url := te.URL("redis")
	if url == "" {
		stop()
		return "", nil, errors.New("scripts/testenv could not start a redis-server (is it installed?)")
	}
	for _, kv := range [][2]string{{"maxmemory-policy", policy}, {"appendonly", "no"}, {"notify-keyspace-events", "Ee"}} {
		if _, err := redisDo(uctx, url, "CONFIG", "SET", kv[0], kv[1]); err != nil {
			stop()
			return "", nil, fmt.Errorf("CONFIG SET %s %s: %w", kv[0], kv[1], err)
		}
	}
	return url, stop, nil
}

// fillerDB is the database the filler writes to: apart from the locks
// (database 0), so that FLUSHDB removes the filler alone.
const fillerDB = 15

// evictionCounts counts the keys a cell's server evicted, by kind.
type evictionCounts struct {
	locks, counters, filler, other int
}

func (e evictionCounts) total() int { return e.locks + e.counters + e.filler + e.other }

// evictionWatch counts evictions from the server's keyspace
// notifications.
type evictionWatch struct {
	ps   *goredis.PubSub
	c    *goredis.Client
	mu   sync.Mutex
	n    evictionCounts
	done chan struct{}
}

// watchEvictions subscribes to the evicted-key notifications of the
// lock and filler databases, and returns once the subscription is in
// place.
func watchEvictions(ctx context.Context, rawURL string) (*evictionWatch, error) {
	opt, err := goredis.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	c := goredis.NewClient(opt)
	ps := c.Subscribe(ctx, fmt.Sprintf("__keyevent@%d__:evicted", opt.DB), fmt.Sprintf("__keyevent@%d__:evicted", fillerDB))
	for range 2 {
		if _, err := ps.Receive(ctx); err != nil { // the subscription confirmations
			ps.Close()
			c.Close()
			return nil, fmt.Errorf("subscribing to evictions: %w", err)
		}
	}
	w := &evictionWatch{ps: ps, c: c, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for m := range ps.Channel() {
			w.mu.Lock()
			switch {
			case strings.HasSuffix(m.Channel, fmt.Sprintf("@%d__:evicted", fillerDB)):
				w.n.filler++
			case strings.HasPrefix(m.Payload, "{fencelock:") && strings.HasSuffix(m.Payload, lockSuffixName):
				w.n.locks++
			case strings.HasPrefix(m.Payload, "{fencelock:") && strings.HasSuffix(m.Payload, tokenSuffixName):
				w.n.counters++
			default:
				w.n.other++
			}
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// Suffixes of the Redis backend's key names (backend/redis/keys.go).
const (
	lockSuffixName  = "}:lock"
	tokenSuffixName = "}:token"
)

// stop ends the subscription and returns the counts. Notifications
// still in flight when it is called are lost: it is called after the
// cell's cool-down, long after the last eviction.
func (w *evictionWatch) stop() evictionCounts {
	w.ps.Close()
	<-w.done
	w.c.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// fillMemory sets the server's maxmemory just above the memory in use
// and, for d, writes 4 KiB values without a TTL into fillerDB, 32 per
// 20 ms; then it deletes them and lifts the limit. Writes refused for
// lack of memory (noeviction, or volatile-* with no key left to evict)
// are counted in *oom.
func fillMemory(ctx context.Context, rawURL string, d time.Duration, oom *int) error {
	opt, err := goredis.ParseURL(rawURL)
	if err != nil {
		return err
	}
	opt.DB = fillerDB
	c := goredis.NewClient(opt)
	defer c.Close()
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return err
	}
	used, err := infoField(info, "used_memory")
	if err != nil {
		return err
	}
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+256<<10, 10)).Err(); err != nil {
		return err
	}
	// Always lift the limit and drop the filler, or the cool-down and
	// the next cell would run out of memory.
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		c.FlushDB(cctx)
		c.ConfigSet(cctx, "maxmemory", "0")
	}()
	value := strings.Repeat("x", 4<<10)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	end := time.After(d)
	n := 0
	for {
		p := c.Pipeline()
		for range 32 {
			n++
			p.Set(ctx, "filler:"+strconv.Itoa(n), value, 0)
		}
		cmds, _ := p.Exec(ctx)
		for _, cmd := range cmds {
			if err := cmd.Err(); err != nil {
				if !strings.HasPrefix(err.Error(), "OOM") {
					return fmt.Errorf("filler: %w", err)
				}
				*oom++
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end:
			return nil
		case <-tick.C:
		}
	}
}

// infoField returns an integer field of an INFO reply.
func infoField(info, name string) (int64, error) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO has no %s", name)
}
