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

// Election programs: two or three campaigners run recipe.Elect on one key
// (each through the fault-injecting driver, some rotating tokens), and at
// generated instants one resigns and campaigns again, the leader publishes
// a new value (Lease.SetMetadata), or a campaigner crashes; on a
// driver.TokenFloorer, one program in three raises the key's floor while
// they campaign; a client of its own observes the key with
// recipe.Observe. Their histories are
// checked for:
//
//   - NoTwoHolders: no campaigner's callback started while another's
//     callback context was live (a crashed leader's included: it ends by
//     local validity before the store frees the key);
//   - ObserveInOrder: what Observe delivered moves forward only (a
//     leader's token never below one delivered before, a lease once
//     replaced never delivered again: an owner under which a campaigner
//     led is never delivered after it was replaced; an owner under which
//     none led may come back only under a token above all delivered
//     before, see checkObserved);
//   - ObservedValuePublished: every leader Observe delivered carries a
//     value its campaigner published;
//   - ResignFreesKey: Elect returns nil when its campaigner resigns (its
//     ctx ends), whatever the store did meanwhile, and does not return
//     before that unless its client is faulty or crashed and the store
//     failed for a whole TTL (a *BackendError); once every campaigner's
//     Elect returned, the key is free — at once without faults or
//     crashes, else within the TTL plus slack (a failed release or a
//     crashed holder's record expires); and the observer reports it
//     free within its polling bound after that. Both bounds count from
//     the end of any stall (Options.Stall) of the program's clients that
//     overlaps them: a stall holds every read of the clients it reaches,
//     whichever program drew it (with Options.PerStream, a stall reaches
//     its own stream's clients alone).

type electActionKind int

const (
	electResign electActionKind = iota
	electProclaim
	electCrash
)

var electActionNames = [...]string{"resign", "proclaim", "crash"}

type electAction struct {
	kind electActionKind
	at   int // tenths of the TTL from the start
}

type campaignProg struct {
	faults  faults
	rotate  bool
	cfg     clientCfg
	ttl     int // each term's WithTTL in tenths of the TTL; 0: the Client's
	minHold int // each term's WithMinHold in tenths of the TTL; 0: the Client's
	wait    int // each term's WithWait in tenths of the TTL; 0: none
	actions []electAction
}

// termOptions returns the campaigner's ElectOptions.Acquire.
func (c campaignProg) termOptions(tenth time.Duration) []fencelock.AcquireOption {
	var opts []fencelock.AcquireOption
	if c.ttl > 0 {
		opts = append(opts, fencelock.WithTTL(time.Duration(c.ttl)*tenth))
	}
	if c.minHold > 0 {
		opts = append(opts, fencelock.WithMinHold(time.Duration(c.minHold)*tenth))
	}
	if c.wait > 0 {
		opts = append(opts, fencelock.WithWait(time.Duration(c.wait)*tenth))
	}
	return opts
}

// longestHold returns the longest minimum hold of a term, per term or
// the Client's default.
func (p electionProg) longestHold(tenth time.Duration) time.Duration {
	var d time.Duration
	for _, c := range p.campaigners {
		d = max(d, time.Duration(max(c.minHold, c.cfg.minHold))*tenth)
	}
	return d
}

type electionProg struct {
	campaigners []campaignProg
	raiseAt     int // tenths of the TTL: RaiseFloor on the key then (TokenFloorer backends); 0: none
}

func (p electionProg) String() string {
	var b strings.Builder
	for i, c := range p.campaigners {
		fmt.Fprintf(&b, "  campaigner %d: rotate=%v %v term ttl %d/10 minhold %d/10 wait %d/10 faults=%+v:", i, c.rotate, c.cfg, c.ttl, c.minHold, c.wait, c.faults)
		for _, a := range c.actions {
			fmt.Fprintf(&b, " %s@%d", electActionNames[a.kind], a.at)
		}
		b.WriteString("\n")
	}
	if p.raiseAt > 0 {
		fmt.Fprintf(&b, "  raise-floor at %d/10 TTL\n", p.raiseAt)
	}
	return b.String()
}

func genElection(t *rapid.T, o *Options) electionProg {
	var p electionProg
	n := rapid.IntRange(2, max(2, o.Clients)).Draw(t, "campaigners")
	for range n {
		c := campaignProg{
			rotate:  rapid.Bool().Draw(t, "rotate"),
			cfg:     drawClientCfg(t, o),
			ttl:     rapid.SampledFrom([]int{0, 0, 5, 20}).Draw(t, "termTTL"),
			minHold: rapid.SampledFrom([]int{0, 0, 0, 3, 12}).Draw(t, "termMinHold"),
			wait:    rapid.SampledFrom([]int{0, 0, 2}).Draw(t, "termWait"),
		}
		if !o.NoFaults {
			c.faults = drawFaults(t, []int{1, 5})
		}
		at := 0
		for range rapid.IntRange(0, 4).Draw(t, "actions") {
			at += rapid.IntRange(1, 10).Draw(t, "after")
			kind := electActionKind(rapid.IntRange(0, 4).Draw(t, "action") % 3)
			if kind == electCrash && rapid.Bool().Draw(t, "crashLate") {
				kind = electResign // crashes are rarer
			}
			c.actions = append(c.actions, electAction{kind: kind, at: at})
			if kind == electCrash {
				break
			}
		}
		p.campaigners = append(p.campaigners, c)
	}
	if rapid.IntRange(0, 2).Draw(t, "raise") == 0 {
		p.raiseAt = rapid.IntRange(1, 30).Draw(t, "raiseAt")
	}
	return p
}

// electionCheck runs one generated election program as Run's property
// does for lock programs: counted in stats, violations of properties
// in o.Known logged, others failing with the program and its history.
func electionCheck(rt *rapid.T, h conformance.Harness, o *Options, stats *Stats, failed *failures) {
	p := genElection(rt, o)
	body := func(rt *rapid.T) {
		if o.Fresh != nil {
			o.Fresh()
		}
		rec, vs, terms, err := runElection(rt.Context(), h, o, p)
		if err != nil {
			rt.Fatalf("generative: election: %v", err)
		}
		atomic.AddInt64(&stats.Programs, 1)
		atomic.AddInt64(&stats.Leases, int64(terms))
		stats.countBatches(rec)
		var fail []string
		for _, v := range vs {
			if why, ok := o.Known[v.property]; ok {
				atomic.AddInt64(&stats.Known, 1)
				rt.Logf("known violation (%s): %s", why, v)
				continue
			}
			fail = append(fail, v.String())
		}
		if len(fail) > 0 {
			failed.add(fail)
			rt.Fatalf("election invariants violated:\n  %s\nelection program:\n%s\nhistory:\n%s", strings.Join(fail, "\n  "), p, rec.trace())
		}
	}
	if o.SyncTest {
		rapid.SyncTest(rt, body)
	} else {
		body(rt)
	}
}

// electTerm is one campaigner's term, as its callback saw it.
type electTerm struct {
	who   int
	token fencelock.Token
	owner string // the lease's Owner
	ctx   context.Context
}

type electRun struct {
	mu        sync.Mutex
	terms     []electTerm
	published map[string]map[string]bool // identity → values it published
	vs        []violation
}

func (e *electRun) violate(property, format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.vs = append(e.vs, violation{property, fmt.Sprintf(format, args...)})
}

func (e *electRun) publish(identity, value string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.published[identity] == nil {
		e.published[identity] = map[string]bool{}
	}
	e.published[identity][value] = true
}

func runElection(ctx context.Context, h conformance.Harness, o *Options, p electionProg) (*recorder, []violation, int, error) {
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	key := "generative-" + hex.EncodeToString(rnd[:]) + "/election"
	tenth := h.TTL / 10
	rec := newRecorder()
	e := &electRun{published: map[string]map[string]bool{}}
	start := time.Now()

	opts := func(rotate bool) *fencelock.Options {
		o := &fencelock.Options{
			TTL:            h.TTL,
			MinBackoff:     2 * time.Millisecond,
			MaxBackoff:     max(h.TTL/8, 10*time.Millisecond),
			ReleaseTimeout: releaseTimeout(h.TTL),
		}
		if rotate {
			o.RotateEvery = h.TTL / 3
		}
		return o
	}
	raw, err := h.Open(ctx)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("Harness.Open: %w", err)
	}
	watcher, err := fencelock.New(raw, opts(false))
	if err != nil {
		raw.Close()
		return nil, nil, 0, err
	}
	defer watcher.Close()
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	ch, err := recipe.Observe(octx, watcher, key)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("Observe: %w", err)
	}
	var (
		omu      sync.Mutex
		observed []recipe.Leader
		oseen    = make(chan struct{}, 1)
		odone    = make(chan struct{})
	)
	go func() {
		defer close(odone)
		for l := range ch {
			omu.Lock()
			observed = append(observed, l)
			omu.Unlock()
			rec.note("observer: %s", describeLeader(l))
			select {
			case oseen <- struct{}{}:
			default:
			}
		}
	}()

	crashed := false
	var wg sync.WaitGroup
	clients := make([]*fencelock.Client, len(p.campaigners))
	wrappers := make([]*faulty, 0, len(p.campaigners))
	for i, cp := range p.campaigners {
		inner, err := cp.cfg.open(ctx, h, o)
		if err != nil {
			return nil, nil, 0, err
		}
		w := newFaulty(inner, cp.faults, tenth, releaseTimeout(h.TTL), rec, i)
		wrappers = append(wrappers, w)
		c, err := fencelock.New(w.backend(), cp.cfg.options(h, cp.rotate, fmt.Sprintf("generative-elect-%d", i), nil))
		if err != nil {
			inner.Close()
			return nil, nil, 0, err
		}
		clients[i] = c
		for _, a := range cp.actions {
			crashed = crashed || a.kind == electCrash
		}
		id := fmt.Sprintf("c%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.campaign(ctx, rec, c, w, h, key, id, i, cp, start, tenth)
		}()
	}
	if f, ok := raw.(driver.TokenFloorer); ok && p.raiseAt > 0 {
		// A migration raising the floor while campaigners wait and lead:
		// the next leader keeps its value and its token is above the floor.
		wg.Go(func() {
			sleepCtx(ctx, time.Duration(p.raiseAt)*tenth-time.Since(start))
			raiseMidway(ctx, rec, f, key)
		})
	}
	wg.Wait() // every campaign has ended (resigned, or crashed and stopped)
	for i, c := range clients {
		if err := c.Close(); err != nil && !crashedProg(p.campaigners[i]) && !p.campaigners[i].faults.any() {
			e.violate("ResignFreesKey", "campaigner %d: Close: %v", i, err)
		}
	}
	for _, w := range wrappers {
		w.settle()
	}

	// ResignFreesKey: the store frees the key (at once, or once a
	// crashed or faulted campaigner's record expires), and the observer's
	// last word is then "no leader".
	// A term released into its minimum hold keeps the key until the
	// hold ends.
	bound := time.Duration(0)
	faulted := rec.faultedBeyondLate()
	var cfgs []clientCfg
	var ttls []int
	for _, cp := range p.campaigners {
		cfgs = append(cfgs, cp.cfg)
		ttls = append(ttls, cp.ttl)
	}
	if crashed || faulted {
		maxTTL, slack := longestTTL(h, cfgs, ttls)
		bound = maxTTL + slack
	}
	if hold := p.longestHold(tenth); hold > 0 {
		bound = max(bound, hold+h.Slack)
	}
	// Both bounds count from when the store answers: a stall
	// (Options.Stall, drawn by any program whose Stall reaches these
	// clients) holds every read of the watcher and the observer until it
	// ends, so a bound that a stall overlapped counts from the stall's
	// end.
	poll := max(h.TTL/8, 10*time.Millisecond) + h.Slack // the observer's polling bound
	ended := time.Now()
	for {
		l, err := recipe.CurrentLeader(ctx, watcher, key)
		if errors.Is(err, recipe.ErrNoLeader) {
			break
		}
		if time.Since(o.stalls.answersFrom(ended)) > bound || ctx.Err() != nil {
			e.violate("ResignFreesKey", "the key is still held %v after every campaign ended (crashed %v, faults %v): %s, %v", bound, crashed, faulted, describeLeader(l), err)
			break
		}
		sleepCtx(ctx, tenth/2)
	}
	freeAt := time.Now()
	deadline := time.NewTimer(poll)
	defer deadline.Stop()
	for free := false; !free; {
		omu.Lock()
		free = len(observed) > 0 && !observed[len(observed)-1].Elected()
		omu.Unlock()
		if free {
			break
		}
		select {
		case <-oseen:
		case <-deadline.C:
			if left := time.Until(o.stalls.answersFrom(freeAt).Add(poll)); left > 0 {
				deadline.Reset(left) // a stall held the observer's reads
				continue
			}
			e.violate("ResignFreesKey", "the observer did not report the free key within its polling bound %v", poll)
			free = true
		case <-ctx.Done():
			free = true
		}
	}
	stopObserving()
	<-odone

	e.checkObserved(observed)
	return rec, e.vs, len(e.terms), nil
}

func crashedProg(cp campaignProg) bool {
	for _, a := range cp.actions {
		if a.kind == electCrash {
			return true
		}
	}
	return false
}

// campaign runs one campaigner's Elect, applying its actions, until the
// program's end (30 tenths) or its crash.
func (e *electRun) campaign(ctx context.Context, rec *recorder, c *fencelock.Client, w *faulty, h conformance.Harness, key, id string, i int, cp campaignProg, start time.Time, tenth time.Duration) {
	proclaim := make(chan struct{}, 1)
	values := 0
	value := "v0-" + id
	e.publish(id, value)
	fn := func(ctx context.Context, l *fencelock.Lease) error {
		e.mu.Lock()
		for _, t := range e.terms {
			if t.ctx.Err() == nil {
				e.vs = append(e.vs, violation{"NoTwoHolders", fmt.Sprintf("election: %s's callback (token %d) started while c%d's (token %d) context was live", id, l.Token(), t.who, t.token)})
			}
		}
		e.terms = append(e.terms, electTerm{who: i, token: l.Token(), owner: l.Owner(), ctx: ctx})
		e.mu.Unlock()
		rec.note("%s leads, token %d", id, l.Token())
		for {
			select {
			case <-ctx.Done():
				rec.note("%s's term (token %d) ends: %v", id, l.Token(), context.Cause(ctx))
				return ctx.Err()
			case <-proclaim:
				values++
				v := fmt.Sprintf("v%d-%s", values, id)
				e.publish(id, v) // before the store can show it
				err := l.SetMetadata(ctx, []byte(v))
				rec.note("%s proclaims %s: %v", id, v, err)
			}
		}
	}
	run := func() (stop func()) {
		ectx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- recipe.Elect(ectx, c, key, id, []byte(value), fn, &recipe.ElectOptions{Acquire: cp.termOptions(tenth)})
		}()
		return func() {
			select {
			case err := <-done:
				// Elect returned before its ctx ended: only the store's
				// failure for a whole TTL (Acquire without a deadline
				// gives up then) ends it: on a faulty or crashed client,
				// or on any client when the store itself did not answer
				// within the request's bound (a real store can be that
				// slow: the error then matches DeadlineExceeded, which
				// Elect's own ctx, still live, cannot have caused).
				cancel()
				var be *fencelock.BackendError
				silent := errors.Is(err, context.DeadlineExceeded)
				if !errors.As(err, &be) || !crashedProg(cp) && !cp.faults.any() && !silent {
					e.violate("ResignFreesKey", "%s: Elect returned %v before its ctx ended", id, err)
				}
			default:
				cancel()
				if err := <-done; err != nil {
					e.violate("ResignFreesKey", "%s: Elect returned %v after its ctx ended; want nil (it resigned)", id, err)
				}
			}
		}
	}
	stop := run()
	wait := func(tenths int) {
		sleepCtx(ctx, time.Duration(tenths)*tenth-time.Since(start))
	}
	for _, a := range cp.actions {
		wait(a.at)
		switch a.kind {
		case electResign:
			rec.note("%s resigns and campaigns again", id)
			stop()
			stop = run()
		case electProclaim:
			select {
			case proclaim <- struct{}{}:
			default:
			}
		case electCrash:
			rec.note("%s crashes", id)
			w.die(h.Crash)
			wait(30)
			stop()
			return
		}
	}
	wait(30)
	stop()
}

// checkObserved checks what Observe delivered.
//
// An owner once replaced (by another owner or by no leader) is a lease
// that ended, never to be delivered again — if it was a lease: a
// campaigner led under it. One Acquire call's attempts share one owner
// (driver.AcquireRequest.Owner: a retry after an ambiguous reply gets the
// existing grant back), so the store may record an owner under which no
// lease was handed out twice: an attempt whose reply was lost makes a
// record, the call gives up on a store failed for a TTL and removes it
// by owner, and a request of the same call that was still on its way
// (cut at the call's failure bound, as engine bounds cut every request)
// lands after that and makes another, which expires with its TTL. Such
// a record is new, so it comes back under a token above every one
// delivered before; the same record delivered again would not.
func (e *electRun) checkObserved(ls []recipe.Leader) {
	e.mu.Lock()
	defer e.mu.Unlock()
	led := map[string]bool{}
	for _, t := range e.terms {
		led[t.owner] = true
	}
	var top fencelock.Token
	gone := map[string]bool{}
	for i, l := range ls {
		if i > 0 {
			if p := ls[i-1]; p.Elected() && p.Owner != l.Owner {
				gone[p.Owner] = true
			}
		}
		if !l.Elected() {
			continue
		}
		if l.Token < top || gone[l.Owner] && (led[l.Owner] || l.Token == top) {
			e.vs = append(e.vs, violation{"ObserveInOrder", fmt.Sprintf("delivery %d (%s) after a newer one", i, describeLeader(l))})
		}
		top = max(top, l.Token)
		if !e.published[l.Identity][string(l.Value)] {
			e.vs = append(e.vs, violation{"ObservedValuePublished", fmt.Sprintf("delivery %d (%s): %q was never published by %q", i, describeLeader(l), l.Value, l.Identity)})
		}
	}
}

func describeLeader(l recipe.Leader) string {
	if !l.Elected() {
		return "no leader"
	}
	return fmt.Sprintf("%s#%d %q", l.Identity, l.Token, l.Value)
}
