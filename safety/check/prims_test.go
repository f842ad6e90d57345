package check

import (
	"slices"
	"testing"

	"github.com/fencelock/fencelock/safety/history"
)

// semKnobs change the base semaphore scenario; each non-zero knob breaks
// one property.
type semKnobs struct {
	thirdAt int64 // S1: a third permit (slot 2) granted at this time
	// handover: c5 takes slot 0 10ms before c3's release is reported
	// (a hand-over measured late, within the slack): P3 and S1 hold.
	handover bool
	c3At     int64 // P5 and S2: when c3 takes the killed c1's slot (base 1150)
	c4At     int64 // S2: when c4 takes the paused c2's slot (base 2300)
}

var semConfig = Config{TTL: testConfig.TTL, Poll: testConfig.Poll, Slack: testConfig.Slack, Permits: 2}

// semScenario builds the history of a semaphore "s" of two permits (slot
// keys s/.permit/0 and s/.permit/1), times in ms: Acquire calls name the
// semaphore's key, grants the slot's. With zero knobs every property
// holds, and S1, S2 and P5 are each checked at least once.
func semScenario(k semKnobs) history.History {
	if k.c3At == 0 {
		k.c3At = 1150
	}
	if k.c4At == 0 {
		k.c4At = 2300
	}
	const s0, s1, s2 = "s/.permit/0", "s/.permit/1", "s/.permit/2"
	var b events
	add, harness := b.lease, b.harness
	write := func(t int64, proc, key, id string, tok uint64, accepted bool, reason string) {
		b.fence(t, key, id, tok, accepted, reason, "")
	}

	// c1 and c2 take both permits; c3 waits.
	add(0, "c1", history.AcquireStart, "s", "c1-1", 0, 0)
	add(10, "c1", history.Acquired, s0, "c1-1", 1, 910)
	add(5, "c2", history.AcquireStart, "s", "c2-1", 0, 0)
	add(15, "c2", history.Acquired, s1, "c2-1", 1, 915)
	add(20, "c3", history.AcquireStart, "s", "c3-1", 0, 0)
	add(50, "c1", history.Belief, s0, "c1-1", 1, 950)
	write(51, "c1", s0, "c1-1", 1, true, "newer")
	for t := int64(50); t < 1300; t += 200 {
		add(t, "c2", history.Belief, s1, "c2-1", 1, t+900)
		write(t+1, "c2", s1, "c2-1", 1, true, "newer")
	}

	// c1 is killed holding slot 0; c3 gets it once the record expired.
	harness(100, history.FaultStart, "c1", "holder kill")
	harness(100, history.Crash, "c1", "")
	harness(105, history.FaultEnd, "c1", "holder kill")
	add(k.c3At, "c3", history.Acquired, s0, "c3-1", 2, k.c3At+900)
	for t := k.c3At + 10; t < 3500; t += 200 {
		add(t, "c3", history.Belief, s0, "c3-1", 2, t+900)
		write(t+1, "c3", s0, "c3-1", 2, true, "newer")
	}

	// A third permit granted: S1's negative control.
	if k.thirdAt != 0 {
		add(k.thirdAt-5, "c6", history.AcquireStart, "s", "c6-1", 0, 0)
		add(k.thirdAt, "c6", history.Acquired, s2, "c6-1", 1, k.thirdAt+900)
		add(k.thirdAt+10, "c6", history.Belief, s2, "c6-1", 1, k.thirdAt+900)
		write(k.thirdAt+11, "c6", s2, "c6-1", 1, true, "newer")
	}

	// c2 is paused holding slot 1 (its last belief at 1290); c4, waiting,
	// takes slot 1 once c2's record expired; c2 wakes up, writes late and
	// notices the loss.
	add(1200, "c4", history.AcquireStart, "s", "c4-1", 0, 0)
	add(1290, "c2", history.Belief, s1, "c2-1", 1, 2190)
	harness(1300, history.FaultStart, "c2", "holder paused")
	harness(1300, history.Pause, "c2", "")
	add(k.c4At, "c4", history.Acquired, s1, "c4-1", 2, k.c4At+900)
	add(k.c4At+10, "c4", history.Belief, s1, "c4-1", 2, k.c4At+910)
	write(k.c4At+11, "c4", s1, "c4-1", 2, true, "newer")
	harness(3400, history.Resume, "c2", "")
	harness(3400, history.FaultEnd, "c2", "holder paused")
	write(3402, "c2", s1, "c2-1", 1, false, "stale")
	add(3405, "c2", history.Lost, s1, "c2-1", 1, 0)
	add(3410, "c4", history.Belief, s1, "c4-1", 2, 4310)
	write(3411, "c4", s1, "c4-1", 2, true, "same-lease")

	// c3 releases; c5 takes slot 0; both remaining holders release.
	add(3450, "c5", history.AcquireStart, "s", "c5-1", 0, 0)
	add(3500, "c3", history.ReleaseStart, s0, "c3-1", 2, 0)
	add(3505, "c3", history.Released, s0, "c3-1", 2, 0)
	c5At := int64(3510)
	if k.handover {
		c5At = 3490
	}
	add(c5At, "c5", history.Acquired, s0, "c5-1", 3, 4410)
	add(3520, "c5", history.Belief, s0, "c5-1", 3, 4420)
	write(3521, "c5", s0, "c5-1", 3, true, "newer")
	add(3600, "c4", history.ReleaseStart, s1, "c4-1", 2, 0)
	add(3605, "c4", history.Released, s1, "c4-1", 2, 0)
	add(3700, "c5", history.ReleaseStart, s0, "c5-1", 3, 0)
	add(3705, "c5", history.Released, s0, "c5-1", 3, 0)
	return b.h
}

func TestSemaphorePassingHistory(t *testing.T) {
	r := Check(semScenario(semKnobs{}), semConfig)
	if ids := failed(t, r); len(ids) != 0 {
		t.Fatalf("properties %v failed on a correct semaphore history", ids)
	}
	ids := []string{}
	for _, p := range r.Properties {
		ids = append(ids, p.ID)
	}
	if want := []string{"P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "S1", "S2"}; !slices.Equal(ids, want) {
		t.Fatalf("properties %v, want %v", ids, want)
	}
	for _, id := range []string{"P1", "P2", "P5", "P6", "S1", "S2"} {
		if p, _ := r.Property(id); p.Checked == 0 {
			t.Errorf("%s held vacuously", id)
		}
	}
	if p, _ := r.Property("S2"); p.Checked != 2 {
		t.Errorf("S2 checked %d cases, want 2 (the kill and the pause)", p.Checked)
	}
	if r.Stats.MaxHolders != 2 {
		t.Errorf("MaxHolders %d, want 2", r.Stats.MaxHolders)
	}
	if r.Stats.StaleAttempted != 1 || r.Stats.StaleAccepted != 0 {
		t.Errorf("stale writes %d attempted / %d accepted, want 1 / 0", r.Stats.StaleAttempted, r.Stats.StaleAccepted)
	}
	// Two believers of one slot within the slack: neither P3 nor S1.
	if r := Check(semScenario(semKnobs{handover: true}), semConfig); !r.OK() || r.Stats.MaxHolders != 2 || r.Stats.MaxOverlap == 0 {
		t.Errorf("late-measured hand-over: failed %v, max holders %d, max overlap %v", r.Failed(), r.Stats.MaxHolders, r.Stats.MaxOverlap)
	}
	// Without Permits, the same history is judged by P1..P8 alone.
	if r := Check(semScenario(semKnobs{}), testConfig); len(r.Properties) != 8 || !r.OK() {
		t.Errorf("without Permits: %d properties, failed %v", len(r.Properties), r.Failed())
	}
}

// TestSemaphoreAttemptsPaired checks that an Acquire call named by the
// semaphore's key ends with the grant of a slot key: no attempt is left
// open, and each lease knows when its Acquire began.
func TestSemaphoreAttemptsPaired(t *testing.T) {
	m := newModel(semScenario(semKnobs{}), semConfig.withDefaults())
	if len(m.tries["s"]) != 5 {
		t.Fatalf("%d attempts on s, want 5", len(m.tries["s"]))
	}
	for _, a := range m.tries["s"] {
		if a.end == never {
			t.Errorf("attempt of %s (%s) never ended", a.proc, a.lease)
		}
	}
	for id, l := range m.leases {
		if l.acquireStart < 0 {
			t.Errorf("lease %s: Acquire's start unknown", id)
		}
	}
}

func TestSemaphoreNegativeControls(t *testing.T) {
	cases := []struct {
		name string
		k    semKnobs
		want []string
	}{
		{"third permit", semKnobs{thirdAt: 1200}, []string{"S1"}},
		// The crash of c1: P5 (per slot, with the semaphore's waiters)
		// and S2 (the permit) both see that slot 0 came back late.
		{"killed holder's permit late", semKnobs{c3At: 1400}, []string{"P5", "S2"}},
		{"paused holder's permit late", semKnobs{c4At: 2600}, []string{"S2"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(semScenario(tc.k), semConfig)
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
