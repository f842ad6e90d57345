package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/recipe"
)

// electionRule is the rule of the Election case; each of its parts adds
// its own.
const electionRule = "leader election (recipe.Elect, CurrentLeader, Observe) works on every backend: see the part that failed."

// testElection runs the election parts, each a subtest with its own rule.
func testElection(t *testing.T, s *suite) {
	parts := []testCase{
		{"IdentityAndValueRoundTrip", "Leader reports the leader's identity and value exactly as given (Elect's identity, value, then what the leader proclaims with Lease.SetMetadata) and its lease's token, and ErrNoLeader once it resigned.", testElectRoundTrip},
		{"CrashObservedWithinLossBound", "a leader that stops renewing without releasing (its process crashed) loses its callback's context by local validity; the store frees the key within the TTL it granted plus slack; another campaigner's callback starts after the crashed one's context was cancelled, and an observer sees the change within that bound plus its polling bound (MaxBackoff).", testElectCrash},
		{"ResignObservedWithinPollBound", "a leader whose Elect context ends releases at once: another campaigner leads, and an observer sees the change within its polling bound (MaxBackoff) plus slack, at once where the backend notifies.", testElectResign},
		{"ObserveSeesEveryLeaderInOrder", "with several campaigners and forced losses (resignations, and force-releases where the backend has them), Observe delivers every leader, in token order, one at a time (each replacing the one before, never a stale one after a newer), and each leader's callback started after the previous one's context was cancelled (except after a force-release, an administrator's override the holder learns of at its next renewal).", testElectEveryLeader},
	}
	runCases(t, s, parts)
}

// terms records, for one election, when each campaigner's callback
// started and when its context was cancelled.
type terms struct {
	mu       sync.Mutex
	list     []termRec
	start    chan termRec // each term, as it starts
	overlaps []string     // terms that started while an earlier one's context was live
}

type termRec struct {
	who        string
	token      fencelock.Token
	began, end time.Time       // end: when fn's ctx was seen cancelled; zero while live
	forced     bool            // ended by a force-release
	ctx        context.Context // fn's
}

func newTerms() *terms { return &terms{start: make(chan termRec, 64)} }

// fn is a campaigner's callback: it leads until its context ends.
func (r *terms) fn(who string) func(ctx context.Context, l *fencelock.Lease) error {
	return func(ctx context.Context, l *fencelock.Lease) error {
		rec := termRec{who: who, token: l.Token(), began: time.Now(), ctx: ctx}
		r.mu.Lock()
		// Every earlier leader's callback context must be cancelled by
		// now (checked at this instant: a timestamp taken by another
		// goroutine would come late).
		for _, p := range r.list {
			if !p.forced && p.ctx.Err() == nil {
				r.overlaps = append(r.overlaps, fmt.Sprintf("%s's callback (token %d) started while %s's (token %d) context was live: two leaders at once", who, rec.token, p.who, p.token))
			}
		}
		i := len(r.list)
		r.list = append(r.list, rec)
		r.mu.Unlock()
		stop := context.AfterFunc(ctx, func() {
			r.mu.Lock()
			r.list[i].end = time.Now()
			r.mu.Unlock()
		})
		defer stop()
		select {
		case r.start <- rec:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}
}

func (r *terms) snapshot() []termRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]termRec(nil), r.list...)
}

func (r *terms) markForced(token fencelock.Token) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.list {
		if r.list[i].token == token {
			r.list[i].forced = true
		}
	}
}

// checkSequential: in token order, and each callback started after every
// earlier one's context was cancelled (except a forced one's).
func (r *terms) checkSequential(t *testing.T) {
	t.Helper()
	list := r.snapshot()
	for i := 1; i < len(list); i++ {
		prev, next := list[i-1], list[i]
		if next.token <= prev.token {
			t.Errorf("%s's term has token %d, not above the previous term's (%s) %d", next.who, next.token, prev.who, prev.token)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.overlaps {
		t.Error(o)
	}
}

// campaigner runs Elect in the background until stopped.
type campaigner struct {
	id     string
	c      *fencelock.Client
	cancel context.CancelFunc
	done   chan error
}

func (s *suite) campaign(t *testing.T, c *fencelock.Client, key, id string, r *terms) *campaigner {
	ctx, cancel := context.WithCancel(t.Context())
	cp := &campaigner{id: id, c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { cp.done <- recipe.Elect(ctx, c, key, id, []byte("value of "+id), r.fn(id), nil) }()
	t.Cleanup(func() { cp.stop(t) })
	return cp
}

// stop ends the campaign and checks that Elect returned ctx's error.
func (cp *campaigner) stop(t *testing.T) {
	t.Helper()
	if cp.cancel == nil {
		return
	}
	cp.cancel()
	cp.cancel = nil
	select {
	case err := <-cp.done:
		if err != nil {
			t.Errorf("Elect(%s) = %v after its ctx ended; want nil (it resigned)", cp.id, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("Elect(%s) did not return within 30s of its ctx ending", cp.id)
	}
}

// stopKilled is stop for a campaigner whose backend the test killed: once
// its lease ended, its Elect campaigns again on the dead backend, and an
// acquire without a deadline gives up after the store failed for a TTL,
// so Elect may have returned that failure before its ctx ended (sooner
// where the store vouches for less than its TTL, Grant.Valid). Any other
// error, or no return within 30s, still fails t.
func (cp *campaigner) stopKilled(t *testing.T) {
	t.Helper()
	if cp.cancel == nil {
		return
	}
	cp.cancel()
	cp.cancel = nil
	select {
	case err := <-cp.done:
		if err != nil && !errors.Is(err, errKilled) {
			t.Errorf("Elect(%s) = %v after its ctx ended; want nil (it resigned) or its own backend's death", cp.id, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("Elect(%s) did not return within 30s of its ctx ending", cp.id)
	}
}

// waitTerm waits for the next callback to start, within d.
func waitTerm(t *testing.T, r *terms, d time.Duration, what string) termRec {
	t.Helper()
	select {
	case rec := <-r.start:
		return rec
	case <-time.After(d):
		t.Fatalf("%s: no campaigner's callback started within %v", what, d)
	}
	return termRec{}
}

// observed collects an Observe channel.
type observed struct {
	mu   sync.Mutex
	got  []recipe.Leader
	at   []time.Time
	wake chan struct{}
}

func (s *suite) observe(t *testing.T, key string) *observed {
	t.Helper()
	c := s.client(t)
	ch, err := recipe.Observe(t.Context(), c, key)
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	o := &observed{wake: make(chan struct{}, 1)}
	go func() {
		for l := range ch {
			o.mu.Lock()
			o.got = append(o.got, l)
			o.at = append(o.at, time.Now())
			o.mu.Unlock()
			select {
			case o.wake <- struct{}{}:
			default:
			}
		}
	}()
	return o
}

// until waits, within d, for a delivery at index from or later that
// satisfies ok, and returns its index and when it arrived.
func (o *observed) until(t *testing.T, d time.Duration, what string, from int, ok func(recipe.Leader) bool) (int, time.Time) {
	t.Helper()
	deadline := time.After(d)
	seen := from
	for {
		o.mu.Lock()
		for ; seen < len(o.got); seen++ {
			if ok(o.got[seen]) {
				at := o.at[seen]
				o.mu.Unlock()
				return seen, at
			}
		}
		o.mu.Unlock()
		select {
		case <-o.wake:
		case <-deadline:
			t.Fatalf("%s: not observed within %v; observed %s", what, d, describeLeaders(o.all()))
		}
	}
}

func (o *observed) all() []recipe.Leader {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]recipe.Leader(nil), o.got...)
}

func describeLeaders(ls []recipe.Leader) string {
	var b strings.Builder
	for i, l := range ls {
		if i > 0 {
			b.WriteString(" → ")
		}
		if !l.Elected() {
			b.WriteString("none")
			continue
		}
		fmt.Fprintf(&b, "%s#%d", l.Identity, l.Token)
	}
	if b.Len() == 0 {
		return "nothing"
	}
	return b.String()
}

// checkHistory: Observe's deliveries move forward only — leader tokens
// never go down, a record once replaced never returns, nothing repeats.
// A record is an owner at a token: one Acquire call's attempts share an
// owner, and a waiter whose queue entry was dropped (its wait's request
// failed) queues again under the same owner with a new entry, a new
// record under a higher token, which may be delivered after the first
// was replaced. A stale read of a replaced record has its token or a
// lower one.
func checkHistory(t *testing.T, ls []recipe.Leader) {
	t.Helper()
	type record struct {
		owner string
		token fencelock.Token
	}
	var top fencelock.Token
	gone := map[record]bool{}
	for i, l := range ls {
		if i > 0 {
			p := ls[i-1]
			if p.Owner == l.Owner && p.Token == l.Token && bytes.Equal(p.Value, l.Value) {
				t.Errorf("delivery %d repeats the one before: %s", i, describeLeaders(ls))
			}
			if p.Elected() && p.Owner != l.Owner {
				gone[record{p.Owner, p.Token}] = true
			}
		}
		if l.Elected() && (l.Token < top || gone[record{l.Owner, l.Token}]) {
			t.Errorf("delivery %d (%s#%d) goes back in time: %s", i, l.Identity, l.Token, describeLeaders(ls))
		}
		if l.Elected() {
			top = max(top, l.Token)
		}
	}
}

func testElectRoundTrip(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "leader")
	r := newTerms()
	reader := s.client(t)
	if _, err := recipe.CurrentLeader(ctx, reader, key); !errors.Is(err, recipe.ErrNoLeader) {
		t.Fatalf("Leader of a free key = %v; want ErrNoLeader", err)
	}
	// An identity with the characters of an owner string's suffix, and a
	// binary value.
	identity := "node 7/0123456789ab.3 «eu»"
	value := []byte{0, 1, 2, 0xff, 'v'}
	c := s.client(t)
	leading := make(chan *fencelock.Lease, 1)
	ectx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- recipe.Elect(ectx, c, key, identity, value, func(ctx context.Context, l *fencelock.Lease) error {
			leading <- l
			return r.fn(identity)(ctx, l)
		}, nil)
	}()
	var l *fencelock.Lease
	select {
	case l = <-leading:
	case <-time.After(s.h.TTL + s.h.Slack):
		t.Fatal("Elect did not lead a free key")
	}
	got, err := recipe.CurrentLeader(ctx, reader, key)
	if err != nil {
		t.Fatalf("Leader: %v", err)
	}
	if got.Identity != identity || !bytes.Equal(got.Value, value) || got.Token != l.Token() || got.Owner != l.Owner() || got.Key != key {
		t.Errorf("Leader = %+v; want identity %q, value %q, token %d, owner %q", got, identity, value, l.Token(), l.Owner())
	}
	proclaimed := []byte("10.1.2.3:8080")
	if err := l.SetMetadata(ctx, proclaimed); err != nil {
		t.Fatalf("SetMetadata (proclaim): %v", err)
	}
	if got, err := recipe.CurrentLeader(ctx, reader, key); err != nil || !bytes.Equal(got.Value, proclaimed) || got.Identity != identity || got.Token != l.Token() {
		t.Errorf("Leader after proclaiming = %+v, %v; want value %q, same identity and token", got, err, proclaimed)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Elect = %v after its ctx ended; want nil (it resigned)", err)
	}
	if got, err := recipe.CurrentLeader(ctx, reader, key); !errors.Is(err, recipe.ErrNoLeader) {
		t.Errorf("Leader after resigning = %+v, %v; want ErrNoLeader at once", got, err)
	}
}

// killable is a Backend that a test can kill: every call then fails, as
// calls from a process that died would never arrive.
type killable struct {
	driver.Backend
	dead atomic.Bool
}

var errKilled = errors.New("conformance: campaigner process killed")

func (k *killable) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	if k.dead.Load() {
		return driver.Grant{}, errKilled
	}
	return k.Backend.Acquire(ctx, r)
}

func (k *killable) Renew(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error) {
	if k.dead.Load() {
		return driver.Grant{}, errKilled
	}
	return k.Backend.Renew(ctx, g, r)
}

func (k *killable) Release(ctx context.Context, g driver.Grant) error {
	if k.dead.Load() {
		return errKilled
	}
	return k.Backend.Release(ctx, g)
}

func (k *killable) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if k.dead.Load() {
		return driver.Info{}, errKilled
	}
	return k.Backend.Inspect(ctx, key)
}

func (k *killable) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.Backend.List(ctx, prefix)
}

func testElectCrash(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "leader")
	r := newTerms()
	obs := s.observe(t, key)

	// The victim campaigns alone first, so it leads. Its backend
	// offers no optional capability: a dead process pushes nothing.
	inner, err := s.h.Open(ctx)
	if err != nil {
		t.Fatalf("Harness.Open: %v", err)
	}
	probe := rawAcquire(t, ctx, inner, key+"/probe", s.h.TTL) // learns the TTL the store grants
	if err := inner.Release(ctx, probe); err != nil {
		t.Fatalf("Release(probe): %v", err)
	}
	victimB := &killable{Backend: inner}
	victim, err := fencelock.New(victimB, s.options())
	if err != nil {
		inner.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Close() }) // its releases fail: it is dead
	vcp := s.campaign(t, victim, key, "victim", r)
	first := waitTerm(t, r, s.h.TTL+s.h.Slack, "victim on a free key")
	if first.who != "victim" {
		t.Fatalf("first leader %s; want the victim", first.who)
	}
	led, _ := obs.until(t, s.h.TTL+s.h.Slack, "the victim leading", 0, func(l recipe.Leader) bool { return l.Identity == "victim" })
	// One campaigner waits to take over. (Two racing to take over the
	// same expired record is the generative mode's ground: FerretDB
	// lets both win, a defect measured there and in the safety report.)
	s.campaign(t, s.client(t), key, "b", r)

	killed := time.Now()
	victimB.dead.Store(true)
	s.crash(inner)
	bound := s.expiryBound(probe, s.h.TTL)
	poll := s.options().MaxBackoff
	next := waitTerm(t, r, bound+poll, "a takeover after the leader crashed")
	if next.who == "victim" {
		t.Fatalf("the crashed victim led again")
	}
	took := next.began.Sub(killed)
	rec := r.snapshot()[0]
	t.Logf("crashed leader's context cancelled +%v, %s leads +%v (TTL %v, granted %v, bound %v)", rec.end.Sub(killed), next.who, took, s.h.TTL, grantedTTL(probe, s.h.TTL), bound)
	_, at := obs.until(t, bound+poll+s.h.Slack, "the crashed leader's end", led+1, func(l recipe.Leader) bool { return l.Identity != "victim" })
	if d := at.Sub(killed); d > bound+poll {
		t.Errorf("observer saw the crashed leader's end %v after the crash; want within the store's bound %v plus the polling bound %v", d, bound, poll)
	} else {
		t.Logf("observer saw the change %v after the crash", d)
	}
	obs.until(t, poll+s.h.Slack, fmt.Sprintf("the new leader %s#%d", next.who, next.token), led+1, func(l recipe.Leader) bool { return l.Identity == next.who && l.Token == next.token })
	vcp.stopKilled(t)
	r.checkSequential(t)
	checkHistory(t, obs.all())
}

func testElectResign(t *testing.T, s *suite) {
	key := s.key(t, "leader")
	r := newTerms()
	obs := s.observe(t, key)
	a := s.campaign(t, s.client(t), key, "a", r)
	waitTerm(t, r, s.h.TTL+s.h.Slack, "a on a free key")
	led, _ := obs.until(t, s.h.TTL+s.h.Slack, "a leading", 0, func(l recipe.Leader) bool { return l.Identity == "a" })
	s.campaign(t, s.client(t), key, "b", r)

	resigned := time.Now()
	a.stop(t) // returns once Elect has released
	poll := s.options().MaxBackoff
	next := waitTerm(t, r, poll+s.h.Slack, "b after a resigned")
	if next.who != "b" {
		t.Fatalf("next leader %s; want b", next.who)
	}
	_, at := obs.until(t, poll+s.h.Slack, "a's resignation", led+1, func(l recipe.Leader) bool { return l.Identity != "a" })
	t.Logf("b led %v and the observer saw the change %v after a's ctx ended (polling bound %v)", next.began.Sub(resigned), at.Sub(resigned), poll)
	r.checkSequential(t)
	checkHistory(t, obs.all())
}

func testElectEveryLeader(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "leader")
	r := newTerms()
	obs := s.observe(t, key)
	admin := s.backend(t)
	force, canForce := admin.(driver.ForceReleaser)
	if !canForce {
		t.Log("capability ForceReleaser not implemented by this backend: forced losses are resignations only")
	}
	camps := map[string]*campaigner{}
	for _, id := range []string{"a", "b", "c"} {
		camps[id] = s.campaign(t, s.client(t), key, id, r)
	}
	bound := s.h.TTL + s.h.Slack + s.options().MaxBackoff
	const rounds = 6
	n := 0
	for round := range rounds {
		rec := waitTerm(t, r, bound, fmt.Sprintf("round %d", round))
		// Hold every leader until the observer has seen it.
		obs.until(t, bound, fmt.Sprintf("round %d: %s#%d", round, rec.who, rec.token), 0, func(l recipe.Leader) bool {
			return l.Identity == rec.who && l.Token == rec.token
		})
		n++
		if canForce && round%2 == 1 {
			r.markForced(rec.token)
			if _, err := force.ForceRelease(ctx, key); err != nil {
				t.Fatalf("ForceRelease: %v", err)
			}
			continue
		}
		// Resign: end that campaigner's Elect and start it again.
		camps[rec.who].stop(t)
		camps[rec.who] = s.campaign(t, camps[rec.who].c, key, rec.who, r)
	}
	for _, cp := range camps {
		cp.stop(t)
	}
	lastTok := r.snapshot()[n-1].token
	last, _ := obs.until(t, bound, "the last term", 0, func(l recipe.Leader) bool { return l.Token == lastTok })
	obs.until(t, bound, "no leader after everyone resigned", last+1, func(l recipe.Leader) bool { return !l.Elected() })
	r.checkSequential(t)
	got := obs.all()
	checkHistory(t, got)
	// Every term (each held until observed) appears, in token order.
	var leaders []recipe.Leader
	for _, l := range got {
		if l.Elected() {
			leaders = append(leaders, l)
		}
	}
	list := r.snapshot()
	if len(list) < n {
		t.Fatalf("%d terms recorded; want at least %d", len(list), n)
	}
	j := 0
	for _, rec := range list[:n] {
		for j < len(leaders) && leaders[j].Token < rec.token {
			j++
		}
		if j == len(leaders) || leaders[j].Token != rec.token || leaders[j].Identity != rec.who || string(leaders[j].Value) != "value of "+rec.who {
			t.Errorf("term %s#%d not observed (with its value) in order: observed %s", rec.who, rec.token, describeLeaders(got))
		}
	}
}
