package backendkit

import (
	"strconv"
	"testing"
	"time"
)

func TestHotSetExpires(t *testing.T) {
	h := &HotSet{TTL: 50 * time.Millisecond, Max: 10}
	if h.Hot("k") {
		t.Fatal("unmarked key is hot")
	}
	h.Mark("k")
	if !h.Hot("k") {
		t.Fatal("marked key is not hot")
	}
	time.Sleep(60 * time.Millisecond) // the TTL is the behaviour under test
	if h.Hot("k") {
		t.Fatal("key still hot after its TTL")
	}
	if h.Len() != 0 {
		t.Fatalf("expired key kept: Len %d", h.Len())
	}
}

func TestHotSetBounded(t *testing.T) {
	h := &HotSet{TTL: time.Hour, Max: 8}
	for i := range 100 {
		h.Mark(strconv.Itoa(i))
		if h.Len() > h.Max {
			t.Fatalf("Len %d above Max %d", h.Len(), h.Max)
		}
	}
	if !h.Hot("99") {
		t.Fatal("the latest key was dropped")
	}
	// Marking a key already present never drops the others.
	n := h.Len()
	h.Mark("99")
	if h.Len() != n {
		t.Fatalf("re-marking changed Len from %d to %d", n, h.Len())
	}
}

func TestOrphans(t *testing.T) {
	var o Orphans[string, int64]
	o.Add("a", 1)
	o.Add("b", 2)
	o.Add("c", 3)
	if got := len(o.Batch(2)); got != 2 {
		t.Fatalf("Batch(2) returned %d", got)
	}
	if got := len(o.Batch(0)); got != 3 {
		t.Fatalf("Batch(0) returned %d", got)
	}
	o.Add("a", 5) // a newer record for a
	o.Done("a", 1)
	if o.Len() != 3 {
		t.Fatal("Done with a stale value removed a newer record")
	}
	o.Done("a", 5)
	o.Done("b", 2)
	if o.Len() != 1 || !o.Any(func(k string, _ int64) bool { return k == "c" }) {
		t.Fatalf("pending after Done: %v", o.Batch(0))
	}
}
