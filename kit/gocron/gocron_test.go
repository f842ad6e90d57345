package gocronlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	gocronlock "github.com/fencelock/fencelock/kit/gocron"
)

func newClient(t *testing.T, store *memory.Store) *fencelock.Client {
	t.Helper()
	c, err := fencelock.New(store.Backend(), &fencelock.Options{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// One instance's run of a job keeps the other instances' Lock of the same
// job refused, and after a fast run's Unlock, for the rest of MinHold.
func TestLockerRefusesRunHeldElsewhere(t *testing.T) {
	store := memory.NewStore()
	a := gocronlock.NewLocker(newClient(t, store), &gocronlock.LockerOptions{MinHold: time.Hour})
	b := gocronlock.NewLocker(newClient(t, store), nil)
	ctx := t.Context()
	lk, err := a.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if l := a.Lease("report"); l == nil || l.Key() != gocronlock.DefaultPrefix+"report" {
		t.Fatalf("Lease(report) = %v during the run", l)
	}
	if _, err := b.Lock(ctx, "report"); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("second instance's Lock during the run: %v, want ErrNotAcquired", err)
	}
	if _, err := b.Lock(ctx, "other"); err != nil {
		t.Fatalf("another job's Lock: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if l := a.Lease("report"); l != nil {
		t.Fatalf("Lease(report) = %v after the run", l)
	}
	if _, err := b.Lock(ctx, "report"); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatalf("Lock after a fast run within MinHold: %v, want ErrNotAcquired", err)
	}
}

// Without a minimum hold, the key is free as soon as the run unlocks.
func TestLockerWithoutMinHoldFreesAtUnlock(t *testing.T) {
	store := memory.NewStore()
	a := gocronlock.NewLocker(newClient(t, store), &gocronlock.LockerOptions{MinHold: -1})
	ctx := t.Context()
	lk, err := a.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lk, err = a.Lock(ctx, "report")
	if err != nil {
		t.Fatalf("Lock after Unlock without MinHold: %v", err)
	}
	_ = lk.Unlock(ctx)
}

// IsLeader is nil while the term's lease is held, an ErrNotLeader as soon
// as it is lost (the store unreachable past the lease's validity), nil
// again in the next term, and ErrNotLeader after Close.
func TestElectorIsLeaderFollowsLease(t *testing.T) {
	store := memory.NewStore()
	b := store.Backend()
	c, err := fencelock.New(b, &fencelock.Options{TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	started := make(chan *fencelock.Lease, 4)
	stopped := make(chan error, 4)
	e, err := gocronlock.NewElector(c, "leader", &gocronlock.ElectorOptions{
		OnStartedLeading: func(l *fencelock.Lease) { started <- l },
		OnStoppedLeading: func(err error) { stopped <- err },
		RetryDelay:       10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	first := <-started
	if err := e.IsLeader(ctx); err != nil {
		t.Fatalf("IsLeader in the first term: %v", err)
	}
	if e.Lease() != first {
		t.Fatalf("Lease() = %v, want the term's lease", e.Lease())
	}
	// Cut the client off: renewals fail, the lease runs out, and no
	// next term can start until the store is back.
	b.SetUnreachable(true)
	<-first.Done()
	if err := e.IsLeader(ctx); !errors.Is(err, gocronlock.ErrNotLeader) {
		t.Fatalf("IsLeader after the term's lease was lost: %v, want ErrNotLeader", err)
	}
	if err := <-stopped; !errors.Is(err, fencelock.ErrLeaseLost) {
		t.Fatalf("OnStoppedLeading(%v), want the loss", err)
	}
	if err := e.IsLeader(ctx); !errors.Is(err, gocronlock.ErrNotLeader) {
		t.Fatalf("IsLeader between terms: %v, want ErrNotLeader", err)
	}
	b.SetUnreachable(false)
	<-started
	if err := e.IsLeader(ctx); err != nil {
		t.Fatalf("IsLeader in the next term: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.IsLeader(ctx); !errors.Is(err, gocronlock.ErrNotLeader) {
		t.Fatalf("IsLeader after Close: %v, want ErrNotLeader", err)
	}
	if info, err := c.Inspect(ctx, "leader"); err != nil || info.Token != 0 {
		t.Fatalf("after Close the key is %+v, %v: want free", info, err)
	}
}

// Two Electors on one key: exactly one leads.
func TestElectorsOneLeader(t *testing.T) {
	store := memory.NewStore()
	started := make(chan *fencelock.Lease, 4)
	var es []*gocronlock.Elector
	for range 2 {
		e, err := gocronlock.NewElector(newClient(t, store), "leader", &gocronlock.ElectorOptions{
			OnStartedLeading: func(l *fencelock.Lease) { started <- l },
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		es = append(es, e)
	}
	<-started
	leaders := 0
	for _, e := range es {
		if e.IsLeader(t.Context()) == nil {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders, want 1", leaders)
	}
}
