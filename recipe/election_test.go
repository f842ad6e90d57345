package recipe_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"github.com/fencelock/fencelock/recipe"
)

// termLog records, in a synctest bubble, when each campaigner's fn started
// and when its context was cancelled.
type termLog struct {
	mu       sync.Mutex
	start    time.Time
	terms    []term
	overlaps []string // terms that started while an earlier one's context was live
}

type term struct {
	who         string
	token       fencelock.Token
	began, over time.Duration // over: when fn's ctx was cancelled (-1 while live)
	ctx         context.Context
}

func newTermLog() *termLog { return &termLog{start: time.Now()} }

// fn returns an Elect callback for who that leads until its context ends.
func (g *termLog) fn(who string) func(ctx context.Context, l *fencelock.Lease) error {
	return func(ctx context.Context, l *fencelock.Lease) error {
		g.mu.Lock()
		for _, p := range g.terms {
			if p.ctx.Err() == nil {
				g.overlaps = append(g.overlaps, fmt.Sprintf("%s's fn (token %d) started while %s's (token %d) context was live", who, l.Token(), p.who, p.token))
			}
		}
		i := len(g.terms)
		g.terms = append(g.terms, term{who: who, token: l.Token(), began: time.Since(g.start), over: -1, ctx: ctx})
		g.mu.Unlock()
		// Recorded here, not by a context.AfterFunc stopped on return:
		// that stop can win the race with the cancellation and drop the
		// record.
		<-ctx.Done()
		g.mu.Lock()
		g.terms[i].over = time.Since(g.start)
		g.mu.Unlock()
		return ctx.Err()
	}
}

func (g *termLog) snapshot() []term {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]term(nil), g.terms...)
}

// checkNoOverlap asserts that the terms, in token order, never overlap:
// each fn started after every earlier one's context was cancelled, as
// checked at the instant it started (a timestamp recorded by the
// context.AfterFunc goroutine of the earlier term may come later).
func (g *termLog) checkNoOverlap(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	for _, o := range g.overlaps {
		t.Errorf("two leaders at once: %s", o)
	}
	g.mu.Unlock()
	terms := g.snapshot()
	for i := 1; i < len(terms); i++ {
		if prev, next := terms[i-1], terms[i]; next.token <= prev.token {
			t.Errorf("term %d of %s has token %d, not above the previous term's %d", i, next.who, next.token, prev.token)
		}
	}
}

// collect reads an Observe channel into a slice until it is closed.
type collected struct {
	mu   sync.Mutex
	got  []recipe.Leader
	at   []time.Duration
	done chan struct{}
}

func collect(ch <-chan recipe.Leader, start time.Time) *collected {
	c := &collected{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for l := range ch {
			c.mu.Lock()
			c.got = append(c.got, l)
			c.at = append(c.at, time.Since(start))
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *collected) leaders() ([]recipe.Leader, []time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]recipe.Leader(nil), c.got...), append([]time.Duration(nil), c.at...)
}

func describe(ls []recipe.Leader) string {
	var b strings.Builder
	for i, l := range ls {
		if i > 0 {
			b.WriteString(" → ")
		}
		if !l.Elected() {
			b.WriteString("none")
			continue
		}
		fmt.Fprintf(&b, "%s(%d,%q)", l.Identity, l.Token, l.Value)
	}
	return b.String()
}

// checkOrdered asserts that Observe's deliveries are a history: leaders'
// tokens never go down, a lease once replaced (or gone) never comes back,
// and no delivery repeats the one before.
func checkOrdered(t *testing.T, ls []recipe.Leader) {
	t.Helper()
	var top fencelock.Token
	ended := map[string]bool{}
	for i, l := range ls {
		if i > 0 {
			p := ls[i-1]
			if p.Owner == l.Owner && p.Token == l.Token && bytes.Equal(p.Value, l.Value) {
				t.Errorf("delivery %d repeats the one before: %s", i, describe(ls))
			}
			if p.Elected() && p.Owner != l.Owner {
				ended[p.Owner] = true
			}
		}
		if !l.Elected() {
			continue
		}
		if l.Token < top || ended[l.Owner] {
			t.Errorf("delivery %d (%s, token %d) goes back in time: %s", i, l.Identity, l.Token, describe(ls))
		}
		top = max(top, l.Token)
	}
}

func TestElectCampaignsAgainAfterLossAndResignsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		log := newTermLog()
		o := &fencelock.Options{TTL: 3 * time.Second}
		watcher := newClient(t, store.Backend(), o)
		obs, err := recipe.Observe(t.Context(), watcher, "leader")
		if err != nil {
			t.Fatal(err)
		}
		seen := collect(obs, log.start)

		type hook struct {
			who, what string
			l         recipe.Leader
			err       error
			at        time.Duration
		}
		var (
			hmu   sync.Mutex
			hooks []hook
		)
		record := func(who, what string, l recipe.Leader, err error) {
			hmu.Lock()
			defer hmu.Unlock()
			hooks = append(hooks, hook{who, what, l, err, time.Since(log.start)})
		}
		backends := map[string]*memory.Backend{}
		cancels := map[string]context.CancelFunc{}
		results := map[string]chan error{}
		for _, id := range []string{"a", "b", "c"} {
			b := store.Backend()
			backends[id] = b
			c := newClient(t, b, o)
			ctx, cancel := context.WithCancel(t.Context())
			cancels[id] = cancel
			results[id] = make(chan error, 1)
			go func() {
				results[id] <- recipe.Elect(ctx, c, "leader", id, []byte("addr-"+id), log.fn(id), &recipe.ElectOptions{
					OnStartedLeading: func(l recipe.Leader) { record(id, "started", l, nil) },
					OnStoppedLeading: func(l recipe.Leader, err error) { record(id, "stopped", l, err) },
				})
			}()
			synctest.Wait() // a campaigns first and leads
		}
		if terms := log.snapshot(); len(terms) != 1 || terms[0].who != "a" || terms[0].began != 0 {
			t.Fatalf("terms = %+v; want a leading from the start", terms)
		}

		// a's process stops reaching the store (as a crashed one would):
		// its lease ends locally at TTL − Margin = 2.7s, the store frees
		// the key at 3s, and b or c takes over.
		time.Sleep(500 * time.Millisecond)
		backends["a"].SetUnreachable(true)
		for len(log.snapshot()) < 2 {
			time.Sleep(100 * time.Millisecond)
		}
		terms := log.snapshot()
		if terms[0].over != 2700*time.Millisecond {
			t.Errorf("a's fn context cancelled at %v; want at the end of its local validity, 2.7s", terms[0].over)
		}
		if next := terms[1]; next.who == "a" || next.began < 3*time.Second || next.began > 3*time.Second+10*time.Millisecond {
			t.Errorf("next term %+v; want b or c leading once the store freed the key at 3s", next)
		}
		synctest.Wait()
		ls, at := seen.leaders()
		if len(ls) < 3 || !ls[1].Elected() || ls[1].Identity != "a" || ls[len(ls)-1].Identity != terms[1].who {
			t.Fatalf("observed %s; want none → a → (none →) %s", describe(ls), terms[1].who)
		}
		if d := at[2]; d > 3*time.Second+10*time.Millisecond {
			t.Errorf("the observer saw a's end at %v; want when the store expired it, 3s", d)
		}

		// a reaches the store again and campaigns again; the leader
		// resigns: the key changes hands at that very instant.
		backends["a"].SetUnreachable(false)
		time.Sleep(time.Second)
		leader := terms[1].who
		resignAt := time.Since(log.start)
		cancels[leader]()
		if err := <-results[leader]; err != nil {
			t.Errorf("Elect of the resigned leader returned %v; want nil", err)
		}
		synctest.Wait()
		terms = log.snapshot()
		if len(terms) != 3 {
			t.Fatalf("terms = %+v; want a third term after the resignation", terms)
		}
		if terms[1].over != resignAt || terms[2].began != resignAt {
			t.Errorf("resigned at %v: old term over at %v, new term began at %v; want the release at once", resignAt, terms[1].over, terms[2].began)
		}
		for _, id := range []string{"a", "b", "c"} {
			cancels[id]()
		}
		for _, id := range []string{"a", "b", "c"} {
			if id != leader {
				if err := <-results[id]; err != nil {
					t.Errorf("Elect(%s) = %v; want nil (resigned)", id, err)
				}
			}
		}
		synctest.Wait()
		log.checkNoOverlap(t)
		ls, _ = seen.leaders()
		checkOrdered(t, ls)
		if last := ls[len(ls)-1]; last.Elected() {
			t.Errorf("observed %s; want no leader after every campaigner resigned", describe(ls))
		}

		// Hooks: started and stopped per term, in order, stopped with the
		// *LostError after a's loss and nil after a resignation.
		hmu.Lock()
		defer hmu.Unlock()
		if len(hooks) != 6 {
			t.Fatalf("hooks = %+v; want started/stopped for each of 3 terms", hooks)
		}
		if h := hooks[1]; h.who != "a" || h.what != "stopped" || !errors.Is(h.err, fencelock.ErrLeaseLost) || h.at != 2700*time.Millisecond {
			t.Errorf("a's OnStoppedLeading = %+v; want at 2.7s with ErrLeaseLost", h)
		}
		if h := hooks[0]; h.l.Identity != "a" || string(h.l.Value) != "addr-a" || h.l.Token != terms[0].token {
			t.Errorf("OnStartedLeading(%+v); want a's identity, value and token %d", h.l, terms[0].token)
		}
		resigned := false
		for _, h := range hooks {
			if h.who == leader && h.what == "stopped" {
				resigned = true
				if h.err != nil || h.at != resignAt || h.l.Token != terms[1].token {
					t.Errorf("%s's OnStoppedLeading after resigning = %+v; want a nil error at %v", leader, h, resignAt)
				}
			}
		}
		if !resigned {
			t.Errorf("hooks = %+v; no OnStoppedLeading for %s", hooks, leader)
		}
	})
}

func TestElectCallbackContextCancelledOnLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		c := newClient(t, store.Backend(), &fencelock.Options{TTL: 3 * time.Second})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		causes := make(chan error, 4)
		done := make(chan error, 1)
		go func() {
			done <- recipe.Elect(ctx, c, "k", "me", nil, func(ctx context.Context, l *fencelock.Lease) error {
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return ctx.Err()
			}, nil)
		}()
		synctest.Wait()
		if _, err := store.Backend().ForceRelease(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case cause := <-causes:
			if !errors.Is(cause, fencelock.ErrLeaseLost) {
				t.Errorf("fn's context cause = %v; want the lease's loss", cause)
			}
		default:
			t.Fatal("fn's context was not cancelled when the lease was lost")
		}
		// Elect campaigned again and leads a second term.
		info, err := c.Inspect(t.Context(), "k")
		if err != nil || info.Label() != "me" || info.Token != 2 {
			t.Errorf("Inspect = %+v, %v; want a second term of me, token 2", info, err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Elect = %v; want nil (resigned)", err)
		}
	})
}

func TestElectReturnsCallbackErrorAndReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		c := newClient(t, store.Backend(), nil)
		boom := errors.New("boom")
		terms := 0
		err := recipe.Elect(t.Context(), c, "k", "me", nil, func(ctx context.Context, l *fencelock.Lease) error {
			terms++
			if terms < 3 {
				return nil // ends the term; Elect campaigns again
			}
			return boom
		}, nil)
		if !errors.Is(err, boom) || terms != 3 {
			t.Fatalf("Elect = %v after %d terms; want boom after 3", err, terms)
		}
		if _, err := recipe.CurrentLeader(t.Context(), c, "k"); !errors.Is(err, recipe.ErrNoLeader) {
			t.Fatalf("Leader after Elect returned = %v; want ErrNoLeader (released)", err)
		}
		if tok := store.TokenOf("k"); tok != 3 {
			t.Errorf("token %d; want 3 terms", tok)
		}
	})
}

func TestLeaderReportsIdentityValueAndToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		c := newClient(t, store.Backend(), nil)
		if l, err := recipe.CurrentLeader(t.Context(), c, "k"); !errors.Is(err, recipe.ErrNoLeader) || l.Elected() || l.Key != "k" {
			t.Fatalf("Leader of a free key = %+v, %v; want ErrNoLeader", l, err)
		}
		// An identity that looks like an owner string is returned as given.
		identity := "pod-7/0123456789ab.3 (eu-west)"
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		leading := make(chan *fencelock.Lease)
		done := make(chan error, 1)
		go func() {
			done <- recipe.Elect(ctx, c, "k", identity, []byte("10.0.0.7:8080"), func(ctx context.Context, l *fencelock.Lease) error {
				leading <- l
				<-ctx.Done()
				return nil
			}, nil)
		}()
		defer func() { cancel(); <-done }()
		l := <-leading
		got, err := recipe.CurrentLeader(t.Context(), c, "k")
		if err != nil || got.Identity != identity || string(got.Value) != "10.0.0.7:8080" || got.Token != l.Token() || got.Owner != l.Owner() || !got.Elected() {
			t.Fatalf("Leader = %+v, %v; want identity %q, value, token %d, owner %q", got, err, identity, l.Token(), l.Owner())
		}
		if err := l.SetMetadata(t.Context(), []byte("10.0.0.7:9090")); err != nil {
			t.Fatal(err)
		}
		got, err = recipe.CurrentLeader(t.Context(), c, "k")
		if err != nil || string(got.Value) != "10.0.0.7:9090" || got.Token != l.Token() {
			t.Fatalf("Leader after proclaiming = %+v, %v; want the new value", got, err)
		}
	})
}

func TestElectRejectsBadIdentityAndValue(t *testing.T) {
	c := newClient(t, memory.New(), nil)
	fn := func(ctx context.Context, l *fencelock.Lease) error { t.Error("fn ran"); return nil }
	for _, id := range []string{"", "tab\there", strings.Repeat("x", 201)} {
		if err := recipe.Elect(t.Context(), c, "k", id, nil, fn, nil); !errors.Is(err, fencelock.ErrInvalidOption) {
			t.Errorf("Elect with identity %q = %v; want ErrInvalidOption", id, err)
		}
	}
	if err := recipe.Elect(t.Context(), c, "k", "me", make([]byte, driver.MaxMetadataLen+1), fn, nil); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Errorf("Elect with an oversized value = %v; want ErrInvalidOption", err)
	}
	if err := recipe.Elect(t.Context(), c, "", "me", nil, fn, nil); !errors.Is(err, fencelock.ErrInvalidKey) {
		t.Errorf("Elect with an empty key = %v; want ErrInvalidKey", err)
	}
	if _, err := recipe.Observe(t.Context(), c, ""); !errors.Is(err, fencelock.ErrInvalidKey) {
		t.Errorf("Observe with an empty key = %v; want ErrInvalidKey", err)
	}
	if info, _ := c.Inspect(t.Context(), "k"); info.Locked() {
		t.Errorf("a rejected Elect left %+v", info)
	}
}

func TestObserveDeliversEveryChangeInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		o := &fencelock.Options{TTL: 3 * time.Second}
		watcher := newClient(t, store.Backend(), o)
		ctx, cancel := context.WithCancel(t.Context())
		ch, err := recipe.Observe(ctx, watcher, "k")
		if err != nil {
			t.Fatal(err)
		}
		// next waits for the next delivery, at most within (fake time).
		next := func(what string, within time.Duration) recipe.Leader {
			t.Helper()
			end := time.Now().Add(within)
			for {
				synctest.Wait()
				select {
				case l, ok := <-ch:
					if !ok {
						t.Fatalf("%s: channel closed", what)
					}
					return l
				default:
				}
				if !time.Now().Before(end) {
					t.Fatalf("%s: nothing delivered within %v", what, within)
				}
				time.Sleep(time.Millisecond)
			}
		}
		quiet := func(what string) {
			t.Helper()
			time.Sleep(5 * time.Second) // many polling rounds
			synctest.Wait()
			select {
			case l := <-ch:
				t.Fatalf("%s: delivered %+v; want nothing new", what, l)
			default:
			}
		}
		if l := next("start", 0); l.Elected() || l.Key != "k" {
			t.Fatalf("first delivery %+v; want no leader", l)
		}
		quiet("free key")

		a := newClient(t, store.Backend(), o)
		la, err := a.Acquire(t.Context(), "k", fencelock.WithLabel("a"), fencelock.WithMetadata([]byte("v1")))
		if err != nil {
			t.Fatal(err)
		}
		if l := next("a acquired", time.Second); l.Identity != "a" || string(l.Value) != "v1" || l.Token != la.Token() {
			t.Fatalf("delivered %+v; want a with v1", l)
		}
		quiet("a renewing") // renewals are not changes
		if err := la.SetMetadata(t.Context(), []byte("v2")); err != nil {
			t.Fatal(err)
		}
		if l := next("a proclaimed", time.Second); l.Identity != "a" || string(l.Value) != "v2" || l.Token != la.Token() {
			t.Fatalf("delivered %+v; want a with v2", l)
		}
		releasedAt := time.Now()
		if err := la.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if l := next("a released", 0); l.Elected() {
			t.Fatalf("delivered %+v; want no leader after a's release", l)
		} else if d := time.Since(releasedAt); d != 0 {
			t.Errorf("release seen after %v; want at once (the memory backend notifies)", d)
		}
		quiet("free again")
		b := newClient(t, store.Backend(), o)
		lb, err := b.Acquire(t.Context(), "k", fencelock.WithLabel("b"))
		if err != nil {
			t.Fatal(err)
		}
		if l := next("b acquired", time.Second); l.Identity != "b" || l.Token != lb.Token() || l.Value != nil {
			t.Fatalf("delivered %+v; want b", l)
		}
		// b's store connection dies: the observer sees the key freed when
		// the store expires b's record, at its TTL, not a poll later.
		b.Backend().(*memory.Backend).SetUnreachable(true)
		// (b's last successful request was its acquire, just now.)
		if l := next("b expired", 3*time.Second+5*time.Millisecond); l.Elected() {
			t.Fatalf("delivered %+v; want no leader after b's record expired", l)
		}
		cancel()
		synctest.Wait()
		if l, ok := <-ch; ok {
			t.Fatalf("delivered %+v after ctx ended; want the channel closed", l)
		}
	})
}

// stale wraps a backend (its optional capabilities hidden) whose Inspect
// answers, when told to, with an old reading, as a lagging replica would.
type stale struct {
	*fakebackend.Fake
	mu  sync.Mutex
	old *driver.Info
}

func newStale(b driver.Backend) *stale {
	s := &stale{Fake: fakebackend.New(b, fakebackend.Plain)}
	s.OnInspect(func(ctx context.Context, key string, next fakebackend.InspectFunc) (driver.Info, error) {
		s.mu.Lock()
		old := s.old
		s.mu.Unlock()
		if old != nil {
			return *old, nil
		}
		return next(ctx, key)
	})
	return s
}

// leadAndObserve has client a acquire key "k" with opts, reads the record the store
// keeps for it, and has watcher observe the key from then on.
func leadAndObserve(t *testing.T, a, watcher *fencelock.Client, opts ...fencelock.AcquireOption) (*fencelock.Lease, driver.Info, *collected) {
	t.Helper()
	l, err := a.Acquire(t.Context(), "k", opts...)
	if err != nil {
		t.Fatal(err)
	}
	info, err := a.Inspect(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := recipe.Observe(t.Context(), watcher, "k")
	if err != nil {
		t.Fatal(err)
	}
	return l, info, collect(ch, time.Now())
}

func TestObserveNeverDeliversAStaleLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		o := &fencelock.Options{TTL: 3 * time.Second}
		sb := newStale(store.Backend())
		watcher := newClient(t, sb.Backend(), o)
		a := newClient(t, store.Backend(), o)
		la, aInfo, seen := leadAndObserve(t, a, watcher, fencelock.WithLabel("a"))
		if err := la.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		lb, err := a.Acquire(t.Context(), "k", fencelock.WithLabel("b"))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		// Now the store answers with a's old record, then with nothing.
		sb.mu.Lock()
		sb.old = &aInfo
		sb.mu.Unlock()
		time.Sleep(2 * time.Second)
		sb.mu.Lock()
		sb.old = &driver.Info{Key: "k"}
		sb.mu.Unlock()
		time.Sleep(2 * time.Second)
		sb.mu.Lock()
		sb.old = &aInfo
		sb.mu.Unlock()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		ls, _ := seen.leaders()
		checkOrdered(t, ls)
		want := fmt.Sprintf("a(%d,\"\") → b(%d,\"\") → none", la.Token(), lb.Token())
		if got := describe(ls); got != want && got != fmt.Sprintf("a(%d,\"\") → none → b(%d,\"\") → none", la.Token(), lb.Token()) {
			t.Errorf("observed %s; want %s: a stale reading of a is never delivered after b", got, want)
		}
	})
}

// A stale reading of the leader already delivered — its own lease, an
// older token and value (a read that raced its proclaim and release) —
// is never delivered after the newer one.
func TestObserveNeverDeliversAnOlderStateOfTheSameLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		o := &fencelock.Options{TTL: 3 * time.Second}
		sb := newStale(store.Backend())
		watcher := newClient(t, sb.Backend(), o)
		a := newClient(t, store.Backend(), o)
		l0, err := a.Acquire(t.Context(), "k", fencelock.WithLabel("a"))
		if err != nil {
			t.Fatal(err)
		}
		if err := l0.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		la, aInfo, seen := leadAndObserve(t, a, watcher, fencelock.WithLabel("a"), fencelock.WithMetadata([]byte("v1")))
		time.Sleep(2 * time.Second)
		// The store answers with the same lease at an older token and
		// value, then with nothing once the lease is released.
		older := aInfo
		older.Token--
		older.Metadata = []byte("v0")
		sb.mu.Lock()
		sb.old = &older
		sb.mu.Unlock()
		time.Sleep(2 * time.Second)
		sb.mu.Lock()
		sb.old = nil
		sb.mu.Unlock()
		if err := la.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		ls, _ := seen.leaders()
		checkOrdered(t, ls)
		if got, want := describe(ls), fmt.Sprintf("a(%d,\"v1\") → none", la.Token()); got != want {
			t.Errorf("observed %s; want %s: an older state of the leader is never delivered after a newer one", got, want)
		}
	})
}

func TestElectOnNewLeaderReportsEveryLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		o := &fencelock.Options{TTL: 3 * time.Second}
		other := newClient(t, store.Backend(), o)
		lo, err := other.Acquire(t.Context(), "k", fencelock.WithLabel("other"))
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu  sync.Mutex
			got []recipe.Leader
		)
		c := newClient(t, store.Backend(), o)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- recipe.Elect(ctx, c, "k", "me", nil, func(ctx context.Context, l *fencelock.Lease) error {
				time.Sleep(2 * time.Second)
				return nil // one term of 2s, then campaign again
			}, &recipe.ElectOptions{OnNewLeader: func(l recipe.Leader) {
				mu.Lock()
				got = append(got, l)
				mu.Unlock()
			}})
		}()
		time.Sleep(1500 * time.Millisecond) // between the observer's reads, once a second
		if err := lo.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second) // me leads from 1.5s, ends its term at 3.5s, leads again
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Elect = %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		var ids []string
		for _, l := range got {
			if !l.Elected() {
				ids = append(ids, "none")
				continue
			}
			ids = append(ids, fmt.Sprintf("%s@%d", l.Identity, l.Token))
		}
		// Each term is a new lease, even of the same identity.
		if strings.Join(ids, " ") != "other@1 me@2 me@3" {
			t.Errorf("OnNewLeader saw %v; want other@1 me@2 me@3", ids)
		}
	})
}

func TestObserveEndsWhenClientCloses(t *testing.T) {
	c, err := fencelock.New(memory.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := recipe.Observe(context.Background(), c, "k")
	if err != nil {
		t.Fatal(err)
	}
	<-ch // the first state
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if l, ok := <-ch; ok {
		t.Fatalf("delivered %+v after Close; want the channel closed", l)
	}
	if _, err := recipe.Observe(context.Background(), c, "k"); !errors.Is(err, fencelock.ErrClosed) {
		t.Fatalf("Observe after Close = %v; want ErrClosed", err)
	}
}

// renewFails is a backend whose renewals and acquires fail transiently,
// once on is set, while its releases reach the store: the lease ends by
// local validity, and the engine's clean-up then frees the key at once.
type renewFails struct {
	*fakebackend.Fake
	on atomic.Bool
}

func newRenewFails(b driver.Backend) *renewFails {
	rf := &renewFails{Fake: fakebackend.New(b, fakebackend.Plain)}
	drop := func(what string) fakebackend.Fault {
		return func(context.Context) error {
			if rf.on.Load() {
				return errors.New(what + " dropped")
			}
			return nil
		}
	}
	rf.Set(fakebackend.Acquire, drop("acquire"))
	rf.Set(fakebackend.Renew, drop("renewal"))
	return rf
}

// TestElectNextLeaderStartsAfterOldContextCancelled: when a leader's lease
// ends by local validity and the engine's clean-up frees the key at once,
// the next leader's callback starts in the same instant; by then the old
// callback's context must already be cancelled (not by a goroutine that
// has yet to run).
func TestElectNextLeaderStartsAfterOldContextCancelled(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			store := memory.NewStore()
			log := newTermLog()
			o := &fencelock.Options{TTL: 3 * time.Second}
			rf := newRenewFails(store.Backend())
			a := newClient(t, rf.Backend(), o)
			b := newClient(t, store.Backend(), o)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 2)
			go func() { done <- recipe.Elect(ctx, a, "k", "a", nil, log.fn("a"), nil) }()
			synctest.Wait()
			go func() { done <- recipe.Elect(ctx, b, "k", "b", nil, log.fn("b"), nil) }()
			synctest.Wait()
			rf.on.Store(true)
			time.Sleep(3 * time.Second)
			synctest.Wait()
			terms := log.snapshot()
			if len(terms) < 2 || terms[1].who != "b" || terms[1].began != 2700*time.Millisecond {
				t.Fatalf("terms %+v; want b leading at 2.7s, when a's lease ended and was released", terms)
			}
			log.checkNoOverlap(t)
			cancel()
			<-done
			<-done
		})
	}
}

// TestDoNextHolderStartsAfterOldContextCancelled: Do's callback context
// is cancelled before the engine gives the key up, so the next holder's
// Do never starts while the lost holder's callback context is live (the
// same gap Elect had: a cancellation run from context.AfterFunc can come
// after the key was freed).
func TestDoNextHolderStartsAfterOldContextCancelled(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			store := memory.NewStore()
			log := newTermLog()
			o := &fencelock.Options{TTL: 3 * time.Second}
			rf := newRenewFails(store.Backend())
			a := newClient(t, rf.Backend(), o)
			b := newClient(t, store.Backend(), o)
			done := make(chan error, 2)
			go func() { done <- a.Do(t.Context(), "k", log.fn("a")) }()
			synctest.Wait()
			go func() { done <- b.Do(t.Context(), "k", log.fn("b")) }()
			synctest.Wait()
			rf.on.Store(true)
			if err := <-done; !errors.Is(err, fencelock.ErrLeaseLost) {
				t.Fatalf("a's Do = %v; want its lease lost", err)
			}
			time.Sleep(3 * time.Second) // a's record expires; b's polling takes the key
			synctest.Wait()
			if terms := log.snapshot(); len(terms) < 2 || terms[1].who != "b" {
				t.Fatalf("terms %+v; want b's Do running after a lost the key", terms)
			}
			log.checkNoOverlap(t)
		})
	}
}
