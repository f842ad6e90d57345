package fakebackend_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// Every set of capabilities is shown exactly: no more (a hidden Watcher
// would still make the engine wait by notification), no fewer.
func TestBackendShowsExactlyItsCaps(t *testing.T) {
	for c := range fakebackend.Caps(1 << 10) {
		b := fakebackend.New(memory.New(), c).Backend()
		if got := fakebackend.CapsOf(b); got != c {
			t.Errorf("New(_, %010b).Backend() shows %010b", c, got)
		}
	}
	if got := fakebackend.CapsOf(memory.New()); got != fakebackend.Memory {
		t.Errorf("the memory backend shows %010b; Memory is %010b", got, fakebackend.Memory)
	}
}

func TestViewsAreGenerated(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generator")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gen.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "run", "gen.go")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run gen.go: %v\n%s", err, out)
	}
	want, _ := os.ReadFile(filepath.Join(dir, "views.go"))
	got, _ := os.ReadFile("views.go")
	if !bytes.Equal(got, want) {
		t.Error("views.go is stale: run go generate in internal/fakebackend")
	}
}

// A fault runs before the store (the store never sees a failed request);
// a late fault after it (the store applied the request whose answer
// failed); counts include both.
func TestFaultsRunBeforeAndAfterTheStore(t *testing.T) {
	store := memory.NewStore()
	f := fakebackend.New(store.Backend(), fakebackend.Plain)
	b := f.Backend()
	boom := errors.New("boom")
	f.Set(fakebackend.Acquire, fakebackend.FailOnce(boom))
	req := driver.AcquireRequest{Key: "k", Owner: "o", TTL: time.Minute}
	if _, err := b.Acquire(t.Context(), req); !errors.Is(err, boom) {
		t.Fatalf("Acquire = %v; want the fault's error", err)
	}
	if info, _ := store.Backend().Inspect(t.Context(), "k"); info.Owner != "" {
		t.Fatalf("a request failed before the store was applied: %+v", info)
	}
	f.SetLate(fakebackend.Acquire, fakebackend.FailOnce(boom))
	if _, err := b.Acquire(t.Context(), req); !errors.Is(err, boom) {
		t.Fatalf("Acquire = %v; want the late fault's error", err)
	}
	if info, _ := store.Backend().Inspect(t.Context(), "k"); info.Owner != "o" {
		t.Fatalf("a request whose answer was lost was not applied: %+v", info)
	}
	if n := f.Calls(fakebackend.Acquire); n != 2 {
		t.Errorf("Calls(Acquire) = %d; want 2", n)
	}
}

// A gate holds a request until opened, and says when one reached it;
// LetGo ends a fault's wait.
func TestGateHoldsUntilOpenAndLetGoEndsWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fakebackend.New(memory.New(), fakebackend.Memory)
		g := fakebackend.NewGate()
		f.Set(fakebackend.Inspect, g.Fault())
		done := make(chan error, 1)
		go func() { _, err := f.Backend().Inspect(context.Background(), "k"); done <- err }()
		<-g.Reached()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Inspect returned %v through a closed gate", err)
		default:
		}
		g.Open()
		if err := <-done; err != nil {
			t.Fatalf("Inspect through an open gate = %v", err)
		}
		f.Set(fakebackend.List, fakebackend.Silent)
		go func() { _, err := f.Backend().List(context.Background(), ""); done <- err }()
		synctest.Wait()
		f.LetGo()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("List on a silent store after LetGo = %v; want Canceled", err)
		}
	})
}

// The emulated AcquireWait takes the key once its holder releases it.
func TestEmulatedWaitTakesKeyOnRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memory.NewStore()
		mb := store.Backend()
		h, err := mb.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Owner: "h", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		w := fakebackend.New(store.Backend(), fakebackend.Waiter).Backend().(driver.Waiter)
		got := make(chan error, 1)
		go func() {
			_, err := w.AcquireWait(t.Context(), driver.AcquireRequest{Key: "k", Owner: "w", TTL: time.Hour})
			got <- err
		}()
		time.Sleep(time.Minute)
		if err := mb.Release(t.Context(), h); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("AcquireWait = %v", err)
		}
	})
}

// A Fake showing Guarantor answers with the wrapped backend's
// measurements, which the engine's guarantee check then reports.
func TestGuarantorForwardsTheStoresMeasurements(t *testing.T) {
	mb := memory.New()
	want, err := mb.Guarantees(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b := fakebackend.New(mb, fakebackend.Guarantor).Backend()
	got, err := b.(driver.Guarantor).Guarantees(context.Background())
	if err != nil || len(got) != len(want) {
		t.Fatalf("Guarantees = %v, %v; want the memory backend's %v", got, err, want)
	}
	for g, m := range want {
		if got[g] != m {
			t.Errorf("Guarantees[%s] = %+v; want %+v", g, got[g], m)
		}
	}
}
