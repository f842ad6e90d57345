package generative

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/recipe"
	"pgregory.net/rapid"
)

// Read-write programs: two or three clients (each through the
// fault-injecting driver, some rotating tokens) with one or two workers
// each, taking read and write grants of one recipe.RWLock — waiting,
// trying once, or waiting with a context cut short — holding them for a
// while with reads or writes to a fenced resource (recipe.RWFence) at
// the start and end of the hold, some also after the grant ended, as a
// paused holder would. Clients end by Close, early or late, or crash.
// Their histories are checked for:
//
//   - NoReaderBesideWriter, NoTwoWriters: no write grant's window (from
//     its return to the instant its holder stopped believing: release,
//     the engine's loss event for one of its leases, the grant's context
//     ending, or its client beginning to close or crashing — or its
//     grant, if the loss or the close came first) overlaps another
//     grant's;
//   - GrantTokensIncrease: a grant that began after another was granted
//     carries a greater token (so a writer's is above every grant's
//     before it, and a reader's above every writer's before it);
//   - LiveAccessAccepted: a read or write by a grant that still holds,
//     before and after the fence's check, is accepted;
//   - NoStaleAccessAccepted: a late read is refused once a writer with a
//     greater token has written; a late write once any grant with a
//     greater token has read or written;
//   - NothingLeftBehind: after every client ended, nothing is stored (at
//     once without crashes or faults, else within TTL plus slack).

type rwStepKind int

const (
	rwRead rwStepKind = iota
	rwWrite
	rwTryRead
	rwTryWrite
	rwReadCancelled
	rwWriteCancelled
	rwUpgrade // an upgradeable read grant, then Upgrade (bounded by a TTL) before its release
)

var rwStepNames = [...]string{"rlock", "lock", "try-rlock", "try-lock", "rlock-cancelled", "lock-cancelled", "upgrade"}

func (k rwStepKind) write() bool { return k == rwWrite || k == rwTryWrite || k == rwWriteCancelled }

type rwStep struct {
	kind    rwStepKind
	hold    int // tenths of TTL
	late    bool
	ttl     int  // WithTTL in tenths of TTL; 0: the Client's
	minHold int  // WithMinHold in tenths of TTL; 0: the Client's
	wait    int  // WithWait in tenths of TTL (waiting kinds); 0: none
	meta    bool // WithMetadata
}

type rwClientProg struct {
	rotate  bool
	faults  faults
	cfg     clientCfg
	workers [][]rwStep
	end     endKind
	endAt   int
}

// rwProg is a read-write program. A clean one has no faults and no
// crashes: there a refused call is refused because of another grant
// alone, which RefusedCallLeavesNothingHeld and TryRLockBesideReaders
// rely on.
type rwProg struct {
	clean   bool
	clients []rwClientProg
}

func (p rwProg) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  clean %v\n", p.clean)
	for i, c := range p.clients {
		fmt.Fprintf(&b, "  client %d: rotate %v, %v, faults %+v, end %d at %d/10 TTL\n", i, c.rotate, c.cfg, c.faults, c.end, c.endAt)
		for j, w := range c.workers {
			fmt.Fprintf(&b, "    worker %d:", j)
			for _, s := range w {
				fmt.Fprintf(&b, " %s(hold %d/10 late %v ttl %d/10 minhold %d/10 wait %d/10 meta %v)", rwStepNames[s.kind], s.hold, s.late, s.ttl, s.minHold, s.wait, s.meta)
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func genRW(t *rapid.T, o *Options) rwProg {
	p := rwProg{clean: o.NoFaults || rapid.IntRange(0, 2).Draw(t, "clean") == 0}
	for range rapid.IntRange(2, o.Clients).Draw(t, "rwClients") {
		c := rwClientProg{
			rotate: rapid.Bool().Draw(t, "rotate"),
			end:    endKind(rapid.IntRange(0, 4).Draw(t, "end") % 3),
			endAt:  rapid.IntRange(0, 30).Draw(t, "endAt"),
			cfg:    drawClientCfg(t, o),
		}
		if c.end == endCrash && (p.clean || rapid.Bool().Draw(t, "crashLate")) {
			c.end = endClose
		}
		if !p.clean {
			c.faults = drawFaults(t, []int{1, 5})
		}
		c.faults.rttHundredths = drawRTT(t, o)
		for range rapid.IntRange(1, 2).Draw(t, "workers") {
			var w []rwStep
			for range rapid.IntRange(1, 4).Draw(t, "steps") {
				w = append(w, rwStep{
					kind:    rwStepKind(rapid.IntRange(0, len(rwStepNames)-1).Draw(t, "rwKind")),
					hold:    rapid.SampledFrom([]int{0, 1, 5, 15}).Draw(t, "hold"),
					late:    rapid.Bool().Draw(t, "late"),
					ttl:     rapid.SampledFrom([]int{0, 0, 5, 20}).Draw(t, "ttl"),
					minHold: rapid.SampledFrom([]int{0, 0, 0, 3, 12}).Draw(t, "minHold"),
					wait:    rapid.SampledFrom([]int{0, 0, 2}).Draw(t, "wait"),
					meta:    rapid.Bool().Draw(t, "meta"),
				})
			}
			c.workers = append(c.workers, w)
		}
		p.clients = append(p.clients, c)
	}
	return p
}

// rwGrantRec is one grant as its worker saw it.
type rwGrantRec struct {
	id       int
	client   int
	write    bool
	owner    string
	owners   []string // of every lease of the grant
	token    fencelock.Token
	inv, got int64
	end      atomic.Int64 // seq when its holder stopped believing; 0 while held
}

type rwAccess struct {
	grant         *rwGrantRec
	write, late   bool
	token         fencelock.Token
	inv, ret      int64
	accepted      bool
	heldAfter     bool // the grant still held after the check returned
	refusedReason error
}

type rwRun struct {
	rec    *recorder
	fence  recipe.RWFence
	raw    driver.Backend // the store, without faults
	prefix string         // of every record of the lock
	clean  bool           // no faults, no crashes
	tenth  time.Duration
	mu     sync.Mutex
	grants []*rwGrantRec
	access []rwAccess
	calls  []rwCall
	lost   map[string]int64 // lease owner → seq when the engine reported its loss
	// holdsEnd is the latest end of a granted lease's minimum hold.
	holdsEnd time.Time
}

// rwCall is one RLock, TryRLock, Lock or TryLock call, timed by the wall
// clock: from its call to its return, or, if it was granted, to the
// return of the grant's Release, plus its minimum hold (its records may
// stay that long).
type rwCall struct {
	client        int
	kind          rwStepKind
	label         string
	start, end    time.Time
	refused       bool  // it returned an error matching ErrNotAcquired
	err           error // its error, if it failed
	minHold       time.Duration
	granted       bool
	ret, released time.Time
}

// observer records the engine's loss events as they happen: a grant ends
// with its lease, before the store can give the key to anyone else.
func (run *rwRun) observer() fencelock.Observer {
	return fencelock.ObserverFunc(func(e fencelock.Event) {
		if e.Kind != fencelock.EventLost {
			return
		}
		s := run.rec.tick()
		run.mu.Lock()
		if _, ok := run.lost[e.Owner]; !ok {
			run.lost[e.Owner] = s
		}
		run.mu.Unlock()
	})
}

// rwCheck runs one generated read-write program as Run's property does
// for lock programs.
func rwCheck(rt *rapid.T, h conformance.Harness, o *Options, stats *Stats, failed *failures) {
	p := genRW(rt, o)
	body := func(rt *rapid.T) {
		if o.Fresh != nil {
			o.Fresh()
		}
		run, err := runRW(rt.Context(), h, o, p)
		if err != nil {
			rt.Fatalf("generative: read-write: %v", err)
		}
		atomic.AddInt64(&stats.Programs, 1)
		run.mu.Lock()
		atomic.AddInt64(&stats.Leases, int64(len(run.grants)))
		atomic.AddInt64(&stats.Writes, int64(len(run.access)))
		run.mu.Unlock()
		stats.countBatches(run.rec)
		var fail []string
		for _, v := range run.check() {
			if why, ok := o.Known[v.property]; ok {
				atomic.AddInt64(&stats.Known, 1)
				rt.Logf("known violation (%s): %s", why, v)
				continue
			}
			fail = append(fail, v.String())
		}
		if len(fail) > 0 {
			failed.add(fail)
			rt.Fatalf("read-write invariants violated:\n  %s\nread-write program:\n%s\nhistory:\n%s", strings.Join(fail, "\n  "), p, run.rec.trace())
		}
	}
	if o.SyncTest {
		rapid.SyncTest(rt, body)
	} else {
		body(rt)
	}
}

func runRW(ctx context.Context, h conformance.Harness, o *Options, p rwProg) (*rwRun, error) {
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	prefix := "generative-" + hex.EncodeToString(rnd[:]) + "/"
	key := prefix + "rw"
	tenth := h.TTL / 10
	run := &rwRun{rec: newRecorder(), lost: map[string]int64{}, raw: nil, prefix: rwPrefix(key), clean: p.clean, tenth: tenth}
	raw, err := h.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("Harness.Open: %w", err)
	}
	defer raw.Close()
	run.raw = raw

	type client struct {
		c    *fencelock.Client
		rw   *recipe.RWLock
		w    *faulty
		once sync.Once
	}
	clients := make([]*client, len(p.clients))
	crashed := false
	for i, cp := range p.clients {
		inner, err := cp.cfg.open(ctx, h, o)
		if err != nil {
			return nil, err
		}
		crashed = crashed || cp.end == endCrash
		w := newFaulty(inner, cp.faults, tenth, releaseTimeout(h.TTL), run.rec, i)
		co := cp.cfg.options(h, cp.rotate, fmt.Sprintf("generative-rw-%d", i), run.observer())
		c, err := fencelock.New(w.backend(), co)
		if err != nil {
			inner.Close()
			return nil, fmt.Errorf("fencelock.New: %w", err)
		}
		rw, err := recipe.NewRWLock(c, key)
		if err != nil {
			c.Close()
			return nil, err
		}
		clients[i] = &client{c: c, rw: rw, w: w}
	}
	end := func(i int) {
		cl := clients[i]
		cl.once.Do(func() {
			if p.clients[i].end == endCrash {
				run.rec.closing(i, "client %d crashes", i)
				cl.w.die(h.Crash)
			} else {
				run.rec.closing(i, "client %d closes", i)
			}
			_ = cl.c.Close()
		})
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i, cp := range p.clients {
		for j, steps := range cp.workers {
			wg.Go(func() {
				for k, s := range steps {
					run.step(ctx, i, j, k, clients[i].rw, s, cp.cfg, h)
				}
			})
		}
		if cp.end != endClose {
			wg.Go(func() {
				sleepCtx(ctx, time.Duration(cp.endAt)*tenth-time.Since(start))
				end(i)
			})
		}
	}
	wg.Wait()
	for i := range p.clients {
		end(i)
	}
	for _, cl := range clients {
		cl.w.settle()
	}
	// NothingLeftBehind: at once, or within the longest TTL plus slack
	// when a crash, a fault, or a late request sent while its client
	// closed may have left a record to expire; a grant
	// released into its minimum hold keeps its records until the hold
	// ends.
	var cfgs []clientCfg
	var ttls []int
	for _, cp := range p.clients {
		cfgs = append(cfgs, cp.cfg)
		for _, w := range cp.workers {
			for _, s := range w {
				ttls = append(ttls, s.ttl)
			}
		}
	}
	maxTTL, slack := longestTTL(h, cfgs, ttls)
	deadline := time.Now()
	faulted := run.rec.faultedBeyondLate() || run.rec.lateWhileClosing()
	if crashed || faulted {
		deadline = deadline.Add(maxTTL + slack)
	}
	run.mu.Lock()
	if end := run.holdsEnd.Add(h.Slack); end.After(deadline) {
		deadline = end
	}
	run.mu.Unlock()
	for {
		infos, err := raw.List(ctx, prefix)
		if err != nil {
			return nil, fmt.Errorf("List: %w", err)
		}
		if len(infos) == 0 {
			break
		}
		if !time.Now().Before(deadline) {
			run.rec.leftBehind("NothingLeftBehind", "after every client ended", infos)
			break
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	return run, nil
}

// step runs step k of worker j of client i.
func (run *rwRun) step(ctx context.Context, i, j, k int, rw *recipe.RWLock, s rwStep, cfg clientCfg, h conformance.Harness) {
	tenth, ttl := h.TTL/10, h.TTL
	// A label of its own, so that what the call left in the store is
	// known by it.
	label := fmt.Sprintf("generative-rw-%d-%d-%d", i, j, k)
	opts := []fencelock.AcquireOption{fencelock.WithLabel(label)}
	if s.ttl > 0 {
		opts = append(opts, fencelock.WithTTL(time.Duration(s.ttl)*tenth))
	}
	minHold := time.Duration(cfg.minHold) * tenth
	if s.minHold > 0 {
		minHold = time.Duration(s.minHold) * tenth
		opts = append(opts, fencelock.WithMinHold(minHold))
	}
	waits := s.kind != rwTryRead && s.kind != rwTryWrite
	if s.wait > 0 && waits {
		opts = append(opts, fencelock.WithWait(time.Duration(s.wait)*tenth))
	}
	if s.meta {
		opts = append(opts, fencelock.WithMetadata([]byte(label)))
	}
	call := rwCall{client: i, kind: s.kind, label: label, minHold: minHold, start: time.Now()}
	inv := run.rec.tick()
	var (
		g   *recipe.RWGrant
		err error
	)
	switch s.kind {
	case rwUpgrade:
		actx, cancel := context.WithTimeout(ctx, 3*ttl)
		g, err = rw.UpgradeableRLock(actx, opts...)
		cancel()
	case rwRead, rwWrite, rwReadCancelled, rwWriteCancelled:
		wait := 3 * ttl
		if s.kind == rwReadCancelled || s.kind == rwWriteCancelled {
			wait = ttl / 4
		}
		actx, cancel := context.WithTimeout(ctx, wait)
		if s.kind.write() {
			g, err = rw.Lock(actx, opts...)
		} else {
			g, err = rw.RLock(actx, opts...)
		}
		cancel()
	case rwTryRead:
		g, err = rw.TryRLock(ctx, opts...)
	case rwTryWrite:
		g, err = rw.TryLock(ctx, opts...)
	}
	call.ret = time.Now()
	if err != nil {
		call.end, call.err = call.ret, err
		call.refused = errors.Is(err, fencelock.ErrNotAcquired)
		run.rec.note("client %d worker %d %s: %v", i, j, rwStepNames[s.kind], err)
		run.leftByRefused(ctx, call)
		run.mu.Lock()
		run.calls = append(run.calls, call)
		run.mu.Unlock()
		return
	}
	call.granted = true
	got := run.rec.tick()
	gr := &rwGrantRec{client: i, write: s.kind.write(), owner: g.Owner(), token: g.Token(), inv: inv, got: got}
	for _, l := range g.Leases() {
		gr.owners = append(gr.owners, l.Owner())
	}
	if g.Shared() == gr.write {
		run.rec.violate("GrantKind", "%s returned a grant with Shared() = %v", rwStepNames[s.kind], g.Shared())
	}
	// The holder stops believing when the grant's context ends.
	stop := context.AfterFunc(g.Context(), func() { gr.end.CompareAndSwap(0, run.rec.tick()) })
	defer stop()
	run.mu.Lock()
	gr.id = len(run.grants) + 1
	run.grants = append(run.grants, gr)
	if end := call.ret.Add(minHold); minHold > 0 && end.After(run.holdsEnd) {
		run.holdsEnd = end
	}
	run.mu.Unlock()
	run.rec.note("client %d worker %d grant %d: %s token %d (%s)", i, j, gr.id, rwStepNames[s.kind], gr.token, gr.owner)

	run.accessWith(g, gr, false)
	if s.hold > 0 {
		t := time.NewTimer(time.Duration(s.hold) * tenth)
		select {
		case <-t.C:
		case <-g.Done():
		case <-ctx.Done():
		}
		t.Stop()
	}
	run.accessWith(g, gr, false)
	cur := gr // the grant as recorded: after an upgrade, its write grant's record
	if s.kind == rwUpgrade {
		cur = run.upgrade(ctx, i, j, g, gr, ttl, minHold)
	}
	cur.end.CompareAndSwap(0, run.rec.tick())
	rerr := g.Release(ctx)
	call.end = time.Now()
	run.mu.Lock()
	run.calls = append(run.calls, call)
	run.mu.Unlock()
	run.rec.note("grant %d released: %v (err %v)", cur.id, rerr, g.Err())
	if s.late {
		sleepCtx(ctx, tenth)
		run.accessWith(g, cur, true)
	}
}

// upgrade upgrades the upgradeable read grant g, recorded as gr, waiting
// at most ttl. On success the read grant's window ends and a write grant's
// begins, recorded as a grant of its own (its token and owner are the
// upgraded grant's), which it returns after a write; else it returns gr.
// minHold is the grant's minimum hold.
func (run *rwRun) upgrade(ctx context.Context, i, j int, g *recipe.RWGrant, gr *rwGrantRec, ttl, minHold time.Duration) *rwGrantRec {
	uctx, cancel := context.WithTimeout(ctx, ttl)
	inv := run.rec.tick()
	err := g.Upgrade(uctx)
	cancel()
	if err != nil {
		run.rec.note("client %d worker %d grant %d: upgrade: %v", i, j, gr.id, err)
		return gr
	}
	gr.end.CompareAndSwap(0, run.rec.tick())
	w := &rwGrantRec{client: i, write: true, owner: g.Owner(), token: g.Token(), inv: inv, got: run.rec.tick()}
	for _, l := range g.Leases() {
		w.owners = append(w.owners, l.Owner())
	}
	if g.Shared() {
		run.rec.violate("GrantKind", "Upgrade returned nil with Shared() = true")
	}
	stop := context.AfterFunc(g.Context(), func() { w.end.CompareAndSwap(0, run.rec.tick()) })
	defer stop()
	run.mu.Lock()
	w.id = len(run.grants) + 1
	run.grants = append(run.grants, w)
	// The write grant's minimum hold counts from the upgrade.
	if end := time.Now().Add(minHold); minHold > 0 && end.After(run.holdsEnd) {
		run.holdsEnd = end
	}
	run.mu.Unlock()
	run.rec.note("client %d worker %d grant %d: upgraded grant %d, token %d (%s)", i, j, w.id, gr.id, w.token, w.owner)
	run.accessWith(g, w, false)
	return w
}

// leftByRefused checks, in a clean program, that a call that returned
// without a grant left nothing of its own in the store (no gate, slot or
// intent with its label): the minimum hold belongs to a grant handed to
// its caller, and a refused call's records would refuse the next caller.
// A record whose owner had a call fail in the store is excused, as in
// onlyGrantsHeld.
func (run *rwRun) leftByRefused(ctx context.Context, c rwCall) {
	if !run.clean {
		return
	}
	infos, err := run.raw.List(ctx, run.prefix)
	if err != nil {
		run.rec.note("List: %v", err)
		return
	}
	for _, info := range infos {
		if info.Label() == c.label && run.rec.failedInStore(info.Owner) {
			run.rec.note("client %d's %s left %q (owner %s) after the store failed a call for it", c.client, rwStepNames[c.kind], info.Key, info.Owner)
			continue
		}
		if info.Label() == c.label {
			run.rec.violate("RefusedCallLeavesNothingHeld", "client %d's %s returned %q, yet the store still holds %q for it (label %q, token %d)",
				c.client, rwStepNames[c.kind], c.err, info.Key, c.label, info.Token)
		}
	}
}

// accessWith reads (a read grant) or writes (a write grant) the fenced
// resource with g's token at its grant.
func (run *rwRun) accessWith(g *recipe.RWGrant, gr *rwGrantRec, late bool) {
	a := rwAccess{grant: gr, write: gr.write, late: late, token: gr.token}
	a.inv = run.rec.tick()
	var err error
	if gr.write {
		err = run.fence.CheckWrite("resource", gr.token, gr.owner)
	} else {
		err = run.fence.CheckRead("resource", gr.token)
	}
	a.ret = run.rec.tick()
	a.accepted, a.refusedReason = err == nil, err
	a.heldAfter = !late && g.Context().Err() == nil
	run.mu.Lock()
	run.access = append(run.access, a)
	run.mu.Unlock()
	verdict := "accepted"
	if err != nil {
		verdict = "refused: " + err.Error()
	}
	run.rec.note("grant %d %s token %d (late %v): %s", gr.id, map[bool]string{false: "reads", true: "writes"}[gr.write], gr.token, late, verdict)
}

func (run *rwRun) check() []violation {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.rec.mu.Lock()
	vs := append([]violation(nil), run.rec.direct...)
	run.rec.mu.Unlock()
	run.rec.mu.Lock()
	closed := make(map[int]int64, len(run.rec.closed))
	for c, s := range run.rec.closed {
		closed[c] = s
	}
	run.rec.mu.Unlock()
	// A grant's window ends when its holder stopped believing, at the
	// latest when its client began to close or crashed.
	endOf := func(g *rwGrantRec) int64 {
		e := g.end.Load()
		if e == 0 {
			e = 1 << 62
		}
		for _, o := range g.owners {
			if s, ok := run.lost[o]; ok {
				e = min(e, max(s, g.got))
			}
		}
		if c, ok := closed[g.client]; ok {
			// A grant that came while its client was closing ends as
			// Close releases it: at once, as far as the window goes.
			e = min(e, max(c, g.got))
		}
		return e
	}
	for _, a := range run.grants {
		for _, b := range run.grants {
			if a == b {
				continue
			}
			// A grant that had ended before its call returned (lost, or
			// released by a Close) was never believed held: no window.
			if a.write && a.got < endOf(b) && b.got < endOf(a) && endOf(a) > a.got && endOf(b) > b.got && (a.id < b.id || !b.write) {
				prop := "NoReaderBesideWriter"
				if b.write {
					prop = "NoTwoWriters"
				}
				vs = append(vs, violation{prop, fmt.Sprintf("write grant %d (token %d, held %d–%d) and %s grant %d (token %d, held %d–%d) overlap",
					a.id, a.token, a.got, endOf(a), map[bool]string{false: "read", true: "write"}[b.write], b.id, b.token, b.got, endOf(b))})
			}
			if a.got < b.inv && b.token <= a.token {
				vs = append(vs, violation{"GrantTokensIncrease", fmt.Sprintf("grant %d (write %v) began at %d after grant %d (write %v, token %d) was granted at %d, but carries token %d",
					b.id, b.write, b.inv, a.id, a.write, a.token, a.got, b.token)})
			}
		}
	}
	vs = append(vs, run.checkTryRLock()...)
	for _, a := range run.access {
		if !a.accepted && a.heldAfter {
			vs = append(vs, violation{"LiveAccessAccepted", fmt.Sprintf("grant %d (write %v, token %d) was refused while it held: %v", a.grant.id, a.write, a.token, a.refusedReason)})
		}
		if !a.accepted || !a.late {
			continue
		}
		for _, b := range run.access {
			if b.accepted && b.ret < a.inv && b.token > a.token && (a.write || b.write) {
				vs = append(vs, violation{"NoStaleAccessAccepted", fmt.Sprintf("late access by grant %d (write %v, token %d) accepted after grant %d (write %v, token %d) had been accepted",
					a.grant.id, a.write, a.token, b.grant.id, b.write, b.token)})
				break
			}
		}
	}
	return vs
}

// checkTryRLock checks TryRLockBesideReaders in a clean program: a
// TryRLock refused (ErrNotAcquired) while no writer was about — no Lock
// or TryLock called and not yet ended (with its grant's minimum hold
// after its release) — is refused
// by readers alone, which share the lock. Called with run.mu held.
func (run *rwRun) checkTryRLock() []violation {
	if !run.clean {
		return nil
	}
	var vs []violation
	for _, r := range run.calls {
		if r.kind != rwTryRead || !r.refused {
			continue
		}
		writer, readers := false, 0
		for _, w := range run.calls {
			if w.start.After(r.ret) || !w.end.Add(w.minHold).Add(run.tenth).After(r.start) {
				continue // no overlap, with a tenth of the TTL to spare
			}
			if w.kind.write() || w.kind == rwUpgrade {
				writer = true
			} else if w.granted {
				readers++
			}
		}
		if !writer {
			vs = append(vs, violation{"TryRLockBesideReaders", fmt.Sprintf("client %d's TryRLock (%s) was refused with no writer about and %d readers: %v", r.client, r.label, readers, r.err)})
		}
	}
	return vs
}

// rwPrefix is what every record of the read-write lock on key starts with.
func rwPrefix(key string) string {
	p, _ := recipe.Keys(key, 0)
	return p
}
