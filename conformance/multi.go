package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
)

const multiKeyRule = "recipe.AcquireAll and TryAcquireAll, generic over every backend (one lease per key, taken in canonical order), through the store: overlapping sets never deadlock nor hold a key twice, a crash frees every key, no partial grant is handed out or left behind, a lost key ends the grant and frees the others (subtests, each with its own rule)."

var multiCases = []testCase{
	{"OverlappingSetsNeverDeadlock", "many clients taking overlapping sets of keys, named in random orders, all get their keys within a bound far below a deadlock's (the wait bound), never hold one key at once, and each key's tokens increase across grants.", testMultiOverlap},
	{"CrashFreesEveryKey", "a holder of several keys that dies without releasing frees every one within the TTL the store granted plus slack: a waiting AcquireAll gets them all, each with a token above the dead holder's.", testMultiCrash},
	{"NoPartialGrant", "a TryAcquireAll refused on its last key, an AcquireAll past its WithWait bound and one whose context is cancelled while it waits all return without a grant and leave none of their keys held (even with a minimum hold).", testMultiPartial},
	{"LostTogether", "when one key of a grant is lost (force-released), the grant's context ends with ErrLeaseLost within a renewal interval plus slack, and its other keys are released: another client takes them all at once.", testMultiLost},
}

func testMultiKey(t *testing.T, s *suite) { runCases(t, s, multiCases) }

func testMultiOverlap(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	keys := make([]string, 4)
	for i := range keys {
		keys[i] = s.key(t, fmt.Sprint("k", i))
	}
	const clients, rounds = 4, 6
	bound := 20 * s.h.TTL
	var (
		mu     sync.Mutex
		holder = map[string]int{}
		last   = map[string]fencelock.Token{}
		wg     sync.WaitGroup
	)
	for i := range clients {
		c := s.client(t)
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for range rounds {
				set := slices.Clone(keys)
				r.Shuffle(len(set), func(a, b int) { set[a], set[b] = set[b], set[a] })
				set = set[:2+r.IntN(len(set)-1)]
				g, err := recipe.AcquireAll(ctx, c, set, fencelock.WithWait(bound))
				if err != nil {
					t.Errorf("client %d, keys %v: %v; want them all within %v (a deadlock lasts until the bound)", i, set, err, bound)
					return
				}
				mu.Lock()
				for _, k := range g.Keys() {
					if h, ok := holder[k]; ok {
						t.Errorf("client %d granted %s while client %d holds it", i, k, h)
					}
					if tok := g.Token(k); tok <= last[k] {
						t.Errorf("client %d granted %s with token %d, not above the previous grant's %d", i, k, tok, last[k])
					}
					holder[k], last[k] = i, g.Token(k)
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond) // the work, long enough for sets to contend
				mu.Lock()
				for _, k := range g.Keys() {
					delete(holder, k)
				}
				mu.Unlock()
				if err := g.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, k := range keys {
		checkEmpty(t, ctx, s.client(t), k)
	}
}

func testMultiCrash(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	keys := []string{s.key(t, "a"), s.key(t, "b"), s.key(t, "c")}
	dead, cb := s.crashableClient(t, s.options())
	g, err := recipe.TryAcquireAll(ctx, dead, keys)
	if err != nil {
		t.Fatal(err)
	}
	live := s.client(t)
	if _, err := recipe.TryAcquireAll(ctx, live, keys[1:2]); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll of a held key = %v; want ErrNotAcquired", err)
	}
	cb.crash()
	crashed := time.Now()
	var bound time.Duration
	for _, k := range keys {
		bound = max(bound, s.expiryBound(cb.last(k), s.h.TTL))
	}
	actx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	g2, err := recipe.AcquireAll(actx, live, keys, s.patient())
	if err != nil {
		t.Fatalf("keys not all free within %v of the holder's crash (the granted TTL plus slack): %v", bound, err)
	}
	t.Logf("crashed holder's keys returned after %v (bound %v)", time.Since(crashed), bound)
	for _, k := range keys {
		if g2.Token(k) <= g.Token(k) {
			t.Errorf("%s: token %d after the crash, not above the dead holder's %d", k, g2.Token(k), g.Token(k))
		}
	}
	if err := g2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func testMultiPartial(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	a, b, z := s.key(t, "a"), s.key(t, "b"), s.key(t, "z") // z sorts last
	other := s.client(t)
	held, err := other.Acquire(ctx, z)
	if err != nil {
		t.Fatal(err)
	}
	c := s.client(t)
	free := func(when string) {
		t.Helper()
		for _, k := range []string{a, b} {
			info, err := c.Inspect(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if info.Locked() {
				t.Fatalf("%s: %s is held by %s; want no partial grant left behind", when, k, info.Owner)
			}
		}
	}
	hold := fencelock.WithMinHold(time.Minute) // far past the case: a record kept for it is plainly there
	if _, err := recipe.TryAcquireAll(ctx, c, []string{z, b, a}, hold); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("TryAcquireAll with %s held = %v; want ErrNotAcquired", z, err)
	}
	free("after a refused TryAcquireAll")
	if _, err := recipe.AcquireAll(ctx, c, []string{a, b, z}, hold, fencelock.WithWait(s.h.TTL/2)); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("AcquireAll past its wait bound = %v; want ErrNotAcquired", err)
	}
	free("after an AcquireAll past its WithWait bound")
	cctx, cancel := context.WithTimeout(ctx, s.h.TTL/2)
	defer cancel()
	if _, err := recipe.AcquireAll(cctx, c, []string{a, b, z}, hold); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireAll whose context ended = %v; want context.DeadlineExceeded", err)
	}
	free("after an AcquireAll whose context ended")
	mustRelease(t, held)
	g, err := recipe.TryAcquireAll(ctx, c, []string{a, b, z})
	if err != nil {
		t.Fatalf("TryAcquireAll once %s was released: %v (a call left a key behind)", z, err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func testMultiLost(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	requireForce(t, s.backend(t))
	keys := []string{s.key(t, "a"), s.key(t, "b"), s.key(t, "c")}
	c := s.client(t)
	g, err := recipe.TryAcquireAll(ctx, c, keys)
	if err != nil {
		t.Fatal(err)
	}
	admin := s.client(t)
	if _, err := admin.ForceRelease(ctx, keys[1]); err != nil {
		t.Fatal(err)
	}
	bound := c.Options().RenewInterval + s.h.Slack
	select {
	case <-g.Done():
	case <-time.After(bound):
		t.Fatalf("grant still held %v after one of its keys was force-released; want it lost within a renewal interval plus slack", bound)
	}
	if !errors.Is(g.Err(), fencelock.ErrLeaseLost) {
		t.Errorf("grant's Err = %v; want ErrLeaseLost", g.Err())
	}
	g2, err := recipe.AcquireAll(ctx, admin, keys, fencelock.WithWait(bound))
	if err != nil {
		t.Fatalf("the lost grant's other keys were not released: %v", err)
	}
	if err := g2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
