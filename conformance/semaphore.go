package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
)

// testSemaphore checks recipe.Semaphore, which is generic (each permit
// a lease on a slot key), through the store: its subtests each carry
// their own rule.
func testSemaphore(t *testing.T, s *suite) {
	runCases(t, s, semaphoreCases)
}

var semaphoreCases = []testCase{
	{"NeverMoreThanN", "many clients, each with several goroutines, taking and releasing permits of one semaphore of N: never more than N hold a permit at once, never two hold one slot, and every permit's token is above the slot's previous ones.", testSemaphoreMutex},
	{"CancelledWaitLeavesNothing", "an Acquire on a full semaphore whose context ends returns the context's error and leaves no record or queue entry on any slot: once the holders release, N new contenders each get a permit at once.", testSemaphoreCancelled},
	{"PermitsMismatchRefused", "a caller whose number of permits differs from the one a holder recorded is refused with ErrPermitsMismatch, and leaves nothing behind.", testSemaphoreMismatch},
	{"HoldersListEveryHolder", "Semaphore.Holders reports every held permit, from every client, with its owner, token, slot, number of permits and the holder's own metadata.", testSemaphoreHolders},
	{"CrashedHolderFreedWithinTTL", "permits whose holder died without releasing return within the TTL the store granted plus slack: a waiter on the full semaphore gets one.", testSemaphoreCrash},
}

func testSemaphoreMutex(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "sem")
	const n, clients, workers, rounds = 3, 4, 2, 6
	var (
		inside, most atomic.Int64
		mu           sync.Mutex
		slots        = map[string]fencelock.Token{} // slot key → token of its current holder
		last         = map[string]fencelock.Token{} // slot key → highest token seen
		wg           sync.WaitGroup
	)
	for range clients {
		sem, err := recipe.NewSemaphore(s.client(t), key, n)
		if err != nil {
			t.Fatal(err)
		}
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l, err := sem.Acquire(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					select {
					case <-l.Done():
						// Its slot may be another's by now: the
						// bookkeeping below would call that two
						// holders.
						t.Errorf("permit on %s (token %d) handed out with its lease already ended: %v", l.Key(), l.Token(), l.Err())
					default:
					}
					k := inside.Add(1)
					for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
					}
					mu.Lock()
					if tok, ok := slots[l.Key()]; ok {
						t.Errorf("slot %s granted (token %d) while another holds it (token %d)", l.Key(), l.Token(), tok)
					}
					if l.Token() <= last[l.Key()] {
						t.Errorf("slot %s granted token %d, not above its previous %d", l.Key(), l.Token(), last[l.Key()])
					}
					slots[l.Key()], last[l.Key()] = l.Token(), l.Token()
					mu.Unlock()
					time.Sleep(5 * time.Millisecond) // the work
					mu.Lock()
					delete(slots, l.Key())
					mu.Unlock()
					inside.Add(-1)
					if err := l.Release(ctx); err != nil {
						t.Errorf("Release(%q): %v", l.Key(), err) // not mustRelease: not the test's goroutine
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if got := most.Load(); got > n {
		t.Errorf("%d permits held at once; want at most %d", got, n)
	}
	t.Logf("%d clients × %d goroutines × %d rounds: at most %d of %d permits held at once", clients, workers, rounds, most.Load(), n)
	checkEmpty(t, ctx, s.client(t), semPrefix(key))
}

func testSemaphoreCancelled(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "sem")
	const n = 3
	holder, waiter, next := s.client(t), s.client(t), s.client(t)
	sh, _ := recipe.NewSemaphore(holder, key, n)
	sw, _ := recipe.NewSemaphore(waiter, key, n)
	sn, err := recipe.NewSemaphore(next, key, n)
	if err != nil {
		t.Fatal(err)
	}
	var held []*fencelock.Lease
	for range n {
		l, err := sh.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	if _, err := sw.TryAcquire(ctx); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a full semaphore = %v; want ErrNotAcquired", err)
	}
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wctx, cancel := context.WithTimeout(ctx, time.Duration(100+100*i)*time.Millisecond)
			defer cancel()
			if _, err := sw.Acquire(wctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Acquire with an expiring context on a full semaphore = %v; want context.DeadlineExceeded", err)
			}
		}()
	}
	wg.Wait()
	if hs, err := sn.Holders(ctx); err != nil || len(hs) != n {
		t.Fatalf("Holders after the cancelled waits = %v, %v; want the holder's %d permits", hs, err, n)
	}
	for _, l := range held {
		mustRelease(t, l)
	}
	// Nothing left behind: N new contenders each get a permit at once.
	var got []*fencelock.Lease
	for i := range n {
		l, err := sn.TryAcquire(ctx)
		if err != nil {
			t.Fatalf("TryAcquire %d of %d after the waiters gave up: %v (a cancelled wait left a record or queue entry behind)", i+1, n, err)
		}
		got = append(got, l)
	}
	for _, l := range got {
		mustRelease(t, l)
	}
	if h := waiter.Holding(); len(h) != 0 {
		t.Errorf("waiter's Holding() = %v after its waits were cancelled", h)
	}
	checkEmpty(t, ctx, next, semPrefix(key))
}

func testSemaphoreMismatch(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "sem")
	a, b := s.client(t), s.client(t)
	sa, err := recipe.NewSemaphore(a, key, 2)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sa.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := recipe.NewSemaphore(b, key, 3)
	if _, err := sb.TryAcquire(ctx); !errors.Is(err, recipe.ErrPermitsMismatch) {
		t.Errorf("TryAcquire with 3 permits while a holder uses 2 = %v; want ErrPermitsMismatch", err)
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := sb.Acquire(actx); !errors.Is(err, recipe.ErrPermitsMismatch) {
		t.Errorf("Acquire with 3 permits while a holder uses 2 = %v; want ErrPermitsMismatch", err)
	}
	hs, err := sa.Holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || hs[0].Owner != l.Owner() {
		t.Errorf("Holders = %v; want only the first holder's permit", hs)
	}
	mustRelease(t, l)
}

func testSemaphoreHolders(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "sem")
	const n = 3
	var want []*fencelock.Lease
	for i := range n {
		sem, err := recipe.NewSemaphore(s.client(t), key, n)
		if err != nil {
			t.Fatal(err)
		}
		l, err := sem.TryAcquire(ctx, fencelock.WithMetadata(fmt.Appendf(nil, "holder-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, l)
	}
	sem, _ := recipe.NewSemaphore(s.client(t), key, n)
	hs, err := sem.Holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != n {
		t.Fatalf("Holders = %v; want %d holders", hs, n)
	}
	for i, l := range want {
		found := false
		for _, h := range hs {
			if h.Key != l.Key() {
				continue
			}
			found = true
			if h.Owner != l.Owner() || h.Token != l.Token() || h.Permits != n || semSlot(sem, h.Slot) != h.Key || string(h.Metadata) != fmt.Sprintf("holder-%d", i) {
				t.Errorf("holder %+v; want owner %s, token %d, %d permits, slot matching its key, metadata holder-%d", h, l.Owner(), l.Token(), n, i)
			}
		}
		if !found {
			t.Errorf("Holders = %v; missing %s", hs, l.Key())
		}
	}
	for _, l := range want {
		mustRelease(t, l)
	}
	if hs, err := sem.Holders(ctx); err != nil || len(hs) != 0 {
		t.Errorf("Holders after release = %v, %v; want none", hs, err)
	}
}

func testSemaphoreCrash(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "sem")
	const n = 2
	b, cb := s.crashable(t)
	dead, err := fencelock.New(b, s.options())
	if err != nil {
		b.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { dead.Close() })
	sd, _ := recipe.NewSemaphore(dead, key, n)
	for range n {
		if _, err := sd.TryAcquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sl, err := recipe.NewSemaphore(s.client(t), key, n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sl.TryAcquire(ctx); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a full semaphore = %v; want ErrNotAcquired", err)
	}
	cb.crash()
	crashed := time.Now()
	var bound time.Duration
	for i := range n {
		bound = max(bound, s.expiryBound(cb.last(semSlot(sd, i)), s.h.TTL))
	}
	actx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	l, err := sl.Acquire(actx, s.patient())
	if err != nil {
		t.Fatalf("no permit within %v of its holder's crash (the granted TTL plus slack): %v", bound, err)
	}
	t.Logf("crashed holder's permit returned after %v (bound %v)", time.Since(crashed), bound)
	mustRelease(t, l)
}

// semPrefix is what every slot key of a semaphore on key starts with.
func semPrefix(key string) string {
	p, _ := recipe.Keys(key, 1)
	return p
}

// semSlot is the key of slot i of s (see recipe.Keys).
func semSlot(s *recipe.Semaphore, i int) string {
	_, slots := recipe.Keys(s.Key(), i+1)
	return slots[i]
}
