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

func rwlock(t *testing.T, c *fencelock.Client, key string, opts ...recipe.RWOption) *recipe.RWLock {
	t.Helper()
	rw, err := recipe.NewRWLock(c, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return rw
}

func rwHolders(t *testing.T, rw *recipe.RWLock) []recipe.RWHolder {
	t.Helper()
	hs, err := rw.Holders(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// rwState is a test's view of who holds a read-write lock, checked at
// every grant: no reader beside a writer, no two writers, a writer's
// token above every grant's before it, a reader's above the last writer's.
type rwState struct {
	mu              sync.Mutex
	readers, most   int
	writer          bool
	top, lastWriter fencelock.Token
	grants          int
}

func (s *rwState) enter(t *testing.T, g *recipe.RWGrant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.grants++
	tok := g.Token()
	if g.Shared() {
		if s.writer {
			t.Errorf("read grant (token %d) while a writer holds the lock", tok)
		}
		if tok <= s.lastWriter {
			t.Errorf("read grant with token %d, not above the last writer's %d", tok, s.lastWriter)
		}
		s.readers++
		s.most = max(s.most, s.readers)
	} else {
		if s.writer || s.readers > 0 {
			t.Errorf("write grant (token %d) while a writer (%v) or %d readers hold the lock", tok, s.writer, s.readers)
		}
		if tok <= s.top {
			t.Errorf("write grant with token %d, not above every earlier grant's (highest %d)", tok, s.top)
		}
		s.writer, s.lastWriter = true, tok
	}
	s.top = max(s.top, tok)
}

func (s *rwState) leave(g *recipe.RWGrant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.Shared() {
		s.readers--
	} else {
		s.writer = false
	}
}

func TestRWLockReadersShareWriterExcludes(t *testing.T) {
	for _, sb := range semBackends {
		t.Run(sb.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const clients, readers, rounds = 3, 3, 6
				store := memory.NewStore()
				var (
					st    rwState
					fence recipe.RWFence
					wg    sync.WaitGroup
				)
				work := func(rw *recipe.RWLock, write bool) {
					defer wg.Done()
					for range rounds {
						lock := rw.RLock
						if write {
							lock = rw.Lock
						}
						g, err := lock(t.Context())
						if err != nil {
							t.Error(err)
							return
						}
						st.enter(t, g)
						if err := fence.Admit("res", g); err != nil {
							t.Errorf("a live grant (shared %v) refused by the fence: %v", g.Shared(), err)
						}
						time.Sleep(10 * time.Millisecond) // the work
						st.leave(g)
						if err := g.Release(t.Context()); err != nil {
							t.Error(err)
						}
					}
				}
				for ci := range clients {
					c := newClient(t, sb.wrap(store.Backend()), &fencelock.Options{TTL: time.Second, Owner: fmt.Sprint("c", ci)})
					rw := rwlock(t, c, "catalog")
					for range readers {
						wg.Add(1)
						go work(rw, false)
					}
					wg.Add(1)
					go work(rw, true)
				}
				wg.Wait()
				if st.most < 2 {
					t.Errorf("at most %d readers at once with %d reading goroutines; want readers to share the lock", st.most, clients*readers)
				}
				if st.grants != clients*(readers+1)*rounds {
					t.Errorf("%d grants; want %d", st.grants, clients*(readers+1)*rounds)
				}
				if infos, _ := store.Backend().List(context.Background(), ""); len(infos) != 0 {
					t.Errorf("store holds %v after every grant was released", infos)
				}
			})
		})
	}
}

// A writer waiting for readers to drain holds the gate, and a writer
// waiting for the gate holds the intent: a stream of readers that keep
// the lock shared does not keep it out. Once the writer has asked, each
// reader gets at most two more read grants (one that had passed the
// intent or the gate before, one racing the writer's first attempt); a
// reader gives up after 50 rounds. Where store calls take 10ms, readers
// passing the gate keep it busy at the writer's attempts: on a polled
// backend, on one that notifies, on one whose Watch fails at run time,
// and with the writer polling while the readers' client is notified (a
// fleet halfway through a migration).
func TestRWLockWriterNotStarved(t *testing.T) {
	cases := []struct {
		name            string
		readers, writer func(*memory.Backend) driver.Backend
	}{
		{"poll-slow", slowPlain, slowPlain},
		{"notify-slow", slowNotify, slowNotify},
		{"watch-fails-slow", watchFails, watchFails},
		{"mixed-slow", slowNotify, slowPlain},
	}
	for _, sb := range semBackends {
		cases = append(cases, struct {
			name            string
			readers, writer func(*memory.Backend) driver.Backend
		}{sb.name, sb.wrap, sb.wrap})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Ten bubbles: the interleavings differ by the schedule
			// and the backoff's jitter.
			for range 10 {
				testRWWriterNotStarved(t, tc.readers, tc.writer)
			}
		})
	}
}

func testRWWriterNotStarved(t *testing.T, readers, writer func(*memory.Backend) driver.Backend) {
	synctest.Test(t, func(t *testing.T) {
		const nreaders, bound, afterBound = 6, 50, 2
		store := memory.NewStore()
		var (
			asked, wrote atomic.Bool
			wg           sync.WaitGroup
			rounds       atomic.Int64
			started      = make(chan struct{})
			once         sync.Once
		)
		for i := range nreaders {
			c := newClient(t, readers(store.Backend()), &fencelock.Options{TTL: time.Second, Owner: fmt.Sprint("r", i)})
			rw := rwlock(t, c, "catalog")
			wg.Go(func() {
				after := 0
				for n := 0; !wrote.Load(); n++ {
					if n == bound {
						t.Errorf("reader %d did %d rounds and the writer still had no grant: starved", i, bound)
						return
					}
					asking := asked.Load()
					g, err := rw.RLock(t.Context())
					if err != nil {
						t.Error(err)
						return
					}
					rounds.Add(1)
					if asking {
						if after++; after > afterBound && !wrote.Load() {
							t.Errorf("reader %d got read grant %d since the writer asked", i, after)
						}
					}
					if n == 3 {
						once.Do(func() { close(started) })
					}
					time.Sleep(time.Duration(5+2*i) * time.Millisecond)
					g.Release(t.Context())
				}
			})
		}
		<-started // the readers overlap
		w := newClient(t, writer(store.Backend()), &fencelock.Options{TTL: time.Second, Owner: "w"})
		asked.Store(true)
		g, err := rwlock(t, w, "catalog").Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		wrote.Store(true)
		t.Logf("writer got the lock after %d read grants", rounds.Load())
		g.Release(t.Context())
		wg.Wait()
	})
}

// slowPlain, slowNotify and watchFails are the memory backend with
// its store calls taking 10ms each, as a loaded store's round trips do
// (FerretDB): readers passing the gate keep it busy for a while at each
// entry, which a polling writer must not lose to. slowPlain polls,
// slowNotify keeps the memory backend's notifications, and watchFails
// is a Watcher in type whose Watch fails at every call (a file backend
// past the inotify limit), so the engine polls.
func slowPlain(b *memory.Backend) driver.Backend {
	return slowStore(b, fakebackend.Plain, 10*time.Millisecond).Backend()
}

func slowNotify(b *memory.Backend) driver.Backend {
	return slowStore(b, fakebackend.CapsOf(b), 10*time.Millisecond).Backend()
}

func watchFails(b *memory.Backend) driver.Backend {
	f := slowStore(b, fakebackend.Watcher, 10*time.Millisecond)
	f.OnWatch(func(context.Context, string, fakebackend.WatchFunc) (<-chan struct{}, error) {
		return nil, driver.ErrUnsupported
	})
	return f.Backend()
}

// A writer that gives up waiting for the gate (its context ends, its
// WithWait bound passes, its Client closes) leaves no intent behind; a
// writer waiting for the gate holds one.
func TestRWLockCancelledIntentLeavesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		inspectIntent := func() driver.Info {
			t.Helper()
			info, err := store.Backend().Inspect(context.Background(), "k"+recipe.RWSeparator+"w")
			if err != nil {
				t.Fatal(err)
			}
			return info
		}
		opts := func(owner string) *fencelock.Options { return &fencelock.Options{TTL: time.Second, Owner: owner} }
		w1, err := rwlock(t, newClient(t, plain(store.Backend()), opts("w1")), "k").Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		w2 := rwlock(t, newClient(t, plain(store.Backend()), opts("w2")), "k")
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		_, err = w2.Lock(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock until the context's deadline = %v; want DeadlineExceeded", err)
		}
		if info := inspectIntent(); info.Locked() {
			t.Fatalf("after a cancelled Lock the intent is held: %+v", info)
		}
		if _, err := w2.Lock(t.Context(), fencelock.WithWait(time.Second)); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatalf("Lock with WithWait(1s) while w1 writes = %v; want ErrNotAcquired", err)
		}
		if info := inspectIntent(); info.Locked() {
			t.Fatalf("after a bounded Lock the intent is held: %+v", info)
		}
		c3, err := fencelock.New(plain(store.Backend()), opts("w3"))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := rwlock(t, c3, "k").Lock(context.Background())
			done <- err
		}()
		time.Sleep(100 * time.Millisecond) // w3 polls the gate
		synctest.Wait()
		if info := inspectIntent(); !strings.HasPrefix(info.Owner, "w3") {
			t.Fatalf("w3 waits for the gate, the intent is %+v; want held by w3", info)
		}
		if _, err := rwlock(t, newClient(t, plain(store.Backend()), opts("r")), "k").TryRLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatalf("TryRLock while a writer waits for the gate = %v; want ErrNotAcquired", err)
		}
		c3.Close()
		if err := <-done; !errors.Is(err, fencelock.ErrClosed) {
			t.Errorf("Lock ended by Close = %v; want ErrClosed", err)
		}
		if info := inspectIntent(); info.Locked() {
			t.Fatalf("after Close the intent is held: %+v", info)
		}
		infos, err := store.Backend().List(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 {
			t.Errorf("the store holds %d records; want w1's gate only: %v", len(infos), infos)
		}
		if err := w1.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// A reader that paused (its process stopped: no renewal) after it got the
// gate and before it took a slot loses the gate; a writer enters, writes
// and leaves meanwhile. The reader must not then hold a read grant with
// the token of the gate it lost, below the writer's: it enters again.
func TestRWLockReaderPausedPastGateEntersAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		rb := store.Backend()
		rc := newClient(t, rb, &fencelock.Options{TTL: time.Second, Owner: "reader"})
		wc := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Second, Owner: "writer"})
		var (
			fence recipe.RWFence
			once  sync.Once
			wtok  fencelock.Token
			lost  fencelock.Token
		)
		defer recipe.SetRWTestHookEntered(func(gate *fencelock.Lease) {
			once.Do(func() {
				lost = gate.Token()
				rb.SetUnreachable(true) // paused: nothing renews the gate
				<-gate.Done()
				g, err := rwlock(t, wc, "catalog").Lock(t.Context())
				if err != nil {
					t.Error(err)
					return
				}
				wtok = g.Token()
				if err := fence.Admit("res", g); err != nil {
					t.Error(err)
				}
				g.Release(t.Context())
				rb.SetUnreachable(false) // resumes
			})
		})()
		g, err := rwlock(t, rc, "catalog").RLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if wtok <= lost {
			t.Fatalf("the writer's token %d is not above the lost gate's %d", wtok, lost)
		}
		if g.Token() <= wtok {
			t.Errorf("read grant after a paused entry carries token %d, not above the writer's %d that came and went meanwhile (the gate it entered under, %d, was lost)", g.Token(), wtok, lost)
		}
		if err := fence.Admit("res", g); err != nil {
			t.Errorf("the read grant is refused by the fence: %v", err)
		}
		if err := g.Release(t.Context()); err != nil {
			t.Error(err)
		}
	})
}

// Cancelled and bounded waits, for a read and for a write, leave nothing
// behind; Try fails at once and leaves nothing either.
func TestRWLockCancelledWaitsLeaveNothing(t *testing.T) {
	for _, sb := range semBackends {
		t.Run(sb.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				a := rwlock(t, newClient(t, sb.wrap(store.Backend()), &fencelock.Options{TTL: time.Second, Owner: "a"}), "catalog")
				b := rwlock(t, newClient(t, sb.wrap(store.Backend()), &fencelock.Options{TTL: time.Second, Owner: "b"}), "catalog")
				r, err := a.RLock(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				_, err = b.Lock(ctx)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Lock while a reader holds: %v; want DeadlineExceeded", err)
				}
				if _, err := b.Lock(t.Context(), fencelock.WithWait(time.Second)); !errors.Is(err, fencelock.ErrNotAcquired) {
					t.Fatalf("Lock with WithWait while a reader holds: %v; want ErrNotAcquired", err)
				}
				if _, err := b.TryLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
					t.Fatalf("TryLock while a reader holds: %v; want ErrNotAcquired", err)
				}
				if hs := rwHolders(t, a); len(hs) != 1 || hs[0].Write || hs[0].Owner != r.Owner() {
					t.Fatalf("holders %+v; want only a's reader: the failed writers must leave nothing", hs)
				}
				r2, err := b.TryRLock(t.Context()) // the gate is free
				if err != nil {
					t.Fatalf("TryRLock beside a reader after the writers gave up: %v", err)
				}
				r.Release(t.Context())
				r2.Release(t.Context())

				w, err := b.Lock(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel = context.WithTimeout(t.Context(), 2*time.Second)
				_, err = a.RLock(ctx)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("RLock while a writer holds: %v; want DeadlineExceeded", err)
				}
				if _, err := a.TryRLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
					t.Fatalf("TryRLock while a writer holds: %v; want ErrNotAcquired", err)
				}
				if hs := rwHolders(t, a); len(hs) != 1 || !hs[0].Write || hs[0].Slots != 0 || hs[0].Owner != w.Owner() {
					t.Fatalf("holders %+v; want only b's writer, its gate", hs)
				}
				if err := w.Release(t.Context()); err != nil {
					t.Fatal(err)
				}
				if infos, _ := store.Backend().List(context.Background(), ""); len(infos) != 0 {
					t.Errorf("store holds %v after every grant was released", infos)
				}
			})
		})
	}
}

// A grant is lost when any lease it holds is lost; its other leases are
// released at once.
func TestRWLockLossOfAnyLeaseEndsGrant(t *testing.T) {
	for _, write := range []bool{false, true} {
		t.Run(fmt.Sprint("write=", write), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memory.NewStore()
				rw := rwlock(t, newClient(t, store.Backend(), &fencelock.Options{TTL: time.Second}), "catalog")
				lock := rw.RLock
				if write {
					lock = rw.Lock
				}
				g, err := lock(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				ls := g.Leases()
				if want := 1; len(ls) != want {
					t.Fatalf("%d leases; want %d", len(ls), want)
				}
				victim := ls[len(ls)-1]
				if _, err := store.Backend().ForceRelease(t.Context(), victim.Key()); err != nil {
					t.Fatal(err)
				}
				<-g.Done()
				if !errors.Is(g.Err(), fencelock.ErrLeaseLost) || !errors.Is(context.Cause(g.Context()), fencelock.ErrLeaseLost) {
					t.Errorf("Err %v, cause %v after a lease was taken; want ErrLeaseLost", g.Err(), context.Cause(g.Context()))
				}
				synctest.Wait()
				if infos, _ := store.Backend().List(context.Background(), ""); len(infos) != 0 {
					t.Errorf("store holds %v after the grant was lost; want its other leases released", infos)
				}
				if err := g.Release(t.Context()); !errors.Is(err, fencelock.ErrNotHeld) {
					t.Errorf("Release after the loss: %v; want ErrNotHeld", err)
				}
			})
		})
	}
}

// A writer that stops renewing (a crash, a partition) frees the lock
// within the TTL, not before.
func TestRWLockCrashedWriterFreedWithinTTL(t *testing.T) {
	for _, sb := range semBackends {
		t.Run(sb.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const ttl = 3 * time.Second
				store := memory.NewStore()
				deadB := store.Backend()
				dead := rwlock(t, newClient(t, deadB, &fencelock.Options{TTL: ttl, Owner: "dead"}), "catalog")
				live := rwlock(t, newClient(t, sb.wrap(store.Backend()), &fencelock.Options{TTL: ttl, Owner: "live"}), "catalog")
				start := time.Now()
				if _, err := dead.TryLock(t.Context()); err != nil {
					t.Fatal(err)
				}
				deadB.SetUnreachable(true)
				g, err := live.RLock(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if got := time.Since(start); got < ttl || got > ttl+100*time.Millisecond {
					t.Errorf("read grant %v after the writer stopped; want within the TTL (%v) and not before it", got, ttl)
				}
				g.Release(t.Context())
			})
		})
	}
}

// Holders reports each grant once: readers with their slot and token, a
// writer with its gate, its slots and its own metadata.
func TestRWLockHolders(t *testing.T) {
	store := memory.NewStore()
	var readers []*recipe.RWGrant
	for i := range 3 {
		c := newClient(t, store.Backend(), nil)
		g, err := rwlock(t, c, "catalog").TryRLock(t.Context(), fencelock.WithLabel(fmt.Sprint("web-", i)), fencelock.WithMetadata([]byte(fmt.Sprint("addr-", i))))
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, g)
	}
	other := newClient(t, store.Backend(), nil)
	if _, err := other.TryAcquire(t.Context(), "catalog/x"); err != nil { // beside it: not listed
		t.Fatal(err)
	}
	rw := rwlock(t, other, "catalog")
	hs := rwHolders(t, rw)
	if len(hs) != len(readers) {
		t.Fatalf("holders %+v; want %d readers", hs, len(readers))
	}
	for i, g := range readers {
		h := hs[i] // in token order, as they entered
		if h.Write || h.Owner != g.Owner() || h.Grant != g.Token() || h.Slots != 1 || h.Label() != fmt.Sprint("web-", i) ||
			string(h.Metadata) != fmt.Sprint("addr-", i) || !strings.HasPrefix(h.Key, "catalog"+recipe.RWSeparator+"r/") {
			t.Errorf("holder %d: %+v; want reader %s with token %d, label web-%d, metadata addr-%d", i, h, g.Owner(), g.Token(), i, i)
		}
		g.Release(t.Context())
	}
	w, err := rw.TryLock(t.Context(), fencelock.WithMetadata([]byte("reindex")), fencelock.WithLabel("nightly batch"))
	if err != nil {
		t.Fatal(err)
	}
	hs = rwHolders(t, rw)
	if len(hs) != 1 || !hs[0].Write || hs[0].Key != rw.GateKey() || hs[0].Owner != w.Owner() || hs[0].Grant != w.Token() ||
		hs[0].Slots != 0 || string(hs[0].Metadata) != "reindex" {
		t.Errorf("holders %+v; want the writer %s with token %d, its gate and its metadata", hs, w.Owner(), w.Token())
	}
	if w.Token() <= readers[len(readers)-1].Token() {
		t.Errorf("writer token %d not above the readers' before it", w.Token())
	}
}

func TestRWLockBadKey(t *testing.T) {
	c := newClient(t, memory.New(), nil)
	longest := driver.MaxKeyLen - len(recipe.RWSeparator+"r/"+fmt.Sprint(recipe.DefaultMaxReaders-1))
	for _, key := range []string{"", "a\x00b", strings.Repeat("k", longest+1)} {
		if _, err := recipe.NewRWLock(c, key); !errors.Is(err, fencelock.ErrInvalidKey) {
			t.Errorf("RWLock(%.20q…): %v; want ErrInvalidKey", key, err)
		}
	}
	rw, err := recipe.NewRWLock(c, strings.Repeat("k", longest))
	if err != nil {
		t.Fatal(err)
	}
	g, err := rw.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock on the longest key: %v", err)
	}
	g.Release(t.Context())
	if _, err := rw.TryRLock(t.Context(), fencelock.WithTTL(time.Nanosecond)); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Errorf("TryRLock with a TTL out of range: %v; want ErrInvalidOption", err)
	}
}

// RWFence admits reads at or above the last writer's token, and writes
// above every token seen (or the same writer again).
func TestRWFence(t *testing.T) {
	var f recipe.RWFence
	steps := []struct {
		write  bool
		token  fencelock.Token
		holder string
		ok     bool
	}{
		{false, 3, "", true},  // a reader
		{false, 2, "", true},  // an older reader, no writer since
		{true, 3, "w", false}, // a write must be above every token seen
		{true, 5, "w", true},  // a writer
		{true, 5, "w", true},  // writing again
		{true, 5, "x", false}, // the same token from another grant
		{false, 4, "", false}, // a reader from before the writer
		{false, 5, "", true},  // the writer reads
		{false, 7, "", true},  // a reader after it
		{true, 5, "w", false}, // the writer, paused past a later reader
		{true, 6, "y", false}, // below a reader's token
		{true, 8, "z", true},  // the next writer
		{false, 7, "", false}, // the reader from before it
		{false, 0, "", false}, // no token
	}
	for i, s := range steps {
		var err error
		if s.write {
			err = f.CheckWrite("res", s.token, s.holder)
		} else {
			err = f.CheckRead("res", s.token)
		}
		if (err == nil) != s.ok || (err != nil && !errors.Is(err, fencelock.ErrStaleToken)) {
			t.Errorf("step %d (write %v, token %d, holder %q): %v; want ok %v", i, s.write, s.token, s.holder, err, s.ok)
		}
	}
	if top, w := f.Highest("res"); top != 8 || w != 8 {
		t.Errorf("Highest = %d, %d; want 8, 8", top, w)
	}
}

// A writer waits for every reader: with one reader inside, in any of
// the slots, TryLock fails.
func TestRWLockWriterWaitsForEveryReader(t *testing.T) {
	store := memory.NewStore()
	const n = 6
	r := rwlock(t, newClient(t, store.Backend(), nil), "catalog", recipe.WithMaxReaders(n))
	w := rwlock(t, newClient(t, store.Backend(), nil), "catalog")
	for slot := range n {
		// Fill every slot, then keep only the reader in this one.
		var keep *recipe.RWGrant
		var others []*recipe.RWGrant
		for range n {
			g, err := r.TryRLock(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if g.Lease().Key() == r.SlotKey(slot) {
				keep = g
			} else {
				others = append(others, g)
			}
		}
		if _, err := r.TryRLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatalf("TryRLock with every slot held: %v; want ErrNotAcquired", err)
		}
		if keep == nil {
			t.Fatalf("no reader got slot %s", r.SlotKey(slot))
		}
		for _, g := range others {
			if err := g.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := w.TryLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatalf("TryLock with a reader inside on slot %s: %v; want ErrNotAcquired", keep.Lease().Key(), err)
		}
		if err := keep.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	g, err := w.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock after every reader left: %v", err)
	}
	g.Release(t.Context())
}

// slotThief, once armed, takes the reader's slot from the store while
// the reader releases its gate, and holds that release until the slot's
// next renewal has been told "not held".
type slotThief struct {
	*fakebackend.Fake
	armed atomic.Bool
	mu    sync.Mutex
	slot  string
}

func newSlotThief(store *memory.Store) *slotThief {
	b := &slotThief{Fake: fakebackend.New(store.Backend(), fakebackend.Plain)}
	b.OnAcquire(func(ctx context.Context, r driver.AcquireRequest, next fakebackend.AcquireFunc) (driver.Grant, error) {
		g, err := next(ctx, r)
		if err == nil && strings.Contains(r.Key, recipe.RWSeparator+"r/") {
			b.mu.Lock()
			b.slot = r.Key
			b.mu.Unlock()
		}
		return g, err
	})
	b.OnRelease(func(ctx context.Context, g driver.Grant, next fakebackend.ReleaseFunc) error {
		if strings.HasSuffix(g.Key, recipe.RWSeparator+"gate") && b.armed.CompareAndSwap(true, false) {
			b.mu.Lock()
			slot := b.slot
			b.mu.Unlock()
			if _, err := store.Backend().ForceRelease(ctx, slot); err != nil {
				return err
			}
			time.Sleep(500 * time.Millisecond) // a slow release: the slot's renewal (every TTL/3) is told "not held"
		}
		return next(ctx, g)
	})
	return b
}

// A reader whose slot is lost while it releases its gate does not get a
// grant already lost: it enters again.
func TestRWLockSlotLostAtGateReleaseEntersAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newSlotThief(store)
		b.armed.Store(true)
		rw := rwlock(t, newClient(t, b.Backend(), &fencelock.Options{TTL: time.Second}), "catalog")
		g, err := rw.RLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if b.armed.Load() {
			t.Fatal("the slot was never taken: the test did not run its case")
		}
		if err := g.Err(); err != nil || g.Remaining() == 0 {
			t.Fatalf("RLock returned a grant already lost (Err %v, Remaining %v); want a held one", err, g.Remaining())
		}
		infos, _ := store.Backend().List(context.Background(), "")
		if hs := rwHolders(t, rw); len(hs) != 1 || hs[0].Owner != g.Owner() {
			t.Errorf("holders %+v (store %+v, grant %s on %s); want only the grant's slot", hs, infos, g.Owner(), g.Lease().Key())
		}
		g.Release(t.Context())
	})
}
