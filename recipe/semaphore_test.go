package recipe_test

import (
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

func semaphore(t *testing.T, c *fencelock.Client, key string, n int) *recipe.Semaphore {
	t.Helper()
	s, err := recipe.NewSemaphore(c, key, n)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// holders returns the semaphore's holders, failing the test on an error.
func holders(t *testing.T, s *recipe.Semaphore) []recipe.Permit {
	t.Helper()
	hs, err := s.Holders(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// semBackends are the two ways a Semaphore waits: racing the engine's
// waits on every slot (memory notifies waiters), and polling every slot
// (a backend that can neither queue nor notify).
var semBackends = []struct {
	name string
	wrap func(*memory.Backend) driver.Backend
}{
	{"notify", func(b *memory.Backend) driver.Backend { return b }},
	{"poll", func(b *memory.Backend) driver.Backend { return plain(b) }},
}

func TestSemaphoreNeverMoreThanNHolders(t *testing.T) {
	for _, sb := range semBackends {
		t.Run(sb.name, func(t *testing.T) { testSemaphoreNeverMoreThanN(t, sb.wrap) })
	}
}

func testSemaphoreNeverMoreThanN(t *testing.T, wrap func(*memory.Backend) driver.Backend) {
	synctest.Test(t, func(t *testing.T) {
		const n, clients, workers, rounds = 3, 4, 4, 15
		store := memory.NewStore()
		var (
			inside, most atomic.Int64
			mu           sync.Mutex
			slots        = map[string]string{} // slot key → owner holding it, per this test's view
			wg           sync.WaitGroup
		)
		for ci := range clients {
			c := newClient(t, wrap(store.Backend()), &fencelock.Options{TTL: time.Second, Owner: fmt.Sprint("c", ci)})
			s := semaphore(t, c, "pool", n)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range rounds {
						l, err := s.Acquire(t.Context())
						if err != nil {
							t.Error(err)
							return
						}
						k := inside.Add(1)
						for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
						}
						mu.Lock()
						if other, ok := slots[l.Key()]; ok {
							t.Errorf("slot %s granted to %s while %s holds it", l.Key(), l.Owner(), other)
						}
						slots[l.Key()] = l.Owner()
						mu.Unlock()
						time.Sleep(10 * time.Millisecond) // the work
						mu.Lock()
						delete(slots, l.Key())
						mu.Unlock()
						inside.Add(-1)
						if err := l.Release(t.Context()); err != nil {
							t.Error(err)
						}
					}
				}()
			}
		}
		wg.Wait()
		if got := most.Load(); got > n {
			t.Fatalf("%d holders at once; want at most %d", got, n)
		} else if got < n {
			t.Errorf("at most %d holders at once with %d workers; want the semaphore used to its %d permits", got, clients*workers, n)
		}
		if infos, _ := store.Backend().List(context.Background(), ""); len(infos) != 0 {
			t.Errorf("store holds %v after every permit was released", infos)
		}
	})
}

// A waiter on a full semaphore whose every slot frees at once may win
// several of its waits: it keeps one permit and releases the others, and
// a wait cancelled by its caller leaves nothing behind.
func TestSemaphoreCancelledWaitsLeaveNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 3
		store := memory.NewStore()
		a := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Second, Owner: "a"})
		b := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Second, Owner: "b"})
		sa, sb := semaphore(t, a, "pool", n), semaphore(t, b, "pool", n)
		var held []*fencelock.Lease
		for range n {
			l, err := sa.TryAcquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, l)
		}
		if _, err := sb.TryAcquire(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatalf("TryAcquire on a full semaphore: %v; want ErrNotAcquired", err)
		}

		// A cancelled wait.
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		_, err := sb.Acquire(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire with a deadline on a full semaphore: %v; want DeadlineExceeded", err)
		}
		if hs := holders(t, sa); len(hs) != n {
			t.Fatalf("after a cancelled wait: %d holders %v; want the %d of a", len(hs), hs, n)
		}
		// WithWait's bound: ErrNotAcquired, nothing left.
		if _, err := sb.Acquire(t.Context(), fencelock.WithWait(time.Second)); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatalf("Acquire with WithWait on a full semaphore: %v; want ErrNotAcquired", err)
		}

		// Every slot frees at once while b waits on all of them.
		got := make(chan *fencelock.Lease, 1)
		go func() {
			l, err := sb.Acquire(t.Context())
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		synctest.Wait() // b waits on every slot
		for _, l := range held {
			if _, err := store.Backend().ForceRelease(t.Context(), l.Key()); err != nil {
				t.Fatal(err)
			}
		}
		l := <-got
		synctest.Wait() // the losing waits have ended
		hs := holders(t, sa)
		if len(hs) != 1 || hs[0].Owner != l.Owner() {
			t.Fatalf("after b's Acquire returned one permit: holders %v; want only b's permit %s", hs, l.Key())
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if hs := holders(t, sa); len(hs) != 0 {
			t.Fatalf("holders %v after b released; want none", hs)
		}
	})
}

func TestSemaphorePermitsMismatchRefused(t *testing.T) {
	store := memory.NewStore()
	a := newClient(t, store.Backend(), &fencelock.Options{Owner: "a"})
	b := newClient(t, store.Backend(), &fencelock.Options{Owner: "b"})
	la, err := semaphore(t, a, "pool", 2).TryAcquire(t.Context(), fencelock.WithMetadata([]byte("a's")))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 3} {
		sb := semaphore(t, b, "pool", n)
		for name, acquire := range map[string]func(context.Context, ...fencelock.AcquireOption) (*fencelock.Lease, error){
			"TryAcquire": sb.TryAcquire, "Acquire": sb.Acquire,
		} {
			// Bounded: a caller that ignored the mismatch might wait
			// for a slot a holds.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			_, err := acquire(ctx)
			cancel()
			var me *recipe.PermitsMismatchError
			if !errors.Is(err, recipe.ErrPermitsMismatch) || !errors.As(err, &me) || me.Held != 2 || me.Permits != n || me.Slot != la.Key() {
				t.Errorf("%s with %d permits while a holds one of 2: %v; want a *PermitsMismatchError (held 2, slot %s)", name, n, err, la.Key())
			}
		}
	}
	hs := holders(t, semaphore(t, b, "pool", 2))
	if len(hs) != 1 || hs[0].Owner != la.Owner() {
		t.Fatalf("holders %v; want only a's permit: a refused caller must leave nothing", hs)
	}
	if hs[0].Permits != 2 || string(hs[0].Metadata) != "a's" {
		t.Errorf("holder %+v; want Permits 2 and a's own metadata", hs[0])
	}
	// The same number is fine.
	lb, err := semaphore(t, b, "pool", 2).TryAcquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if lb.Key() == la.Key() {
		t.Fatalf("two permits on one slot %s", lb.Key())
	}
}

// A holder that stops renewing (a crash, a partition) gives its permit
// back within the TTL.
func TestSemaphoreCrashedHolderFreedWithinTTL(t *testing.T) {
	for _, sb := range semBackends {
		t.Run(sb.name, func(t *testing.T) { testSemaphoreCrash(t, sb.wrap) })
	}
}

func testSemaphoreCrash(t *testing.T, wrap func(*memory.Backend) driver.Backend) {
	synctest.Test(t, func(t *testing.T) {
		const n, ttl = 2, 3 * time.Second
		store := memory.NewStore()
		deadB := store.Backend()
		dead := newClient(t, deadB, &fencelock.Options{TTL: ttl, Owner: "dead"})
		live := newClient(t, wrap(store.Backend()), &fencelock.Options{TTL: ttl, Owner: "live"})
		sd, sl := semaphore(t, dead, "pool", n), semaphore(t, live, "pool", n)
		start := time.Now()
		for range n {
			if _, err := sd.TryAcquire(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		deadB.SetUnreachable(true) // no renewal, no release reaches the store
		l, err := sl.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got < ttl || got > ttl+100*time.Millisecond {
			t.Errorf("permit acquired %v after the holder stopped; want within the TTL (%v) and not before it", got, ttl)
		}
		if !strings.HasPrefix(l.Key(), "pool"+recipe.PermitSeparator) {
			t.Errorf("permit key %q", l.Key())
		}
	})
}

func TestSemaphoreHoldersListsEveryHolder(t *testing.T) {
	store := memory.NewStore()
	const n = 4
	var want []*fencelock.Lease
	for i := range n - 1 {
		c := newClient(t, store.Backend(), nil)
		l, err := semaphore(t, c, "pool", n).TryAcquire(t.Context(), fencelock.WithLabel(fmt.Sprint("web-", i)), fencelock.WithMetadata([]byte(fmt.Sprint("addr-", i))))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, l)
	}
	// Neither another semaphore below this one's key nor a plain lock
	// beside it is listed.
	other := newClient(t, store.Backend(), nil)
	if _, err := semaphore(t, other, "pool"+recipe.PermitSeparator+"1", 2).TryAcquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(t.Context(), "pool/x"); err != nil {
		t.Fatal(err)
	}
	hs := holders(t, semaphore(t, other, "pool", n))
	if len(hs) != len(want) {
		t.Fatalf("Holders = %v; want %d holders", hs, len(want))
	}
	for _, l := range want {
		found := false
		for i, h := range hs {
			if h.Key != l.Key() {
				continue
			}
			found = true
			if h.Owner != l.Owner() || h.Token != l.Token() || h.Label() != l.Label() || h.Permits != n ||
				h.Key != "pool"+recipe.PermitSeparator+fmt.Sprint(h.Slot) || (i > 0 && hs[i-1].Slot >= h.Slot) {
				t.Errorf("holder %+v; want owner %s, token %d, label %s, %d permits, slot matching its key, sorted by slot", h, l.Owner(), l.Token(), l.Label(), n)
			}
			if string(h.Metadata) != strings.Replace(l.Label(), "web", "addr", 1) {
				t.Errorf("holder %s metadata %q; want the holder's own payload", h.Key, h.Metadata)
			}
		}
		if !found {
			t.Errorf("holder of %s missing from %v", l.Key(), hs)
		}
	}
}

func TestSemaphoreBadInput(t *testing.T) {
	c := newClient(t, memory.New(), nil)
	for _, n := range []int{0, -1, recipe.MaxPermits + 1} {
		if _, err := recipe.NewSemaphore(c, "k", n); !errors.Is(err, fencelock.ErrInvalidOption) {
			t.Errorf("Semaphore(k, %d): %v; want ErrInvalidOption", n, err)
		}
	}
	for _, key := range []string{"", "a\x00b", strings.Repeat("k", driver.MaxKeyLen-len(recipe.PermitSeparator))} {
		if _, err := recipe.NewSemaphore(c, key, 10); !errors.Is(err, fencelock.ErrInvalidKey) {
			t.Errorf("Semaphore(%.20q…, 10): %v; want ErrInvalidKey", key, err)
		}
	}
	// The longest key that fits: its last slot key is MaxKeyLen bytes.
	key := strings.Repeat("k", driver.MaxKeyLen-len(recipe.PermitSeparator)-1)
	s, err := recipe.NewSemaphore(c, key, 10)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.TryAcquire(t.Context(), fencelock.WithMetadata(make([]byte, driver.MaxMetadataLen)))
	if !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Errorf("TryAcquire with a full-size payload (no room for the header): %v, %v; want ErrInvalidOption", l, err)
	}
	if l, err := s.TryAcquire(t.Context()); err != nil || len(l.Key()) > driver.MaxKeyLen {
		t.Errorf("TryAcquire on the longest key: %v, %v", l, err)
	}
}

// hookAcquire returns b (its optional capabilities hidden) running
// before ahead of every Acquire.
func hookAcquire(b driver.Backend, before func(key string)) driver.Backend {
	f := fakebackend.New(b, fakebackend.Plain)
	f.OnAcquire(func(ctx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
		before(r.Key)
		return next(ctx, r)
	})
	return f.Backend()
}

// A caller with another N that takes a permit between a TryAcquire's
// first check and its grant (and so passes its own check after its grant) is caught by the check after the grant: the
// permit just taken is released and the mismatch reported.
func TestSemaphorePermitsMismatchCaughtAfterGrant(t *testing.T) {
	store := memory.NewStore()
	other := newClient(t, store.Backend(), &fencelock.Options{Owner: "other"})
	var once sync.Once
	var intruder *fencelock.Lease
	hook := func(string) {
		once.Do(func() {
			l, err := semaphore(t, other, "pool", 5).TryAcquire(context.Background())
			if err != nil {
				t.Error(err)
			}
			intruder = l
		})
	}
	c := newClient(t, hookAcquire(store.Backend(), hook), &fencelock.Options{Owner: "c"})
	_, err := semaphore(t, c, "pool", 2).TryAcquire(t.Context())
	if !errors.Is(err, recipe.ErrPermitsMismatch) {
		t.Fatalf("TryAcquire while a caller with 5 permits took one just before the grant: %v; want ErrPermitsMismatch", err)
	}
	hs := holders(t, semaphore(t, other, "pool", 5))
	if len(hs) != 1 || intruder == nil || hs[0].Owner != intruder.Owner() {
		t.Fatalf("holders %v; want only the other caller's permit: the refused permit must be released", hs)
	}
}

// Client.Close ends a Semaphore.Acquire that is waiting, both ways, with
// ErrClosed, and nothing is left behind.
func TestSemaphoreCloseEndsWait(t *testing.T) {
	for _, sb := range semBackends {
		t.Run(sb.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				a := newClient(t, store.Backend(), nil)
				if _, err := semaphore(t, a, "pool", 1).TryAcquire(t.Context()); err != nil {
					t.Fatal(err)
				}
				b, err := fencelock.New(sb.wrap(store.Backend()), nil)
				if err != nil {
					t.Fatal(err)
				}
				errc := make(chan error, 1)
				go func() {
					_, err := semaphore(t, b, "pool", 1).Acquire(t.Context())
					errc <- err
				}()
				synctest.Wait()
				b.Close()
				if err := <-errc; !errors.Is(err, fencelock.ErrClosed) {
					t.Errorf("waiting Acquire after Close: %v; want ErrClosed", err)
				}
				if hs := holders(t, semaphore(t, a, "pool", 1)); len(hs) != 1 {
					t.Errorf("holders %v; want only a's", hs)
				}
			})
		})
	}
}
