package check

import (
	"testing"

	"github.com/fencelock/fencelock/safety/history"
)

// multiScenario builds the history of one process's multi-key calls on
// keys A and B (times in ms): a grant of both, then a try that takes A,
// is refused B, and gives A back. partial hands the try's A out alone;
// keep leaves the try's record of A held.
func multiScenario(partial, keep bool) history.History {
	var b events
	add := b.lease
	store := func(t int64, kind history.Kind, key, owner string) {
		b.h = append(b.h, history.Event{T: t * ms, Proc: "c1", Kind: kind, Key: key, Note: owner})
	}
	acquired := func(t int64, key, id, owner string, tok uint64) {
		b.h = append(b.h, history.Event{T: t * ms, Proc: "c1", Kind: history.Acquired, Key: key, Lease: id, Token: tok, Until: (t + 900) * ms, Note: owner})
	}
	add(0, "c1", history.AcquireStart, "A", "c1-1.1", 0, 0)
	add(0, "c1", history.AcquireStart, "B", "c1-1.2", 0, 0)
	store(5, history.StoreAcquired, "A", "o1")
	store(8, history.StoreAcquired, "B", "o2")
	acquired(10, "A", "c1-1.1", "o1", 1)
	acquired(10, "B", "c1-1.2", "o2", 1)
	add(100, "c1", history.ReleaseStart, "A", "c1-1.1", 1, 0)
	add(100, "c1", history.ReleaseStart, "B", "c1-1.2", 1, 0)
	store(101, history.StoreReleased, "A", "o1")
	store(101, history.StoreReleased, "B", "o2")
	add(105, "c1", history.Released, "A", "c1-1.1", 1, 0)
	add(105, "c1", history.Released, "B", "c1-1.2", 1, 0)

	add(200, "c1", history.AcquireStart, "A", "c1-2.1", 0, 0)
	add(200, "c1", history.AcquireStart, "B", "c1-2.2", 0, 0)
	store(205, history.StoreAcquired, "A", "o3")
	if !keep {
		store(208, history.StoreReleased, "A", "o3")
	}
	if partial {
		acquired(210, "A", "c1-2.1", "o3", 2)
	} else {
		add(210, "c1", history.AcquireFailed, "A", "c1-2.1", 0, 0)
	}
	add(210, "c1", history.AcquireFailed, "B", "c1-2.2", 0, 0)
	return b.h
}

// M1 holds when every call hands out all its keys or gives back what it
// took, and fails on a partial grant handed out or a record left held.
func TestAllOrNothingM1(t *testing.T) {
	cfg := testConfig
	cfg.Multi = true
	for _, tc := range []struct {
		name          string
		partial, keep bool
		ok            bool
	}{
		{"whole grant and clean refusal", false, false, true},
		{"partial grant handed out", true, false, false},
		{"refused call keeps a record", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := Check(multiScenario(tc.partial, tc.keep), cfg).Property("M1")
			if !ok {
				t.Fatal("no M1 with Config.Multi")
			}
			if p.Checked != 2 || p.OK != tc.ok {
				t.Errorf("M1: checked %d, OK %v (%v); want 2 calls checked, OK %v", p.Checked, p.OK, p.Violations, tc.ok)
			}
		})
	}
}

// U1 fails on an upgrade that outlasts the progress bound, and holds on
// one that ends within it.
func TestUpgradesEndU1(t *testing.T) {
	cfg := testConfig
	cfg.RW, cfg.Upgrade = true, true
	bound := int64(3*cfg.TTL+cfg.Poll+cfg.Slack) / ms
	for _, tc := range []struct {
		name string
		took int64
		ok   bool
	}{{"prompt", 300, true}, {"waited for a writer", bound + 500, false}} {
		t.Run(tc.name, func(t *testing.T) {
			var b events
			const gate, s0 = "L/.rw/gate", "L/.rw/r/0"
			b.lease(0, "c1", history.AcquireStart, "L", "c1-1", 0, 0)
			b.lease(10, "c1", history.Acquired, s0, "c1-1", 5, 910)
			b.lease(100, "c1", history.ReleaseStart, s0, "c1-1", 5, 0)
			b.lease(100, "c1", history.AcquireStart, gate, "c1-1u", 0, 0)
			b.lease(100+tc.took, "c1", history.Released, s0, "c1-1", 5, 0)
			b.lease(100+tc.took, "c1", history.Acquired, gate, "c1-1u", 6, 100+tc.took+900)
			b.lease(200+tc.took, "c1", history.ReleaseStart, gate, "c1-1u", 6, 0)
			b.lease(2*bound+1000, "c2", history.AcquireStart, "L", "c2-1", 0, 0)
			p, _ := Check(b.h, cfg).Property("U1")
			if p.Checked != 1 || p.OK != tc.ok {
				t.Errorf("U1: checked %d, OK %v (%v); want 1 upgrade checked, OK %v", p.Checked, p.OK, p.Violations, tc.ok)
			}
		})
	}
}
