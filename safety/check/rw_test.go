package check

import (
	"slices"
	"testing"

	"github.com/fencelock/fencelock/safety/history"
)

// rwKnobs change the base read-write scenario; each non-zero knob breaks
// one property.
type rwKnobs struct {
	r2ReleaseAt int64  // W1: when reader r2 releases (base 210; w1 acquires at 220)
	w2Token     uint64 // W2: the second writer's token (base 10; r4 entered with 9)
	fencingOff  bool   // W3: the paused reader's late read is accepted
	w1LateWrite bool   // W3: w1 writes after r3, who came after it, has read
}

var rwConfig = Config{TTL: testConfig.TTL, Poll: testConfig.Poll, Slack: testConfig.Slack, RW: true}

// rwScenario builds the history of a read-write lock "L" (gate
// L/.rw/gate, reader slots L/.rw/r/0 and /1, resource "L"), times in ms.
// With zero knobs every property holds, and W1..W3 are each checked.
func rwScenario(k rwKnobs) history.History {
	if k.r2ReleaseAt == 0 {
		k.r2ReleaseAt = 210
	}
	if k.w2Token == 0 {
		k.w2Token = 10
	}
	const gate, s0, s1 = "L/.rw/gate", "L/.rw/r/0", "L/.rw/r/1"
	var b events
	add, harness := b.lease, b.harness
	access := func(t int64, id, what string, tok uint64, accepted bool, reason string) {
		b.fence(t, "L", id, tok, accepted, reason, what)
	}
	// Two readers share the lock; a writer waits for the gate, then for them.
	add(0, "c1", history.AcquireStart, "L", "r1", 0, 0)
	add(10, "c1", history.Acquired, s0, "r1", 5, 910)
	add(5, "c2", history.AcquireStart, "L", "r2", 0, 0)
	add(15, "c2", history.Acquired, s1, "r2", 6, 915)
	add(20, "c1", history.Belief, s0, "r1", 5, 920)
	access(21, "r1", "read", 5, true, "read-current")
	add(24, "c2", history.Belief, s1, "r2", 6, 924)
	access(25, "r2", "read", 6, true, "read-current")
	add(30, "c3", history.AcquireStart, gate, "w1", 0, 0)
	add(200, "c1", history.ReleaseStart, s0, "r1", 5, 0)
	add(205, "c1", history.Released, s0, "r1", 5, 0)
	add(k.r2ReleaseAt, "c2", history.ReleaseStart, s1, "r2", 6, 0)
	add(k.r2ReleaseAt+5, "c2", history.Released, s1, "r2", 6, 0)
	add(220, "c3", history.Acquired, gate, "w1", 7, 1120)
	add(230, "c3", history.Belief, gate, "w1", 7, 1130)
	access(231, "w1", "write", 7, true, "newer")

	// Readers after the writer enter with higher tokens.
	add(250, "c1", history.AcquireStart, "L", "r3", 0, 0)
	add(300, "c2", history.AcquireStart, "L", "r4", 0, 0)
	add(400, "c3", history.ReleaseStart, gate, "w1", 7, 0)
	add(405, "c3", history.Released, gate, "w1", 7, 0)
	add(410, "c1", history.Acquired, s0, "r3", 8, 1310)
	add(412, "c2", history.Acquired, s1, "r4", 9, 1312)
	add(420, "c1", history.Belief, s0, "r3", 8, 1320)
	access(421, "r3", "read", 8, true, "read-current")
	if k.w1LateWrite {
		access(430, "w1", "write", 7, true, "newer")
	}

	// Reader r4 is paused; writer w2 gets the lock once r4's slot
	// expired, and writes; r4 wakes up and reads late.
	add(450, "c3", history.AcquireStart, gate, "w2", 0, 0)
	add(500, "c2", history.Belief, s1, "r4", 9, 1400)
	harness(501, history.FaultStart, "c2", "holder paused")
	harness(501, history.Pause, "c2", "")
	add(600, "c1", history.ReleaseStart, s0, "r3", 8, 0)
	add(605, "c1", history.Released, s0, "r3", 8, 0)
	add(1450, "c3", history.Acquired, gate, "w2", k.w2Token, 2350)
	add(1455, "c3", history.Belief, gate, "w2", k.w2Token, 2355)
	access(1460, "w2", "write", k.w2Token, true, "newer")
	harness(2500, history.Resume, "c2", "")
	harness(2500, history.FaultEnd, "c2", "holder paused")
	if k.fencingOff {
		access(2502, "r4", "read", 9, true, "stale")
	} else {
		access(2502, "r4", "read", 9, false, "stale")
	}
	add(2505, "c2", history.Lost, s1, "r4", 9, 0)
	add(2550, "c3", history.ReleaseStart, gate, "w2", k.w2Token, 0)
	add(2555, "c3", history.Released, gate, "w2", k.w2Token, 0)
	add(2600, "c1", history.AcquireStart, "L", "r5", 0, 0)
	add(2700, "c1", history.Acquired, s0, "r5", 11, 3600)
	add(2710, "c1", history.Belief, s0, "r5", 11, 3610)
	access(2711, "r5", "read", 11, true, "read-current")
	add(2800, "c1", history.ReleaseStart, s0, "r5", 11, 0)
	add(2805, "c1", history.Released, s0, "r5", 11, 0)
	return b.h
}

func TestRWPassingHistory(t *testing.T) {
	r := Check(rwScenario(rwKnobs{}), rwConfig)
	if ids := failed(t, r); len(ids) != 0 {
		t.Fatalf("properties %v failed on a correct read-write history", ids)
	}
	var ids []string
	for _, p := range r.Properties {
		ids = append(ids, p.ID)
	}
	if want := []string{"P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "W1", "W2", "W3"}; !slices.Equal(ids, want) {
		t.Fatalf("properties %v, want %v", ids, want)
	}
	for _, id := range []string{"W1", "W2", "W3", "P6"} {
		if p, _ := r.Property(id); p.Checked == 0 {
			t.Errorf("%s held vacuously", id)
		}
	}
	if p, _ := r.Property("P1"); p.Checked != 0 {
		t.Errorf("P1 judged %d read-write accesses; they are W3's", p.Checked)
	}
	if r.Stats.MaxHolders != 2 || r.Stats.StaleAttempted != 1 || r.Stats.StaleAccepted != 0 {
		t.Errorf("max readers %d, stale %d attempted / %d accepted; want 2, 1 / 0", r.Stats.MaxHolders, r.Stats.StaleAttempted, r.Stats.StaleAccepted)
	}
	// Every Acquire call is paired with its grant, a reader's too.
	m := newModel(rwScenario(rwKnobs{}), rwConfig.withDefaults())
	for id, l := range m.leases {
		if l.acquireStart < 0 {
			t.Errorf("lease %s: Acquire's start unknown", id)
		}
	}
}

func TestRWNegativeControls(t *testing.T) {
	cases := []struct {
		name string
		k    rwKnobs
		want []string
	}{
		{"reader overlaps writer", rwKnobs{r2ReleaseAt: 400}, []string{"W1"}},
		// Released 30 ms after the writer's grant: within the slack, but
		// a released reader was still inside.
		{"released reader overlaps writer briefly", rwKnobs{r2ReleaseAt: 250}, []string{"W1"}},
		{"writer token not above readers", rwKnobs{w2Token: 8}, []string{"W2"}},
		{"late read accepted", rwKnobs{fencingOff: true}, []string{"W3"}},
		{"late write accepted", rwKnobs{w1LateWrite: true}, []string{"W3"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(rwScenario(tc.k), rwConfig)
			if got := r.Failed(); !slices.Equal(got, tc.want) {
				t.Errorf("failed %v, want %v", got, tc.want)
				for _, id := range got {
					p, _ := r.Property(id)
					for _, v := range p.Violations {
						t.Log(v)
					}
				}
			}
		})
	}
}
