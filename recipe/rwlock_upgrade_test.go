package recipe_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/recipe"
)

// Far more readers than the old fixed 16 hold the lock at once, each
// with a grant token; a writer is refused beside any of them, and gets
// the lock once they left.
func TestRWLockReadersUncapped(t *testing.T) {
	store := memory.NewStore()
	const n = 40
	rw := rwlock(t, newClient(t, store.Backend(), nil), "catalog")
	w := rwlock(t, newClient(t, store.Backend(), nil), "catalog")
	var gs []*recipe.RWGrant
	for i := range n {
		g, err := rw.TryRLock(t.Context())
		if err != nil {
			t.Fatalf("TryRLock %d with %d readers inside: %v; want readers uncapped", i, len(gs), err)
		}
		gs = append(gs, g)
	}
	if hs := rwHolders(t, rw); len(hs) != n {
		t.Fatalf("Holders lists %d; want %d readers", len(hs), n)
	}
	if _, err := w.TryLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("TryLock beside %d readers = %v; want ErrNotAcquired", n, err)
	}
	var top fencelock.Token
	for _, g := range gs {
		top = max(top, g.Token())
		if err := g.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	g, err := w.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock once the readers left: %v", err)
	}
	if g.Token() <= top {
		t.Errorf("writer token %d not above the readers' (%d)", g.Token(), top)
	}
	g.Release(t.Context())
}

// WithMaxReaders bounds the readers: one more is refused (TryRLock) or
// waits (RLock) until one leaves.
func TestRWLockWithMaxReadersBounds(t *testing.T) {
	store := memory.NewStore()
	rw := rwlock(t, newClient(t, store.Backend(), nil), "k", recipe.WithMaxReaders(2))
	a, _ := rw.TryRLock(t.Context())
	b, err := rw.TryRLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.TryRLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("third TryRLock with WithMaxReaders(2) = %v; want ErrNotAcquired", err)
	}
	done := make(chan error, 1)
	go func() {
		g, err := rw.RLock(t.Context(), fencelock.WithWait(10*time.Second))
		if err == nil {
			g.Release(t.Context())
		}
		done <- err
	}()
	a.Release(t.Context())
	if err := <-done; err != nil {
		t.Errorf("RLock once a reader left = %v; want a grant", err)
	}
	b.Release(t.Context())
	if _, err := recipe.NewRWLock(newClient(t, store.Backend(), nil), "k", recipe.WithMaxReaders(0)); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Errorf("WithMaxReaders(0) = %v; want ErrInvalidOption", err)
	}
}

// An upgradeable reader shares the lock with readers, but not with a
// writer or another upgradeable reader.
func TestRWLockUpgradeableExcludesWritersNotReaders(t *testing.T) {
	store := memory.NewStore()
	a := rwlock(t, newClient(t, store.Backend(), nil), "k")
	b := rwlock(t, newClient(t, store.Backend(), nil), "k")
	u, err := a.TryUpgradeableRLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !u.Shared() || !u.Upgradeable() {
		t.Fatalf("upgradeable grant: Shared %v Upgradeable %v; want both", u.Shared(), u.Upgradeable())
	}
	r, err := b.TryRLock(t.Context())
	if err != nil {
		t.Fatalf("TryRLock beside an upgradeable reader = %v; want a grant", err)
	}
	if err := r.Upgrade(t.Context()); !errors.Is(err, recipe.ErrNotUpgradeable) {
		t.Errorf("Upgrade of a plain read grant = %v; want ErrNotUpgradeable", err)
	}
	r.Release(t.Context())
	if _, err := b.TryUpgradeableRLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("second TryUpgradeableRLock = %v; want ErrNotAcquired", err)
	}
	if _, err := b.TryLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("TryLock beside an upgradeable reader = %v; want ErrNotAcquired", err)
	}
	if _, err := b.Lock(t.Context(), fencelock.WithWait(200*time.Millisecond)); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("Lock beside an upgradeable reader = %v; want its wait bound", err)
	}
	hs := rwHolders(t, a)
	if len(hs) != 1 || !hs[0].Upgradeable || hs[0].Owner != u.Owner() {
		t.Errorf("Holders = %+v; want the upgradeable reader, marked", hs)
	}
	u.Release(t.Context())
	if infos, _ := store.Backend().List(t.Context(), ""); len(infos) != 0 {
		t.Errorf("store holds %v after every grant was released", infos)
	}
}

// Upgrade waits for the other readers to leave, keeps new readers out
// meanwhile, beats a writer that waits, and carries a token above every
// earlier writer's.
func TestRWLockUpgradeWaitsForReadersAndBeatsWaitingWriter(t *testing.T) {
	store := memory.NewStore()
	a := rwlock(t, newClient(t, store.Backend(), nil), "k")
	b := rwlock(t, newClient(t, store.Backend(), nil), "k")
	w0, err := b.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	w0.Release(t.Context())
	u, err := a.UpgradeableRLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.RLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	writer := make(chan *recipe.RWGrant, 1)
	go func() {
		g, err := b.Lock(t.Context(), fencelock.WithWait(20*time.Second))
		if err != nil {
			t.Errorf("waiting writer: %v", err)
		}
		writer <- g
	}()
	draining := make(chan struct{}, 8)
	defer recipe.SetRWTestHookDrain(func([]fencelock.Info) { draining <- struct{}{} })()
	upgraded := make(chan error, 1)
	go func() { upgraded <- u.Upgrade(t.Context()) }()
	<-draining // the upgrade holds the gate and waits for r
	if _, err := b.TryRLock(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("TryRLock while an upgrade waits for readers = %v; want ErrNotAcquired", err)
	}
	r.Release(t.Context())
	if err := <-upgraded; err != nil {
		t.Fatalf("Upgrade once the reader left = %v", err)
	}
	if u.Shared() || u.Token() <= w0.Token() || u.Token() <= r.Token() {
		t.Errorf("upgraded: Shared %v token %d; want a write grant above the earlier writer's %d and reader's %d", u.Shared(), u.Token(), w0.Token(), r.Token())
	}
	hs := rwHolders(t, a)
	if len(hs) != 1 || !hs[0].Write || hs[0].Owner != u.Owner() {
		t.Errorf("Holders after the upgrade = %+v; want only its write grant", hs)
	}
	select {
	case g := <-writer:
		if g != nil {
			t.Fatalf("a writer (token %d) got the lock while the upgraded grant holds it", g.Token())
		}
		t.FailNow() // the writer's error is reported
	default:
	}
	u.Release(t.Context())
	g := <-writer
	if g == nil {
		return
	}
	if g.Token() <= u.Token() {
		t.Errorf("writer after the upgrade: token %d not above the upgraded grant's %d", g.Token(), u.Token())
	}
	g.Release(t.Context())
}

// An upgrade cut short stays the upgradeable read grant it was, and
// leaves nothing else behind.
func TestRWLockUpgradeCancelledStaysReader(t *testing.T) {
	store := memory.NewStore()
	a := rwlock(t, newClient(t, store.Backend(), nil), "k")
	b := rwlock(t, newClient(t, store.Backend(), nil), "k")
	u, _ := a.UpgradeableRLock(t.Context())
	r, err := b.RLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := u.TryUpgrade(t.Context()); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Errorf("TryUpgrade beside a reader = %v; want ErrNotAcquired", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := u.Upgrade(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Upgrade cut short = %v; want DeadlineExceeded", err)
	}
	if !u.Shared() || u.Err() != nil {
		t.Errorf("after a failed upgrade: Shared %v Err %v; want the read grant, held", u.Shared(), u.Err())
	}
	info, err := store.Backend().Inspect(t.Context(), a.GateKey())
	if err != nil || info.Locked() {
		t.Errorf("gate after a failed upgrade: %+v %v; want free", info, err)
	}
	r2, err := b.TryRLock(t.Context())
	if err != nil {
		t.Fatalf("TryRLock after a failed upgrade = %v; want readers let in again", err)
	}
	for _, g := range []*recipe.RWGrant{r, r2, u} {
		g.Release(t.Context())
	}
}

// gateRace holds an upgrading client's first request for the gate until
// a waiting writer has had its turn: one attempt at the upgrade record
// begun after that request arrived, refused (the upgrade still holds the
// record), or a request for the gate answered (the writer got past it).
type gateRace struct {
	gate, upgrade string

	mu      sync.Mutex
	arrived bool          // the upgrade's gate request is held
	turn    chan struct{} // closed when the writer has had its turn
	once    sync.Once
}

// upgrader is the upgrading client's backend: it holds its first gate
// request (the upgrade's, once armed) until the writer's turn.
type upgrader struct {
	driver.Backend
	r     *gateRace
	armed atomic.Bool
}

func (u *upgrader) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if req.Key == u.r.gate && u.armed.CompareAndSwap(true, false) {
		u.r.mu.Lock()
		u.r.arrived = true
		u.r.mu.Unlock()
		select {
		case <-u.r.turn:
		case <-ctx.Done():
			return driver.Grant{}, ctx.Err()
		}
	}
	return u.Backend.Acquire(ctx, req)
}

// writer is the waiting writer's backend (bare: its waits poll); it
// reports the writer's turn.
type writer struct {
	driver.Backend
	r *gateRace
}

func (w *writer) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	w.r.mu.Lock()
	after := w.r.arrived
	w.r.mu.Unlock()
	g, err := w.Backend.Acquire(ctx, req)
	if after && (req.Key == w.r.gate || req.Key == w.r.upgrade && err != nil) {
		w.r.once.Do(func() { close(w.r.turn) })
	}
	return g, err
}

// An upgrade keeps the upgrade record until it holds the gate, so a
// writer that waits for the record while the upgrade begins cannot slip
// in between the read and the write: however the two requests interleave
// (here the writer is let go first), the upgrade gets the write grant
// without waiting for the writer, and the writer's token comes after the
// upgraded one. An upgrade that gave the record up before the gate would
// let the writer take it and the gate, and each would wait for the other
// (the writer for the upgrader's slot) until the upgrade's bound.
func TestRWLockUpgradeHoldsRecordUntilGate(t *testing.T) {
	store := memory.NewStore()
	a := rwlock(t, newClient(t, store.Backend(), nil), "k")
	race := &gateRace{gate: a.GateKey(), upgrade: a.UpgradeKey(), turn: make(chan struct{})}
	up := &upgrader{Backend: store.Backend(), r: race}
	u, err := rwlock(t, newClient(t, up, nil), "k").UpgradeableRLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan string, 16)
	wc := newClient(t, &writer{Backend: store.Backend(), r: race}, &fencelock.Options{
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Observer: fencelock.ObserverFunc(func(e fencelock.Event) {
			if e.Kind == fencelock.EventWaiting {
				select {
				case waiting <- e.Key:
				default:
				}
			}
		}),
	})
	w := rwlock(t, wc, "k")
	granted := make(chan *recipe.RWGrant, 1)
	done := make(chan struct{})
	t.Cleanup(func() { <-done }) // t.Context ends the wait first
	go func() {
		defer close(done)
		g, err := w.Lock(t.Context(), fencelock.WithWait(20*time.Second))
		if err != nil {
			t.Errorf("waiting writer: %v", err)
		}
		granted <- g
	}()
	if key := <-waiting; key != race.upgrade {
		t.Fatalf("the writer waits for %q; want the upgrade record %q", key, race.upgrade)
	}
	up.armed.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := u.Upgrade(ctx); err != nil {
		t.Fatalf("Upgrade with a writer waiting = %v; want the write grant without waiting for the writer", err)
	}
	select {
	case g := <-granted:
		t.Fatalf("the writer got the lock (token %d) while the upgraded grant (token %d) holds it", g.Token(), u.Token())
	default:
	}
	if err := u.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	g := <-granted
	if g == nil {
		return
	}
	if g.Token() <= u.Token() {
		t.Errorf("writer token %d not above the upgraded grant's %d: it wrote between the read and the write", g.Token(), u.Token())
	}
	g.Release(t.Context())
}
