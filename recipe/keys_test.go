package recipe_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/recipe"
)

// Keys names the records the recipes really take: a permit's lease is on
// one of the semaphore's slot keys, a write grant's leases are on the
// lock's gate and every reader slot, and each starts with the prefix.
func TestKeysNameTheRecordsRecipesTake(t *testing.T) {
	c := newClient(t, memory.NewStore().Backend(), nil)
	prefix, slots := recipe.Keys("pool", 3)
	sem, err := recipe.NewSemaphore(c, "pool", 3)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sem.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(t.Context())
	if !slices.Contains(slots, l.Key()) || !strings.HasPrefix(l.Key(), prefix) || len(slots) != 3 {
		t.Errorf("permit on %q; Keys = %q, %q", l.Key(), prefix, slots)
	}
	prefix, records := recipe.Keys("cfg", 0)
	rw, err := recipe.NewRWLock(c, "cfg")
	if err != nil {
		t.Fatal(err)
	}
	g, err := rw.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release(t.Context())
	var got []string
	for _, l := range g.Leases() {
		got = append(got, l.Key())
	}
	want := records[:1] // the gate, not the intent or the upgrade record
	if !slices.Equal(got, want) || len(records) != 3 {
		t.Errorf("write grant's leases on %q; want %q (Keys = %q)", got, want, records)
	}
	for _, r := range records {
		if !strings.HasPrefix(r, prefix) {
			t.Errorf("record %q does not start with the prefix %q", r, prefix)
		}
	}
}
