package recipe_test

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
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

// multiOpts: a TTL long enough that a key freed by its expiry is told
// apart from one released.
func multiOpts() *fencelock.Options {
	return &fencelock.Options{TTL: 20 * time.Second, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}
}

// assertFree fails t unless every key is free in c's store.
func assertFree(t *testing.T, c *fencelock.Client, keys ...string) {
	t.Helper()
	for _, key := range keys {
		info, err := c.Inspect(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if info.Locked() {
			t.Errorf("%s still held by %s after the call returned without a grant; want no partial grant left behind", key, info.Owner)
		}
	}
}

func TestAcquireAllTakesKeysInCanonicalOrder(t *testing.T) {
	c := newClient(t, memory.NewStore().Backend(), multiOpts())
	var order []string
	defer recipe.SetMultiTestHookTaken(func(taken []*fencelock.Lease) { order = append(order, taken[len(taken)-1].Key()) })()
	g, err := recipe.AcquireAll(t.Context(), c, []string{"c", "a", "b", "a"}, fencelock.WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release(t.Context())
	if want := []string{"a", "b", "c"}; !slices.Equal(order, want) || !slices.Equal(g.Keys(), want) {
		t.Errorf("took %v, grant keys %v; want both the canonical order %v (sorted, duplicates removed)", order, g.Keys(), want)
	}
	for _, l := range g.Leases() {
		if g.Lease(l.Key()) != l || g.Token(l.Key()) != l.Token() || l.Token() == 0 {
			t.Errorf("Lease/Token(%q) do not name the grant's own lease (token %d)", l.Key(), l.Token())
		}
	}
	if g.Lease("d") != nil || g.Token("d") != 0 {
		t.Error("Lease/Token of a key not in the grant: want nil and 0")
	}
}

// Callers naming overlapping sets in opposite orders never deadlock (every
// call gets its keys well within its wait bound) and never hold one key
// at once.
func TestAcquireAllOverlappingSetsNeverDeadlock(t *testing.T) {
	store := memory.NewStore()
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	const callers, rounds = 6, 15
	var (
		mu     sync.Mutex
		holder = map[string]int{}
		wg     sync.WaitGroup
	)
	for i := range callers {
		c := newClient(t, store.Backend(), multiOpts())
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 1))
			for range rounds {
				set := slices.Clone(keys)
				r.Shuffle(len(set), func(a, b int) { set[a], set[b] = set[b], set[a] })
				set = set[:2+r.IntN(3)]
				g, err := recipe.AcquireAll(t.Context(), c, set, fencelock.WithWait(10*time.Second))
				if err != nil {
					t.Errorf("caller %d, keys %v: %v; want every key, in time (a deadlock ends at the wait bound)", i, set, err)
					return
				}
				mu.Lock()
				for _, k := range g.Keys() {
					if h, ok := holder[k]; ok {
						t.Errorf("caller %d granted %s while caller %d holds it", i, k, h)
					}
					holder[k] = i
				}
				mu.Unlock()
				mu.Lock()
				for _, k := range g.Keys() {
					delete(holder, k)
				}
				mu.Unlock()
				if err := g.Release(t.Context()); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestTryAcquireAllRefusedLeavesNothing(t *testing.T) {
	store := memory.NewStore()
	a := newClient(t, store.Backend(), multiOpts())
	b := newClient(t, store.Backend(), multiOpts())
	l, err := b.Acquire(t.Context(), "m")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(t.Context())
	_, err = recipe.TryAcquireAll(t.Context(), a, []string{"z", "a", "m"}, fencelock.WithMinHold(time.Minute))
	var he *fencelock.HeldError
	if !errors.Is(err, fencelock.ErrNotAcquired) || !errors.As(err, &he) || he.Holder.Key != "m" {
		t.Fatalf("TryAcquireAll with m held = %v; want a *HeldError naming m", err)
	}
	assertFree(t, a, "a", "z") // "a" was taken before "m" was refused; its minimum hold is not kept
}

func TestAcquireAllWaitBoundLeavesNothing(t *testing.T) {
	store := memory.NewStore()
	a := newClient(t, store.Backend(), multiOpts())
	b := newClient(t, store.Backend(), multiOpts())
	l, err := b.Acquire(t.Context(), "c")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(t.Context())
	took := make(chan struct{}, 4)
	defer recipe.SetMultiTestHookTaken(func([]*fencelock.Lease) { took <- struct{}{} })()
	_, err = recipe.AcquireAll(t.Context(), a, []string{"a", "b", "c"}, fencelock.WithWait(200*time.Millisecond))
	if !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("AcquireAll past its wait bound = %v; want ErrNotAcquired", err)
	}
	if len(took) != 2 {
		t.Fatalf("the call took %d keys before it waited; want a and b", len(took))
	}
	assertFree(t, a, "a", "b")

	// A cancelled context is the same.
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-took; <-took; cancel() }()
	if _, err := recipe.AcquireAll(ctx, a, []string{"a", "b", "c"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireAll cancelled while waiting for c = %v; want context.Canceled", err)
	}
	assertFree(t, a, "a", "b")
}

func TestMultiGrantLostTogether(t *testing.T) {
	store := memory.NewStore()
	a := newClient(t, store.Backend(), multiOpts())
	b := newClient(t, store.Backend(), multiOpts())
	g, err := recipe.AcquireAll(t.Context(), a, []string{"x", "y", "z"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ForceRelease(t.Context(), "y"); err != nil {
		t.Fatal(err)
	}
	<-g.Done()
	if !errors.Is(g.Err(), fencelock.ErrLeaseLost) || !errors.Is(context.Cause(g.Context()), fencelock.ErrLeaseLost) {
		t.Fatalf("grant after y was lost: Err %v, cause %v; want ErrLeaseLost", g.Err(), context.Cause(g.Context()))
	}
	for _, l := range g.Leases() {
		select { // every lease ends with the grant
		case <-l.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("lease on %s still held 10s after the grant was lost; want every lease released with it", l.Key())
		}
	}
	// The others were released, not left to expire: they are free far
	// sooner than the 20s TTL.
	g2, err := recipe.AcquireAll(t.Context(), b, []string{"x", "y", "z"}, fencelock.WithWait(5*time.Second))
	if err != nil {
		t.Fatalf("keys of a lost grant not freed: %v", err)
	}
	if err := g2.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := g.Release(t.Context()); !errors.Is(err, fencelock.ErrNotHeld) {
		t.Errorf("Release of a lost grant = %v; want ErrNotHeld", err)
	}
}

func TestMultiGrantReleaseFreesEveryKey(t *testing.T) {
	c := newClient(t, memory.NewStore().Backend(), multiOpts())
	g, err := recipe.TryAcquireAll(t.Context(), c, []string{"p", "q"}, fencelock.WithMinHold(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	<-g.Done()
	assertFree(t, c, "p", "q")
	if err := g.Release(t.Context()); !errors.Is(err, fencelock.ErrNotHeld) {
		t.Errorf("second Release = %v; want ErrNotHeld", err)
	}
}

func TestAcquireAllRefusesBadInputStoringNothing(t *testing.T) {
	c := newClient(t, memory.NewStore().Backend(), multiOpts())
	many := make([]string, recipe.MaxKeys+1)
	for i := range many {
		many[i] = fmt.Sprint("k", i)
	}
	for _, tc := range []struct {
		keys []string
		want error
	}{
		{nil, fencelock.ErrInvalidOption},
		{many, fencelock.ErrInvalidOption},
		{[]string{"ok", ""}, fencelock.ErrInvalidKey},
	} {
		if _, err := recipe.AcquireAll(t.Context(), c, tc.keys); !errors.Is(err, tc.want) {
			t.Errorf("AcquireAll(%d keys) = %v; want %v", len(tc.keys), err, tc.want)
		}
	}
	if _, err := recipe.TryAcquireAll(t.Context(), nil, []string{"a"}); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Errorf("TryAcquireAll with a nil Client = %v; want ErrInvalidOption", err)
	}
	assertFree(t, c, "ok", "k0")
}
