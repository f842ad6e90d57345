package suite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/safety/check"
	"github.com/fencelock/fencelock/safety/contender"
	"github.com/fencelock/fencelock/safety/fence"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/mono"
	"github.com/fencelock/fencelock/safety/proc"
	"github.com/fencelock/fencelock/safety/report"
)

// harnessProc is the Proc of the events the harness writes about the
// store (faults that have no target contender).
const harnessProc = "harness"

// ---------------------------------------------------------------- event log

// eventLog collects the events of a cell's contenders and of the harness
// as they happen, and lets the harness wait for one.
type eventLog struct {
	mu      sync.Mutex
	evs     history.History
	more    chan struct{} // closed and replaced on every event
	holders map[string]holding
}

// holding is a lease its contender believes it holds, as far as the log
// knows (Acquired without a later Lost, ReleaseStart or Crash).
type holding struct {
	key, lease, proc string
	token            uint64
	t                int64
}

func newEventLog() *eventLog {
	return &eventLog{more: make(chan struct{}), holders: make(map[string]holding)}
}

// add is the Sink of every contender process and the harness's own
// recorder.
func (l *eventLog) add(ev history.Event) {
	if ev.T == 0 {
		ev.T = mono.Now()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, ev)
	switch ev.Kind {
	case history.Acquired:
		l.holders[ev.Key] = holding{key: ev.Key, lease: ev.Lease, proc: ev.Proc, token: ev.Token, t: ev.T}
	case history.Lost, history.ReleaseStart:
		if h, ok := l.holders[ev.Key]; ok && h.lease == ev.Lease {
			delete(l.holders, ev.Key)
		}
	case history.Crash:
		for k, h := range l.holders {
			if h.proc == ev.Proc {
				delete(l.holders, k)
			}
		}
	}
	close(l.more)
	l.more = make(chan struct{})
}

// mark returns the number of events so far, to await only later ones.
func (l *eventLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.evs)
}

func (l *eventLog) snapshot() history.History {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(history.History(nil), l.evs...)
}

// await waits for the first event at index ≥ from that matches.
func (l *eventLog) await(ctx context.Context, from int, match func(history.Event) bool) (history.Event, error) {
	for {
		l.mu.Lock()
		for ; from < len(l.evs); from++ {
			if match(l.evs[from]) {
				ev := l.evs[from]
				l.mu.Unlock()
				return ev, nil
			}
		}
		more := l.more
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return history.Event{}, ctx.Err()
		case <-more:
		}
	}
}

// count returns how many events at index ≥ from match.
func (l *eventLog) count(from int, match func(history.Event) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ev := range l.evs[min(from, len(l.evs)):] {
		if match(ev) {
			n++
		}
	}
	return n
}

// awaitHolding waits until some key is held by a lease that ok accepts,
// and returns one at random.
func (l *eventLog) awaitHolding(ctx context.Context, rng *rand.Rand, ok func(holding) bool) (holding, error) {
	for {
		l.mu.Lock()
		var hs []holding
		for _, h := range l.holders {
			if ok(h) {
				hs = append(hs, h)
			}
		}
		more := l.more
		l.mu.Unlock()
		if len(hs) > 0 {
			sort.Slice(hs, func(i, j int) bool { return hs[i].key < hs[j].key })
			return hs[rng.IntN(len(hs))], nil
		}
		select {
		case <-ctx.Done():
			return holding{}, fmt.Errorf("no lease held: %w", ctx.Err())
		case <-more:
		}
	}
}

// ---------------------------------------------------------------- backends

// backendEnv is one store under test.
type backendEnv struct {
	name   string // the report's name for it: "postgres", …
	scheme string // its URL's scheme, lower case
	url    string // as contenders open it
	proxy  bool   // contenders reach the store through their faultproxy
	// noProxy says why proxy is false.
	noProxy string
	ttl     time.Duration // lease TTL (and ZooKeeper session timeout)
	slack   time.Duration // the checker's measurement slack
	claim   *driver.Description
	// waits is set when the backend can wait for a key itself
	// (driver.Waiter or driver.Watcher).
	waits bool
	// batches is set when the backend coalesces a client's concurrent
	// acquire attempts and releases (driver.BatchAcquirer and
	// driver.BatchReleaser, coalescing not turned off in the URL);
	// noBatch says why not.
	batches bool
	noBatch string
	// control, if set, kills, restarts, pauses or fails over the server
	// (Backend.Control).
	control *Control
	// exe is the executable contenders run (MainIfContender).
	exe string
	// rules are the expectations of this backend's cells.
	rules report.Table
	// peer, if set, is the lock library measured instead of fencelock
	// (Backend.Peer).
	peer *Peer
}

// ---------------------------------------------------------------- redis

// redisDo sends one command to the Redis server of rawURL (database and
// password from the URL) and returns the first line of its reply.
func redisDo(ctx context.Context, rawURL string, args ...string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	r := bufio.NewReader(c)
	send := func(args ...string) (string, error) {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := c.Write([]byte(b.String())); err != nil {
			return "", err
		}
		line, err := r.ReadString('\n')
		line = strings.TrimRight(line, "\r\n")
		if err == nil && strings.HasPrefix(line, "-") {
			err = errors.New("redis: " + line[1:])
		}
		return line, err
	}
	if pw, ok := u.User.Password(); ok {
		if _, err := send("AUTH", u.User.Username(), pw); err != nil {
			return "", err
		}
	}
	if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
		if _, err := send("SELECT", db); err != nil {
			return "", err
		}
	}
	return send(args...)
}

// redisLockKey is the Redis key holding the lock record of key (backend
// redis, default prefix; see backend/redis/keys.go).
func redisLockKey(key string) string { return "{fencelock:" + key + "}:lock" }

// ---------------------------------------------------------------- cells

// cellSpec describes one fault class (or negative control) on one backend.
type cellSpec struct {
	fault   string
	setup   string
	keys    int // default 2
	procs   int // default 3
	fencing bool
	mutant  contender.Mutant
	hold    time.Duration // contenders' Config.Hold; default TTL/8
	// rotate and workers are the contenders' Config.RotateEvery and
	// Config.Workers (token rotation; several leases per client).
	rotate  time.Duration
	workers int
	// permits, if positive, makes every key a semaphore of that many
	// permits: contenders take permits (contender.Config.Permits), the
	// checker adds S1 and S2 (check.Config.Permits). rw makes every key
	// a read-write lock (contender.Config.RW, check.Config.RW: W1..W3).
	// See prims.go.
	permits int
	rw      bool
	// upgrade, with rw, makes every third round an upgradeable read that
	// upgrades (contender.Config.Upgrade). multi makes every round a
	// multi-key grant of 2 to multi keys (contender.Config.Multi), and
	// the checker adds M1 (check.Config.Multi).
	upgrade bool
	multi   int
	// cooldown is how long the workload runs after the scenario; default
	// TTL + 2×slack (so that P5 and P8 deadlines fall within the run).
	cooldown time.Duration
	// run injects the fault and returns how many rounds it ran.
	run func(ctx context.Context, c *cell) (int, error)
	// after, if set, checks the cell's result beyond the report's
	// verdict (the negative controls' per-round detection).
	after func(c *cell, res check.Result) error
	// server, if set, starts a store of the cell's own (the Redis
	// eviction cells: a server whose memory limit the cell may change):
	// the cell's contenders use its URL instead of the backend's, and
	// stop is called when the cell ends.
	server func(ctx context.Context) (url string, stop func(), err error)
	// urlFor, if set, gives contender n (c1 is 1) a URL of its own
	// instead of the backend's (the member cells: each contender on one
	// member of a cluster).
	urlFor func(n int) string
	// tailor, if set, changes contender n's configuration (c1 is 1) after
	// the cell's defaults are filled in: clients of one store with
	// different options (the mixed-config cell). checkTTL, if set, is the
	// checker's TTL instead of the backend's (the longest of the cell's).
	tailor   func(n int, cfg *contender.Config)
	checkTTL time.Duration
	// kit, if set, puts a real resource behind the fenced server: the
	// backend's own server, written through its fencing kit (see kitFor).
	kit bool
	// direct, if set, is a cell without contenders or fenced resource:
	// the harness measures calls of its own (the call-bound cell) and
	// judges them with judgeBounds.
	direct func(ctx context.Context, c *cell) ([]report.CallBound, error)
}

// cell is one run of a cellSpec.
type cell struct {
	spec    cellSpec
	be      *backendEnv
	seed    int64
	rng     *rand.Rand
	keys    []string
	fence   *fence.Server
	log     *eventLog
	checkCf check.Config
	logf    func(format string, args ...any)

	mu     sync.Mutex
	procs  map[string]*proc.Proc // live contenders
	gone   []*proc.Proc          // killed ones
	nextID int
	rounds []roundMark // per round: log marks, for per-round checks
}

// roundMark brackets one round of a scenario in the log (by T); lease is
// the lease the round paused, if any.
type roundMark struct {
	from, to int64
	lease    string
}

// deriveSeed mixes the run's seed with names, for per-cell randomness
// that a rerun with the same seed reproduces.
func deriveSeed(seed int64, names ...string) uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, seed)
	for _, n := range names {
		h.Write([]byte{0})
		h.Write([]byte(n))
	}
	return h.Sum64()
}

// runCell runs one cell: fence, contenders, scenario, cool-down, check.
func runCell(ctx context.Context, be *backendEnv, spec cellSpec, seed int64, logf func(string, ...any)) (report.Cell, history.History, error) {
	if spec.keys == 0 {
		spec.keys = 2
	}
	if spec.procs == 0 {
		spec.procs = 3
	}
	if spec.hold == 0 {
		spec.hold = be.ttl / 8
	}
	if spec.cooldown == 0 {
		spec.cooldown = be.ttl + 2*be.slack
	}
	if spec.server != nil {
		u, stop, err := spec.server(ctx)
		if err != nil {
			return report.Cell{}, nil, fmt.Errorf("starting the cell's own server: %w", err)
		}
		defer stop()
		own := *be
		own.url = u
		be = &own
	}
	s := deriveSeed(seed, be.name, spec.fault)
	checkTTL := be.ttl
	if spec.checkTTL > 0 {
		checkTTL = spec.checkTTL
	}
	c := &cell{
		spec:    spec,
		be:      be,
		seed:    seed,
		rng:     rand.New(rand.NewPCG(s, s>>1)),
		log:     newEventLog(),
		procs:   make(map[string]*proc.Proc),
		checkCf: check.Config{TTL: checkTTL, Slack: be.slack, MaxViolations: 1000, Permits: spec.permits, RW: spec.rw, Upgrade: spec.upgrade, Multi: spec.multi > 0},
		logf:    logf,
	}
	// Fresh keys per cell: nothing left over from an earlier cell.
	for i := range spec.keys {
		c.keys = append(c.keys, fmt.Sprintf("safety-%x-%s-k%d", s&0xffffff, spec.fault, i+1))
	}
	start := time.Now()
	if spec.direct != nil {
		calls, err := spec.direct(ctx, c)
		if err != nil {
			return report.Cell{}, nil, err
		}
		rc := report.NewCell(be.name, spec.fault, judgeBounds(calls), be.rules.Lookup(be.name, spec.fault))
		rc.Setup, rc.Seed, rc.Claim, rc.Calls = c.spec.setup, seed, be.claim, calls
		rc.Duration = time.Since(start).Round(time.Millisecond)
		rc.Config = check.Config{TTL: be.ttl, Slack: boundSlackFor(be)}
		return rc, nil, nil
	}
	// A short directory: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "flsafety")
	if err != nil {
		return report.Cell{}, nil, err
	}
	defer os.RemoveAll(dir)
	c.fence, err = fence.Listen(dir, spec.fencing)
	if err != nil {
		return report.Cell{}, nil, err
	}
	fenceClosed := false
	defer func() {
		if !fenceClosed {
			c.fence.Close()
		}
	}()
	var kit *kitStore
	if spec.kit {
		kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		k, why, err := kitFor(kctx, be)
		cancel()
		if err == nil && k == nil {
			err = errors.New(why)
		}
		if err != nil {
			return report.Cell{}, nil, fmt.Errorf("the cell's fencing kit: %w", err)
		}
		defer k.close()
		kit = k
		c.fence.SetStore(k)
	}

	runErr := c.scenario(ctx)
	stopErr := c.stopAll()
	c.fence.Close()
	fenceClosed = true

	h := append(c.log.snapshot(), c.fence.Log()...)
	h.Sort()
	if err := errors.Join(runErr, stopErr); err != nil {
		return report.Cell{}, h, err
	}
	res := check.Check(h, c.checkCf)
	if be.peer != nil && !be.peer.Tokens {
		res = withoutTokens(res)
	}
	var afterErr error
	if spec.after != nil {
		afterErr = spec.after(c, res) // may refine c.spec.setup
	}
	if kit != nil {
		kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		afterErr = errors.Join(afterErr, checkKitStore(kctx, c, kit))
		cancel()
	}
	rc := report.NewCell(be.name, spec.fault, res, be.rules.Lookup(be.name, spec.fault))
	rc.Setup = c.spec.setup
	rc.Seed = seed
	rc.Duration = time.Since(start).Round(time.Millisecond)
	rc.Rounds = len(c.rounds)
	rc.Config = c.checkCf
	rc.Claim = be.claim
	return rc, h, afterErr
}

// scenario starts the contenders, waits until every key has been taken
// once, runs the fault and lets the workload run on for the cool-down.
func (c *cell) scenario(ctx context.Context) error {
	for range c.spec.procs {
		if _, err := c.startProc(); err != nil {
			return err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second+10*c.be.ttl)
	defer cancel()
	for _, k := range c.keys {
		if _, err := c.log.await(wctx, 0, func(ev history.Event) bool { return ev.Kind == history.Acquired && lockKey(ev.Key) == k }); err != nil {
			return fmt.Errorf("warm-up: key %s never acquired: %w%s", k, err, c.stderrTails())
		}
	}
	n, err := c.spec.run(ctx, c)
	if err != nil {
		return fmt.Errorf("%s: %w%s", c.spec.fault, err, c.stderrTails())
	}
	if n != len(c.rounds) {
		return fmt.Errorf("%s: scenario reported %d rounds, marked %d", c.spec.fault, n, len(c.rounds))
	}
	if n > 0 {
		// Let the system recover from the last fault: wait (up to the
		// checker's progress bound, P6) for an acquisition after it, so
		// that a slow recovery is measured rather than cut off.
		last := c.rounds[n-1].to
		progress := 3*c.be.ttl + 2*c.be.slack
		_, _ = c.awaitEvent(ctx, progress, 0, "recovery", func(e history.Event) bool {
			return e.Kind == history.Acquired && e.T > last
		})
	}
	return pace(ctx, c.spec.cooldown)
}

// pace lets the workload run for d.
func pace(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// startProc starts one more contender.
func (c *cell) startProc() (*proc.Proc, error) {
	c.mu.Lock()
	c.nextID++
	n := c.nextID
	name := "c" + strconv.Itoa(n)
	c.mu.Unlock()
	u := c.be.url
	if c.spec.urlFor != nil {
		u = c.spec.urlFor(n)
	}
	cfg := contender.Config{
		Proc:   name,
		URL:    u,
		Keys:   c.keys,
		TTL:    c.be.ttl,
		Fence:  c.fence.Addr(),
		Proxy:  c.be.proxy,
		Mutant: c.spec.mutant,
		Hold:   c.spec.hold,
		Seed:   deriveSeed(c.seed, c.be.name, c.spec.fault, name),

		RotateEvery: c.spec.rotate,
		Workers:     c.spec.workers,
		Permits:     c.spec.permits,
		RW:          c.spec.rw,
		Upgrade:     c.spec.upgrade,
		Multi:       c.spec.multi,
	}
	if c.be.peer != nil {
		cfg.Peer = c.be.peer.Lib
	}
	if c.spec.tailor != nil {
		c.spec.tailor(n, &cfg)
	}
	env, err := cfg.Env()
	if err != nil {
		return nil, err
	}
	p, err := proc.Start(proc.Spec{Name: name, Path: c.be.exe, Env: []string{env}}, c.log.add)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	return p, nil
}

func (c *cell) proc(name string) *proc.Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[name]
}

func (c *cell) live() []*proc.Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := make([]*proc.Proc, 0, len(c.procs))
	for _, p := range c.procs {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].Name() < ps[j].Name() })
	return ps
}

// kill kills a contender (SIGKILL; proc records the Crash).
func (c *cell) kill(name string) error {
	p := c.proc(name)
	if p == nil {
		return fmt.Errorf("no contender %s", name)
	}
	if err := p.Kill(); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.procs, name)
	c.gone = append(c.gone, p)
	c.mu.Unlock()
	return nil
}

// stopAll stops every contender and reports any that failed.
func (c *cell) stopAll() error {
	var errs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, p := range c.live() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+4*c.be.ttl)
			defer cancel()
			err := p.Stop(ctx, contender.Command{Op: contender.OpStop})
			if races, ok := onlyDepRaces(err, p.Stderr()); ok {
				mu.Lock()
				c.spec.setup += fmt.Sprintf("; %s stopped by the race detector for a known dependency race only: %s", p.Name(), strings.Join(slices.Compact(races), ", "))
				mu.Unlock()
				err = nil
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, p := range c.gone {
		p.Wait()
	}
	return errors.Join(errs...)
}

func (c *cell) goneProcs() []*proc.Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*proc.Proc(nil), c.gone...)
}

// stderrTails returns the end of every contender's stderr, for errors.
func (c *cell) stderrTails() string {
	var b strings.Builder
	ps := append(c.live(), c.goneProcs()...)
	for _, p := range ps {
		if s := strings.TrimSpace(p.Stderr()); s != "" {
			lines := strings.Split(s, "\n")
			if len(lines) > 10 {
				lines = lines[len(lines)-10:]
			}
			fmt.Fprintf(&b, "\n--- %s stderr:\n%s", p.Name(), strings.Join(lines, "\n"))
		}
	}
	return b.String()
}

// note records a harness event.
func (c *cell) note(kind history.Kind, procName, what string) int64 {
	if procName == "" {
		procName = harnessProc
	}
	t := mono.Now()
	c.log.add(history.Event{T: t, Proc: procName, Kind: kind, Note: what})
	return t
}

// round runs one round of a fault between FaultStart and FaultEnd events
// (named what, aimed at procName or the store) and marks it.
func (c *cell) round(procName, what string, inject func() error) error {
	from := c.note(history.FaultStart, procName, what)
	err := inject()
	to := c.note(history.FaultEnd, procName, what)
	c.mu.Lock()
	c.rounds = append(c.rounds, roundMark{from: from, to: to})
	c.mu.Unlock()
	return err
}

// send sends a command to a contender.
func (c *cell) send(name string, cmd contender.Command) error {
	p := c.proc(name)
	if p == nil {
		return fmt.Errorf("no contender %s", name)
	}
	return p.Send(cmd)
}

// awaitHolder waits (up to bound) for a lease held by a live contender
// other than those in except.
func (c *cell) awaitHolder(ctx context.Context, bound time.Duration, except ...string) (holding, error) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	return c.log.awaitHolding(ctx, c.rng, func(h holding) bool {
		return c.proc(h.proc) != nil && !slices.Contains(except, h.proc)
	})
}

// awaitEvent waits (up to bound) for an event at index ≥ from.
func (c *cell) awaitEvent(ctx context.Context, bound time.Duration, from int, what string, match func(history.Event) bool) (history.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	ev, err := c.log.await(ctx, from, match)
	if err != nil {
		return ev, fmt.Errorf("waiting for %s: %w", what, err)
	}
	return ev, nil
}
