package conformance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
)

// testReadWrite checks recipe.RWLock, which is generic (a gate lease
// and a reader slot lease per reader), through the store: its subtests
// each carry their own rule.
func testReadWrite(t *testing.T, s *suite) {
	runCases(t, s, rwCases)
}

const readWriteRule = "recipe.RWLock, generic over every backend (a gate lease and reader slot leases), through the store: many readers at once, no reader beside a writer, no two writers, writers not starved by readers, tokens never go backwards, cancelled waits leave nothing, Holders lists every holder, a crashed holder's grant returns within TTL, a refused or given-up grant keeps no minimum hold, readers do not refuse each other's TryRLock, readers are uncapped, an upgradeable reader excludes writers and upgrades without letting one in (subtests, each with its own rule)."

var rwCases = []testCase{
	{"ReadersShareWritersExclude", "many clients, each with reading and writing goroutines on one RWLock: one reader per client holds it at once; no reader holds it while a writer does; never two writers; a writer's token is above every grant's before it, a reader's above the last writer's; a fenced resource (RWFence) admits every live grant's reads and writes.", testRWMutex},
	{"WriterWaitsForEverySlot", "a writer waits for every reader slot, however high its number: while any one slot is held, TryLock fails, and leaves nothing behind.", testRWEverySlot},
	{"WriterNotStarved", "a writer waiting for readers holds the gate, and one waiting for the gate holds the intent that every reader looks at first, so a stream of overlapping readers cannot keep it out: it gets the lock before any reader has done a bounded number of rounds.", testRWStarve},
	{"CancelledWaitLeavesNothing", "a Lock that waits for a reader, or an RLock that waits for a writer, whose context ends returns the context's error and leaves no record or queue entry: the holder is the only holder, and once it releases the lock is free at once.", testRWCancelled},
	{"HoldersListEveryHolder", "RWLock.Holders reports every reader (slot, owner, grant token, its own metadata) and a writer as one holder (its gate, every slot, its metadata).", testRWHolders},
	{"CrashedHolderFreedWithinTTL", "a writer that died without releasing frees the lock within the TTL the store granted plus slack: a waiting reader gets a grant, with a token above the dead writer's.", testRWCrash},
	{"RefusalKeepsNoMinimumHold", "a TryLock refused beside a reader, and a Lock whose WithWait bound passed, with a minimum hold (WithMinHold, Options.MinHold) leave nothing held: the hold belongs to a grant handed out, so once the reader leaves the lock is free at once.", testRWRefusalNoHold},
	{"TryRLockBesideReaders", "concurrent TryRLock calls on a lock that no writer holds or waits for, with slots to spare, are all granted: a reader passing the gate does not refuse another.", testRWTryReaders},
	{"ReadersUncapped", "40 readers from several clients hold read grants at once (more than any fixed number of slots the lock once had); a writer is refused beside them and, once they left, gets a token above every one of theirs.", testRWUncapped},
	{"UpgradeExcludesWriters", "an upgradeable reader shares the lock with readers but not with a writer (TryLock refused, Lock waits out its bound) nor another upgradeable reader; its Upgrade waits for the other readers, keeps new readers out meanwhile, beats a writer that was waiting, and its write token is above every earlier grant's; the writer after it gets a token above it.", testRWUpgrade},
	{"UpgradeableCrashFreed", "an upgradeable reader that died without releasing frees the lock within the TTL the store granted plus slack: a waiting writer gets the write grant, with a token above the dead reader's.", testRWUpgradeCrash},
}

func (s *suite) rwlock(t *testing.T, c *fencelock.Client, key string) *recipe.RWLock {
	t.Helper()
	rw, err := recipe.NewRWLock(c, key)
	if err != nil {
		t.Fatal(err)
	}
	return rw
}

func testRWMutex(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	const clients, readers, rounds = 3, 3, 4
	var (
		mu              sync.Mutex
		inside, most    int
		writing         bool
		top, lastWriter fencelock.Token
		fence           recipe.RWFence
		wg              sync.WaitGroup
	)
	enter := func(g *recipe.RWGrant) {
		mu.Lock()
		defer mu.Unlock()
		tok := g.Token()
		if g.Shared() {
			if writing {
				t.Errorf("read grant (token %d) while a writer holds the lock", tok)
			}
			if tok <= lastWriter {
				t.Errorf("read grant token %d, not above the last writer's %d", tok, lastWriter)
			}
			inside++
			most = max(most, inside)
		} else {
			if writing || inside > 0 {
				t.Errorf("write grant (token %d) while a writer (%v) or %d readers hold the lock", tok, writing, inside)
			}
			if tok <= top {
				t.Errorf("write grant token %d, not above every earlier grant's (highest %d)", tok, top)
			}
			writing, lastWriter = true, tok
		}
		top = max(top, tok)
	}
	leave := func(g *recipe.RWGrant) {
		mu.Lock()
		defer mu.Unlock()
		if g.Shared() {
			inside--
		} else {
			writing = false
		}
	}
	work := func(rw *recipe.RWLock, write bool) {
		defer wg.Done()
		for range rounds {
			lock := rw.RLock
			if write {
				lock = rw.Lock
			}
			g, err := lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			enter(g)
			if err := fence.Admit(key, g); err != nil {
				t.Errorf("a live grant (shared %v, token %d) refused by the fence: %v", g.Shared(), g.Token(), err)
			}
			time.Sleep(20 * time.Millisecond) // the work, long enough for readers to overlap
			leave(g)
			if err := g.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
				return
			}
		}
	}
	rws := make([]*recipe.RWLock, clients)
	var shared []*recipe.RWGrant
	for i := range rws {
		rws[i] = s.rwlock(t, s.client(t), key)
		g, err := rws[i].TryRLock(ctx) // many readers at once
		if err != nil {
			t.Fatalf("TryRLock of client %d while %d other readers hold the lock: %v; want readers to share it", i, len(shared), err)
		}
		shared = append(shared, g)
	}
	for _, g := range shared {
		if err := g.Err(); err != nil {
			t.Errorf("a read grant ended while others were taken: %v", err)
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, rw := range rws {
		for range readers {
			wg.Add(1)
			go work(rw, false)
		}
		wg.Add(1)
		go work(rw, true)
	}
	wg.Wait()
	t.Logf("%d clients × (%d readers + 1 writer) × %d rounds: up to %d readers at once", clients, readers, rounds, most)
	checkEmpty(t, ctx, s.client(t), rwPrefix(key))
}

func testRWEverySlot(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	c := s.client(t)
	w := s.rwlock(t, s.client(t), key)
	for _, i := range []int{0, 1, 15, 16, 39, 1000, recipe.DefaultMaxReaders - 1} {
		l, err := c.TryAcquire(ctx, rwSlot(key, i)) // a reader's slot, as the writer sees it
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.TryLock(ctx); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatalf("TryLock while slot %s is held: %v; want ErrNotAcquired", l.Key(), err)
		}
		infos, err := c.List(ctx, rwPrefix(key))
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Owner != l.Owner() {
			t.Fatalf("List after a refused TryLock = %v; want only the slot's holder (its lease's Err: %v)", infos, l.Err())
		}
		mustRelease(t, l)
	}
	g, err := w.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with every slot free: %v", err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkEmpty(t, ctx, c, rwPrefix(key))
}

func testRWStarve(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	const readers, bound = 4, 30
	var (
		granted atomic.Bool
		rounds  atomic.Int64
		wg      sync.WaitGroup
		started = make(chan struct{})
		once    sync.Once
	)
	for i := range readers {
		rw := s.rwlock(t, s.client(t), key)
		wg.Go(func() {
			for n := 0; !granted.Load(); n++ {
				if n == bound {
					t.Errorf("reader %d did %d rounds and the writer still had no grant: starved", i, bound)
					once.Do(func() { close(started) })
					return
				}
				g, err := rw.RLock(ctx)
				if err != nil {
					t.Error(err)
					once.Do(func() { close(started) })
					return
				}
				rounds.Add(1)
				if n == 1 {
					once.Do(func() { close(started) })
				}
				time.Sleep(time.Duration(20+5*i) * time.Millisecond) // overlapping reads
				if err := g.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	<-started
	g, err := s.rwlock(t, s.client(t), key).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	granted.Store(true)
	t.Logf("the writer got the lock after %d read grants", rounds.Load())
	if err := g.Release(ctx); err != nil {
		t.Error(err)
	}
	wg.Wait()
	checkEmpty(t, ctx, s.client(t), rwPrefix(key))
}

func testRWCancelled(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	a, b := s.rwlock(t, s.client(t), key), s.rwlock(t, s.client(t), key)
	r, err := a.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = b.Lock(wctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with an expiring context while a reader holds = %v; want context.DeadlineExceeded", err)
	}
	if hs, err := a.Holders(ctx); err != nil || len(hs) != 1 || hs[0].Owner != r.Owner() {
		t.Fatalf("Holders after the cancelled Lock = %+v, %v; want only the reader", hs, err)
	}
	r2, err := b.TryRLock(ctx) // the gate is free
	if err != nil {
		t.Fatalf("TryRLock after the cancelled Lock: %v (it left the gate behind)", err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := b.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock once the readers left: %v (a cancelled wait left a slot or queue entry behind)", err)
	}
	wctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = a.RLock(wctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RLock with an expiring context while a writer holds = %v; want context.DeadlineExceeded", err)
	}
	if hs, err := a.Holders(ctx); err != nil || len(hs) != 1 || !hs[0].Write || hs[0].Owner != w.Owner() || hs[0].Slots != 0 {
		t.Fatalf("Holders after the cancelled RLock = %+v, %v; want only the writer", hs, err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r, err = a.TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock once the writer left: %v (a cancelled wait left the gate or a queue entry behind)", err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkEmpty(t, ctx, s.client(t), rwPrefix(key))
}

func testRWHolders(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	var readers []*recipe.RWGrant
	for i := range 3 {
		g, err := s.rwlock(t, s.client(t), key).TryRLock(ctx, fencelock.WithMetadata(fmt.Appendf(nil, "reader-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, g)
	}
	rw := s.rwlock(t, s.client(t), key)
	hs, err := rw.Holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != len(readers) {
		t.Fatalf("Holders = %+v; want %d readers", hs, len(readers))
	}
	for i, g := range readers {
		found := false
		for _, h := range hs {
			if h.Owner != g.Owner() {
				continue
			}
			found = true
			if h.Write || h.Grant != g.Token() || h.Slots != 1 || h.Key != g.Lease().Key() || h.Token != g.Lease().Token() || string(h.Metadata) != fmt.Sprintf("reader-%d", i) {
				t.Errorf("holder %+v; want a reader on %s, grant token %d, slot token %d, metadata reader-%d", h, g.Lease().Key(), g.Token(), g.Lease().Token(), i)
			}
		}
		if !found {
			t.Errorf("Holders = %+v; missing reader %s", hs, g.Owner())
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := rw.TryLock(ctx, fencelock.WithMetadata([]byte("writer")))
	if err != nil {
		t.Fatal(err)
	}
	hs, err = s.rwlock(t, s.client(t), key).Holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || !hs[0].Write || hs[0].Key != rwRecords(rw.Key())[0] || hs[0].Owner != w.Owner() || hs[0].Grant != w.Token() ||
		hs[0].Slots != 0 || string(hs[0].Metadata) != "writer" {
		t.Errorf("Holders = %+v; want the writer %s (grant token %d), its gate and metadata %q", hs, w.Owner(), w.Token(), "writer")
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if hs, err := rw.Holders(ctx); err != nil || len(hs) != 0 {
		t.Errorf("Holders after release = %+v, %v; want none", hs, err)
	}
}

func testRWCrash(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	b, cb := s.crashable(t)
	dead, err := fencelock.New(b, s.options())
	if err != nil {
		b.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { dead.Close() })
	dw := s.rwlock(t, dead, key)
	w, err := dw.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live := s.rwlock(t, s.client(t), key)
	if _, err := live.TryRLock(ctx); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("TryRLock while a writer holds = %v; want ErrNotAcquired", err)
	}
	cb.crash()
	crashed := time.Now()
	bound := s.expiryBound(cb.last(rwRecords(dw.Key())[0]), s.h.TTL)
	actx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	g, err := live.RLock(actx, s.patient())
	if err != nil {
		t.Fatalf("no read grant within %v of the writer's crash (the granted TTL plus slack): %v", bound, err)
	}
	t.Logf("crashed writer's lock returned after %v (bound %v)", time.Since(crashed), bound)
	if g.Token() <= w.Token() {
		t.Errorf("read grant after the crashed writer carries token %d, not above the writer's %d", g.Token(), w.Token())
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func testRWRefusalNoHold(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	const hold = time.Minute // far past the case's end: a record kept for it is plainly there
	for _, way := range []string{"WithMinHold", "Options.MinHold"} {
		t.Run(way, func(t *testing.T) {
			key := s.key(t, "rw")
			o := s.options()
			var opts []fencelock.AcquireOption
			if way == "WithMinHold" {
				opts = append(opts, fencelock.WithMinHold(hold))
			} else {
				o.MinHold = hold
			}
			reader := s.rwlock(t, s.client(t), key)
			refused := s.rwlock(t, s.clientWith(t, o), key)
			r, err := reader.TryRLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := refused.TryLock(ctx, opts...); !errors.Is(err, fencelock.ErrNotAcquired) {
				t.Fatalf("TryLock beside a reader = %v; want ErrNotAcquired", err)
			}
			if _, err := refused.Lock(ctx, append(opts, fencelock.WithWait(300*time.Millisecond))...); !errors.Is(err, fencelock.ErrNotAcquired) {
				t.Fatalf("Lock with WithWait(300ms) beside a reader = %v; want ErrNotAcquired", err)
			}
			if hs, err := reader.Holders(ctx); err != nil || len(hs) != 1 || hs[0].Owner != r.Owner() {
				t.Fatalf("Holders after the refusals = %+v, %v; want only the reader: a grant never handed out keeps no minimum hold", hs, err)
			}
			if err := r.Release(ctx); err != nil {
				t.Fatal(err)
			}
			w, err := s.rwlock(t, s.client(t), key).TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock once the reader left = %v; want the lock at once, not after the refused caller's minimum hold", err)
			}
			if err := w.Release(ctx); err != nil {
				t.Fatal(err)
			}
			checkEmpty(t, ctx, s.client(t), rwPrefix(key))
		})
	}
}

func testRWTryReaders(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	const readers, rounds = 6, 10
	// A reader staying in the gate longer than Options.MaxBackoff (or
	// than a number of the try's round trips) is taken for stuck, and
	// refused. The suite's clients have a MaxBackoff of an eighth of
	// the TTL, for its waiting cases; these have the library's default
	// (a second), which bounds how long a reader may pass the gate, so
	// that a store that syncs each grant to disk on a loaded machine is
	// not taken for one whose reader is stuck.
	o := s.options()
	o.MaxBackoff = 0
	var rws []*recipe.RWLock
	for range readers {
		rws = append(rws, s.rwlock(t, s.clientWith(t, o), key))
	}
	for round := range rounds {
		grants := make([]*recipe.RWGrant, readers)
		errs := make([]error, readers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, rw := range rws {
			wg.Go(func() {
				<-start
				grants[i], errs[i] = rw.TryRLock(ctx)
			})
		}
		close(start)
		wg.Wait()
		var failed error
		for i, err := range errs {
			if err != nil {
				failed = fmt.Errorf("round %d: TryRLock %d of %d concurrent ones on a free lock refused: %w", round, i, readers, err)
			}
		}
		for _, g := range grants {
			if g != nil {
				if err := g.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}
		if failed != nil {
			t.Fatal(failed)
		}
	}
	checkEmpty(t, ctx, s.client(t), rwPrefix(key))
}

// rwPrefix is what every record of the read-write lock on key starts with.
func rwPrefix(key string) string {
	p, _ := recipe.Keys(key, 0)
	return p
}

// rwRecords are the records of the read-write lock on key: its gate, its
// intent and its upgrade record (see recipe.Keys).
func rwRecords(key string) []string {
	_, r := recipe.Keys(key, 0)
	return r
}

// rwSlot is the key of reader slot i of the read-write lock on key (see
// recipe.Keys).
func rwSlot(key string, i int) string { return rwPrefix(key) + "r/" + strconv.Itoa(i) }

func testRWUncapped(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	const clients, readers = 4, 40
	rws := make([]*recipe.RWLock, clients)
	for i := range rws {
		rws[i] = s.rwlock(t, s.client(t), key)
	}
	var (
		mu sync.Mutex
		gs []*recipe.RWGrant
		wg sync.WaitGroup
	)
	for i := range readers {
		wg.Go(func() {
			g, err := rws[i%clients].RLock(ctx, fencelock.WithWait(20*s.h.TTL))
			if err != nil {
				t.Errorf("reader %d: %v; want readers uncapped", i, err)
				return
			}
			mu.Lock()
			gs = append(gs, g)
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	live := 0
	var top fencelock.Token
	for _, g := range gs {
		if g.Err() == nil {
			live++
		}
		top = max(top, g.Token())
	}
	if live != readers {
		t.Fatalf("%d of %d read grants held at once; want all", live, readers)
	}
	if hs, err := rws[0].Holders(ctx); err != nil || len(hs) != readers {
		t.Errorf("Holders lists %d (%v); want %d readers", len(hs), err, readers)
	}
	if _, err := rws[1].TryLock(ctx); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("TryLock beside %d readers = %v; want ErrNotAcquired", readers, err)
	}
	for _, g := range gs {
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := rws[1].TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock once the readers left: %v", err)
	}
	if w.Token() <= top {
		t.Errorf("writer token %d, not above the readers' (highest %d)", w.Token(), top)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkEmpty(t, ctx, s.client(t), rwPrefix(key))
}

func testRWUpgrade(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	a, b := s.rwlock(t, s.client(t), key), s.rwlock(t, s.client(t), key)
	w0, err := b.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	u, err := a.TryUpgradeableRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock beside an upgradeable reader = %v; want a grant", err)
	}
	if _, err := b.TryUpgradeableRLock(ctx); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("a second TryUpgradeableRLock = %v; want ErrNotAcquired", err)
	}
	if _, err := b.TryLock(ctx); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("TryLock beside an upgradeable reader = %v; want ErrNotAcquired", err)
	}
	if _, err := b.Lock(ctx, fencelock.WithWait(s.h.TTL/2)); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("Lock beside an upgradeable reader = %v; want its wait bound (ErrNotAcquired)", err)
	}
	writer := make(chan *recipe.RWGrant, 1)
	go func() {
		g, err := b.Lock(ctx, fencelock.WithWait(20*s.h.TTL))
		if err != nil {
			t.Errorf("the writer waiting behind the upgradeable reader: %v", err)
		}
		writer <- g
	}()
	if err := u.TryUpgrade(ctx); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("TryUpgrade beside a reader = %v; want ErrNotAcquired", err)
	}
	upgraded := make(chan error, 1)
	go func() { upgraded <- u.Upgrade(ctx) }()
	// The upgrade holds the gate as soon as it waits for r: a new reader
	// is refused from then on (it may pass before).
	deadline := time.Now().Add(10 * s.h.TTL)
	for {
		g, err := b.TryRLock(ctx)
		if err != nil {
			break
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("readers still let in 10 TTLs after Upgrade began; want the upgrade to close the gate")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-upgraded:
		t.Fatalf("Upgrade returned %v while another reader holds the lock; want it to wait", err)
	default:
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-upgraded; err != nil {
		t.Fatalf("Upgrade once the reader left: %v", err)
	}
	if u.Shared() || u.Token() <= w0.Token() || u.Token() <= r.Token() {
		t.Errorf("upgraded grant: shared %v, token %d; want a write grant above the earlier writer's %d and reader's %d", u.Shared(), u.Token(), w0.Token(), r.Token())
	}
	var fence recipe.RWFence
	for _, g := range []*recipe.RWGrant{w0, r, u} {
		_ = fence.Admit(key, g)
	}
	if err := fence.Admit(key, u); err != nil {
		t.Errorf("the upgraded grant's write refused by the fence: %v", err)
	}
	select {
	case g := <-writer:
		t.Fatalf("a writer (token %d) got the lock while the upgraded grant holds it", g.Token())
	default:
	}
	if err := u.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g := <-writer
	if g == nil {
		return
	}
	if g.Token() <= u.Token() {
		t.Errorf("the writer after the upgrade carries token %d, not above the upgraded grant's %d", g.Token(), u.Token())
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	checkEmpty(t, ctx, s.client(t), rwPrefix(key))
}

func testRWUpgradeCrash(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "rw")
	dead, cb := s.crashableClient(t, s.options())
	du := s.rwlock(t, dead, key)
	u, err := du.TryUpgradeableRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live := s.rwlock(t, s.client(t), key)
	if _, err := live.TryLock(ctx); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("TryLock beside an upgradeable reader = %v; want ErrNotAcquired", err)
	}
	cb.crash()
	crashed := time.Now()
	bound := s.expiryBound(cb.last(rwRecords(key)[2]), s.h.TTL)
	bound = max(bound, s.expiryBound(cb.last(u.Lease().Key()), s.h.TTL))
	actx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	w, err := live.Lock(actx, s.patient())
	if err != nil {
		t.Fatalf("no write grant within %v of the upgradeable reader's crash (the granted TTL plus slack): %v", bound, err)
	}
	t.Logf("crashed upgradeable reader's lock returned after %v (bound %v)", time.Since(crashed), bound)
	if w.Token() <= u.Token() {
		t.Errorf("write grant after the crash carries token %d, not above the dead reader's %d", w.Token(), u.Token())
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
