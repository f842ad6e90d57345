package recipe_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"github.com/fencelock/fencelock/recipe"
)

// TestObserveReadsAreBoundedOnASilentStore checks that Observe's first
// read of the leader, and Leader, end within Options.TTL on a store that
// stops answering, naming the silence, as Inspect does.
func TestObserveReadsAreBoundedOnASilentStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		b := newFaulty(store)
		c := newClient(t, b.Backend(), boundOpts())
		b.SetAll(silent)
		var err error
		within(t, b, c, 15*time.Second, "Observe(Background) on a silent store", func() {
			_, err = recipe.Observe(context.Background(), c, "k")
		})
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer") {
			t.Errorf("Observe = %v; want DeadlineExceeded saying the store did not answer", err)
		}
		within(t, b, c, 15*time.Second, "Leader(Background) on a silent store", func() {
			_, err = recipe.CurrentLeader(context.Background(), c, "k")
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Leader = %v; want DeadlineExceeded", err)
		}
		b.SetAll(nil)
	})
}

// Close ends a read-write lock's Lock while the gate's acquire attempt
// (nested in the lock's begin) is in flight, and the store grants the gate
// during the grace period: the lock returns ErrClosed and leaves nothing
// (the commit's own generative failure: a gate left held after Close).
func TestCloseDuringNestedGateAttempt(t *testing.T) {
	for _, write := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			store := memory.NewStore()
			gate := make(chan struct{})
			f := fakebackend.New(store.Backend(), fakebackend.Plain)
			// Every acquire request (the gate's first) reaches the
			// store only when gate opens, whether or not its sender
			// still waits.
			sent := lateStore(f, store, 1, gate)
			c, err := fencelock.New(f.Backend(), nil)
			if err != nil {
				t.Fatal(err)
			}
			rw, err := recipe.NewRWLock(c, "doc")
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				var g *recipe.RWGrant
				var err error
				if write {
					g, err = rw.Lock(t.Context())
				} else {
					g, err = rw.RLock(t.Context())
				}
				if g != nil {
					t.Errorf("write %v: got a grant from a closed client", write)
				}
				got <- err
			}()
			<-sent
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			synctest.Wait()
			close(gate)
			if err := <-got; !errors.Is(err, fencelock.ErrClosed) {
				t.Errorf("write %v: lock = %v; want ErrClosed", write, err)
			}
			if err := <-closed; err != nil {
				t.Errorf("write %v: Close = %v", write, err)
			}
			synctest.Wait()
			revStoreEmpty(t, store)
		})
	}
}

// lateStore is f.LateAcquires, the late requests landing in store.
func lateStore(f *fakebackend.Fake, store *memory.Store, n int, gate <-chan struct{}) (sent <-chan struct{}) {
	return f.LateAcquires(n, gate, store.Backend())
}

// revStoreEmpty fails the test if the store holds any record.
func revStoreEmpty(t *testing.T, store *memory.Store) {
	t.Helper()
	infos, err := store.Backend().List(context.Background(), "")
	if err != nil || len(infos) != 0 {
		t.Fatalf("List = %+v, %v; want an empty store", infos, err)
	}
}
