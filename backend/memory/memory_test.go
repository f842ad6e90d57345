package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
)

// TestConformance runs the suite on the memory backend, every capability
// included. (conformance/memory_test.go also runs it without them.)
func TestConformance(t *testing.T) {
	store := memory.NewStore()
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Backend, error) { return store.Backend(), nil },
	})
}

func acquire(t *testing.T, b driver.Backend, key, owner string) (driver.Grant, error) {
	t.Helper()
	return b.Acquire(t.Context(), driver.AcquireRequest{Key: key, Owner: owner, TTL: time.Minute})
}

// TestConstructors: New gives a private store; the Backends of one Store
// (NewStore) see each other's locks; Named gives one store per name for
// the whole process, which is what the mem://NAME URL opens.
func TestConstructors(t *testing.T) {
	if _, err := acquire(t, memory.New(), "k", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(t, memory.New(), "k", "b"); err != nil {
		t.Fatalf("New's stores are not private: %v", err)
	}

	s := memory.NewStore()
	if _, err := acquire(t, s.Backend(), "k", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(t, s.Backend(), "k", "b"); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("second Backend of one Store: %v; want ErrNotAcquired", err)
	}

	name := t.Name()
	if memory.Named(name) != memory.Named(name) || memory.Named(name) == memory.Named(name+"-other") {
		t.Fatal("Named does not give one store per name")
	}
	c, err := fencelock.Open(t.Context(), memory.Scheme+"://"+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(t.Context(), "url")
	if err != nil {
		t.Fatal(err)
	}
	info, err := memory.Named(name).Backend().Inspect(t.Context(), "url")
	if err != nil || info.Owner != l.Owner() {
		t.Fatalf("the mem:// URL's lock is not in Named(%q): %+v, %v", name, info, err)
	}
}

// TestTestTools: Expire frees a key without telling the holder, and a
// Backend cut off with SetUnreachable fails every call with ErrUnreachable.
func TestTestTools(t *testing.T) {
	s := memory.NewStore()
	b := s.Backend()
	g, err := acquire(t, b, "k", "a")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Expire("k") {
		t.Fatal("Expire found no record")
	}
	if _, err := b.Renew(t.Context(), g, driver.RenewRequest{TTL: time.Minute}); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Renew after Expire: %v; want ErrNotHeld", err)
	}
	g2, err := acquire(t, b, "k", "b")
	if err != nil || g2.Token <= g.Token {
		t.Fatalf("acquire after Expire: %+v, %v; want a higher token than %d", g2, err, g.Token)
	}
	b.SetUnreachable(true)
	if _, err := b.Inspect(t.Context(), "k"); !errors.Is(err, memory.ErrUnreachable) {
		t.Fatalf("Inspect while unreachable: %v", err)
	}
	b.SetUnreachable(false)
	if info, err := b.Inspect(t.Context(), "k"); err != nil || info.Owner != "b" {
		t.Fatalf("Inspect after reconnecting: %+v, %v", info, err)
	}
}
