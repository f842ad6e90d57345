package fence

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
	"github.com/fencelock/fencelock/safety/history"
)

// TestRWRule: a read-write lock's resource accepts reads at or above the
// last write's token and writes above every token seen (or the same
// writer again), logs the access, and keeps its state apart from the lock
// rule's.
func TestRWRule(t *testing.T) {
	s, c := start(t, true)
	steps := []struct {
		access, lease string
		token         uint64
		accepted      bool
		reason        string
	}{
		{AccessRead, "r1", 3, true, ReasonReadCurrent},
		{AccessRead, "r2", 4, true, ReasonReadCurrent},
		{AccessWrite, "w1", 4, false, ReasonEqualOtherLease}, // a reader presented 4
		{AccessWrite, "w1", 5, true, ReasonNewer},
		{AccessWrite, "w1", 5, true, ReasonSameLease},
		{AccessRead, "r1", 3, false, ReasonStale}, // entered before w1
		{AccessRead, "r3", 6, true, ReasonReadCurrent},
		{AccessWrite, "w1", 5, false, ReasonStale}, // a later grant has read
		{AccessRead, "r4", 5, true, ReasonReadCurrent},
		{AccessRead, "r5", 0, false, ReasonZeroToken},
		{AccessWrite, "w2", 7, true, ReasonNewer},
	}
	for i, st := range steps {
		d, err := c.Access(context.Background(), "rw", st.lease, "p", st.token, st.access)
		if err != nil {
			t.Fatal(err)
		}
		if d.Accepted != st.accepted || d.Reason != st.reason {
			t.Errorf("step %d: %s by %s with %d: accepted %v (%s), want %v (%s)", i, st.access, st.lease, st.token, d.Accepted, d.Reason, st.accepted, st.reason)
		}
	}
	// The lock rule's state of the same key is untouched.
	if d, err := c.Write(context.Background(), "rw", "l1", "p", 1); err != nil || !d.Accepted {
		t.Errorf("lock write after read-write accesses: %+v, %v", d, err)
	}
	log := s.Log()
	if log[0].Access != AccessRead || log[3].Access != AccessWrite || log[len(log)-1].Access != "" || log[0].Kind != history.Write {
		t.Errorf("logged accesses: %+v", log)
	}
	if _, err := c.Access(context.Background(), "rw", "x", "p", 1, "delete"); err == nil {
		t.Error("unknown access accepted")
	}
}

// TestRWRuleIsRWFence: on random sequences of reads and writes the
// resource decides as recipe.RWFence does.
func TestRWRuleIsRWFence(t *testing.T) {
	_, c := start(t, true)
	rng := rand.New(rand.NewPCG(1, 2))
	var ref recipe.RWFence
	for i := range 2000 {
		tok := uint64(rng.IntN(12))
		lease := []string{"a", "b", "c"}[rng.IntN(3)]
		access := AccessRead
		var want error
		if rng.IntN(2) == 0 {
			access = AccessWrite
			want = ref.CheckWrite("k", fencelock.Token(tok), lease)
		} else {
			want = ref.CheckRead("k", fencelock.Token(tok))
		}
		d, err := c.Access(context.Background(), "k", lease, "p", tok, access)
		if err != nil {
			t.Fatal(err)
		}
		if d.Accepted != (want == nil) {
			t.Fatalf("step %d: %s by %s with %d: accepted %v (%s); RWFence: %v", i, access, lease, tok, d.Accepted, d.Reason, want)
		}
	}
}
