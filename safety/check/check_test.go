package check

import (
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/safety/history"
)

const ms = int64(time.Millisecond)

var testConfig = Config{TTL: time.Second, Poll: 100 * time.Millisecond, Slack: 100 * time.Millisecond}

// knobs change the base scenario; each non-zero knob breaks one property.
type knobs struct {
	fencingOff     bool   // P1: the paused holder's late write is accepted
	c3Token        uint64 // P2: token of the lease after the pause (base 30)
	c2AcquiredAt   int64  // P3: when c2 acquires (base 210, c1 believes until 200)
	c2Until        int64  // P4: Until c2 reports before its pause (base 1199)
	c1ReacquireAt  int64  // P5: when c1 gets the key after c3's crash (base 2700)
	stuckTail      bool   // P6: a fault after which nobody acquires
	staleOpLoss    bool   // P7: the holder loses its lease right after a stale release
	staleOpThird   bool   // P7: a third lease acquires right after a stale release
	c4AcquireDelay int64  // P8: c4's wait after the ambiguous acquire (base 950)
}

// scenario builds a history of one key "k", times in ms (see the comments);
// with zero knobs every property holds and each is checked at least once.
func scenario(k knobs) history.History {
	def := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&k.c2AcquiredAt, 210)
	def(&k.c2Until, 1199)
	def(&k.c1ReacquireAt, 2700)
	def(&k.c4AcquireDelay, 950)
	if k.c3Token == 0 {
		k.c3Token = 30
	}
	var h history.History
	ev := func(t int64, proc string, kind history.Kind, f func(*history.Event)) {
		e := history.Event{T: t * ms, Proc: proc, Kind: kind, Key: "k"}
		if f != nil {
			f(&e)
		}
		h = append(h, e)
	}
	lease := func(id string, tok uint64, until int64) func(*history.Event) {
		return func(e *history.Event) { e.Lease, e.Token, e.Until = id, tok, until*ms }
	}
	write := func(t int64, proc, id string, tok uint64, accepted bool, reason string, fencing bool) {
		ev(t, proc, history.Write, func(e *history.Event) {
			e.Lease, e.Token, e.Accepted, e.Reason, e.Fencing = id, tok, accepted, reason, fencing
		})
	}
	fault := func(t int64, kind history.Kind, proc, note string) {
		e := history.Event{T: t * ms, Proc: proc, Kind: kind, Note: note}
		h = append(h, e)
	}

	// c1 holds, c2 waits; c1 releases and c2 takes over.
	ev(0, "c1", history.AcquireStart, nil)
	ev(10, "c1", history.Acquired, lease("c1-1", 10, 910))
	ev(20, "c2", history.AcquireStart, nil)
	ev(50, "c1", history.Belief, lease("c1-1", 10, 950))
	write(51, "c1", "c1-1", 10, true, "newer", true)
	ev(100, "c1", history.Belief, lease("c1-1", 10, 1000))
	write(101, "c1", "c1-1", 10, true, "same-lease", true)
	ev(200, "c1", history.ReleaseStart, lease("c1-1", 10, 0))
	ev(205, "c1", history.Released, lease("c1-1", 10, 0))
	ev(k.c2AcquiredAt, "c2", history.Acquired, lease("c2-1", 20, k.c2AcquiredAt+900))
	ev(220, "c2", history.Belief, lease("c2-1", 20, 1120))
	write(221, "c2", "c2-1", 20, true, "newer", true)

	// c2 is paused right after checking its lease; c3 takes over once
	// c2's lease has run out; c2 wakes up and writes late.
	ev(299, "c2", history.Belief, lease("c2-1", 20, k.c2Until))
	fault(300, history.FaultStart, "c2", "holder-pause")
	fault(300, history.Pause, "c2", "")
	ev(400, "c3", history.AcquireStart, nil)
	ev(1250, "c3", history.Acquired, lease("c3-1", k.c3Token, 2150))
	ev(1260, "c3", history.Belief, lease("c3-1", k.c3Token, 2160))
	write(1261, "c3", "c3-1", k.c3Token, true, "newer", true)
	fault(1500, history.Resume, "c2", "")
	fault(1500, history.FaultEnd, "c2", "holder-pause")
	if k.fencingOff {
		write(1502, "c2", "c2-1", 20, true, "stale", false)
	} else {
		write(1502, "c2", "c2-1", 20, false, "stale", true)
	}
	ev(1505, "c2", history.Lost, lease("c2-1", 20, 0))
	ev(1600, "c3", history.Belief, lease("c3-1", k.c3Token, 2500))
	write(1601, "c3", "c3-1", k.c3Token, true, "same-lease", true)

	// c3 is killed while holding; c1, waiting, gets the key after the TTL.
	ev(1700, "c1", history.AcquireStart, nil)
	fault(1800, history.FaultStart, "c3", "holder-crash")
	fault(1800, history.Crash, "c3", "")
	fault(1810, history.FaultEnd, "c3", "holder-crash")
	r := k.c1ReacquireAt
	ev(r, "c1", history.Acquired, lease("c1-2", 40, r+900))
	ev(r+10, "c1", history.Belief, lease("c1-2", 40, r+910))
	write(r+11, "c1", "c1-2", 40, true, "newer", true)

	// c2 sends its old grant's release straight to the backend.
	ev(r+100, "c2", history.StaleOp, func(e *history.Event) { e.Lease, e.Token, e.Note = "c2-1", 20, "release" })
	if k.staleOpLoss {
		ev(r+150, "c1", history.Lost, lease("c1-2", 40, 0))
	}
	if k.staleOpThird {
		ev(r+150, "c5", history.Acquired, lease("c5-1", 45, r+1050))
	}
	ev(r+200, "c1", history.Belief, lease("c1-2", 40, r+1100))
	write(r+201, "c1", "c1-2", 40, true, "same-lease", true)
	ev(r+300, "c1", history.ReleaseStart, lease("c1-2", 40, 0))
	ev(r+305, "c1", history.Released, lease("c1-2", 40, 0))

	// c2's acquire loses its reply (token 50 may be held by nobody);
	// c4, waiting, gets the key once that grant has expired.
	ev(r+400, "c2", history.AcquireStart, nil)
	ev(r+450, "c4", history.AcquireStart, nil)
	ev(r+500, "c2", history.AcquireFailed, func(e *history.Event) { e.Ambiguous, e.Err = true, "reply dropped" })
	a := r + 500 + k.c4AcquireDelay
	ev(a, "c4", history.Acquired, lease("c4-1", 60, a+900))
	ev(a+10, "c4", history.Belief, lease("c4-1", 60, a+910))
	write(a+11, "c4", "c4-1", 60, true, "newer", true)
	ev(a+150, "c4", history.ReleaseStart, lease("c4-1", 60, 0))
	ev(a+155, "c4", history.Released, lease("c4-1", 60, 0))

	if k.stuckTail {
		// A fault after which a contender tries for seconds in vain.
		fault(a+200, history.FaultStart, "", "store-pause")
		fault(a+300, history.FaultEnd, "", "store-pause")
		ev(a+310, "c5", history.AcquireStart, nil)
		ev(a+4000, "c5", history.AcquireFailed, func(e *history.Event) { e.Err = "context deadline exceeded" })
	}
	return h
}

func failed(t *testing.T, r Result) []string {
	t.Helper()
	ids := r.Failed()
	for _, id := range ids {
		p, _ := r.Property(id)
		for _, v := range p.Violations {
			t.Logf("%s %s: %s", p.ID, p.Name, v)
		}
	}
	return ids
}

// TestPassingHistory checks that the base scenario satisfies every
// property and exercises each of them (no property holds vacuously).
func TestPassingHistory(t *testing.T) {
	r := Check(scenario(knobs{}), testConfig)
	if ids := failed(t, r); len(ids) != 0 {
		t.Fatalf("properties %v failed on a correct history", ids)
	}
	if len(r.Properties) != 8 {
		t.Fatalf("%d properties, want 8", len(r.Properties))
	}
	for i, p := range r.Properties {
		if want := "P" + string(rune('1'+i)); p.ID != want {
			t.Errorf("Properties[%d].ID = %s, want %s", i, p.ID, want)
		}
		if p.Checked == 0 {
			t.Errorf("%s (%s) checked nothing on the base scenario", p.ID, p.Name)
		}
		if p.Name == "" || p.Rule == "" {
			t.Errorf("%s has no name or rule", p.ID)
		}
	}
	st := r.Stats
	want := Stats{
		Span: 4305 * time.Millisecond, Keys: 1, Acquisitions: 5, AcquireFailures: 1, Ambiguous: 1,
		Releases: 3, Losses: 1, Faults: 2, Crashes: 1, Pauses: 1, StaleOps: 1,
		Writes: 9, WritesAccepted: 8, StaleAttempted: 1, Tokens: 5, MaxToken: 60,
		DetectionMargin: Dist{N: 1, Min: 51 * time.Millisecond, P50: 51 * time.Millisecond, P99: 51 * time.Millisecond, Max: 51 * time.Millisecond},
		OrphanTime:      Dist{N: 2, Min: 900 * time.Millisecond, P50: 900 * time.Millisecond, P99: 950 * time.Millisecond, Max: 950 * time.Millisecond},
		// The pause's FaultEnd is followed by the crash fault before any
		// acquisition: only the crash's recovery is measured.
		Recovery: Dist{N: 1, Min: 890 * time.Millisecond, P50: 890 * time.Millisecond, P99: 890 * time.Millisecond, Max: 890 * time.Millisecond},
	}
	if st != want {
		t.Errorf("stats:\n got %+v\nwant %+v", st, want)
	}
}

// TestOrderIndependent checks that Check sorts its input.
func TestOrderIndependent(t *testing.T) {
	h := scenario(knobs{fencingOff: true})
	want := Check(h, testConfig)
	rand.New(rand.NewSource(1)).Shuffle(len(h), func(i, j int) { h[i], h[j] = h[j], h[i] })
	// Shuffling reorders events with equal T; the scenario has one such
	// pair (FaultStart and Pause at 300ms) whose order does not matter.
	got := Check(h, testConfig)
	if !slices.Equal(got.Failed(), want.Failed()) || got.Stats != want.Stats {
		t.Errorf("shuffled history: failed %v stats %+v, want %v %+v", got.Failed(), got.Stats, want.Failed(), want.Stats)
	}
}

// TestNegativeControls breaks each property in turn and checks that the
// checker flags exactly that property (or, where one fault necessarily
// breaks two, at least that one): a checker that cannot fail is worth
// nothing.
func TestNegativeControls(t *testing.T) {
	cases := []struct {
		name  string
		k     knobs
		want  []string // exactly these fail
		match string   // text every violation of the first property contains
	}{
		{"P1 fencing off accepts the paused holder's late write", knobs{fencingOff: true}, []string{"P1"}, "write of lease c2-1 (token 20) accepted"},
		{"P2 token issued twice", knobs{c3Token: 20}, []string{"P2"}, "token 20"},
		{"P2 token goes backwards", knobs{c3Token: 15}, []string{"P2"}, "not above token 20"},
		{"P3 new holder acquires before the old one released", knobs{c2AcquiredAt: 50}, []string{"P3"}, "overlap by 150ms"},
		{"P4 holder believes past the next acquisition", knobs{c2Until: 1300}, []string{"P4"}, "margin -50ms"},
		{"P5 crashed holder's key stranded", knobs{c1ReacquireAt: 3100}, []string{"P5"}, "1.3s > 1.2s"},
		{"P6 no progress after a fault", knobs{stuckTail: true}, []string{"P6"}, "no lease acquired and no write accepted"},
		{"P7 stale release ends the holder's lease", knobs{staleOpLoss: true}, []string{"P7"}, "lost its lease"},
		{"P7 third lease acquires after a stale release", knobs{staleOpThird: true}, []string{"P3", "P7"}, "lease c5-1 acquired"},
		{"P8 ambiguous acquire strands the key", knobs{c4AcquireDelay: 1300}, []string{"P8"}, "stranded 1.3s > 1.2s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(scenario(tc.k), testConfig)
			got := failed(t, r)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("failed properties %v, want %v", got, tc.want)
			}
			id := tc.name[:2]
			p, _ := r.Property(id)
			if p.Count == 0 || len(p.Violations) == 0 {
				t.Fatalf("%s failed without violations: %+v", id, p)
			}
			for _, v := range p.Violations {
				if !strings.Contains(v.Msg, tc.match) {
					t.Errorf("violation %q does not mention %q", v.Msg, tc.match)
				}
				if len(v.Events) == 0 {
					t.Errorf("violation %q names no events", v.Msg)
				}
			}
		})
	}
}

// TestFencingOffCounts checks the stale-write numbers of the fencing-off
// control: the late write is stale, attempted and accepted.
func TestFencingOffCounts(t *testing.T) {
	st := Check(scenario(knobs{fencingOff: true}), testConfig).Stats
	if st.StaleAttempted != 1 || st.StaleAccepted != 1 || st.FencingOffWrites != 1 {
		t.Errorf("stale attempted %d accepted %d fencing-off writes %d, want 1 1 1", st.StaleAttempted, st.StaleAccepted, st.FencingOffWrites)
	}
}

// history of a few events, times in ms.
func hist(evs ...history.Event) history.History {
	for i := range evs {
		evs[i].T *= ms
		evs[i].Until *= ms
		if evs[i].Key == "" {
			evs[i].Key = "k"
		}
	}
	return evs
}

// TestEarlyStaleWrite checks the one case where a stale write may be
// accepted: before the newer holder has written anything, the fence
// cannot know, and the resource still sees the writes in lease order.
// Once the newer holder has written (even rejected), acceptance is a
// violation.
func TestEarlyStaleWrite(t *testing.T) {
	base := []history.Event{
		{T: 0, Proc: "a", Kind: history.Acquired, Lease: "a1", Token: 1, Until: 50},
		{T: 100, Proc: "b", Kind: history.Acquired, Lease: "b1", Token: 2, Until: 900},
		{T: 101, Proc: "fence", Kind: history.Write, Lease: "a1", Token: 1, Accepted: true, Reason: "newer", Fencing: true},
	}
	r := Check(hist(slices.Clone(base)...), testConfig)
	if p, _ := r.Property("P1"); !p.OK {
		t.Errorf("early stale write flagged: %v", p.Violations)
	}
	if r.Stats.StaleAttempted != 1 || r.Stats.StaleAcceptedEarly != 1 || r.Stats.StaleAccepted != 0 {
		t.Errorf("stats %+v, want one stale write, accepted early", r.Stats)
	}

	// The newer holder's write was rejected (its token is lower: a
	// regression); the old holder's later write must not be accepted.
	late := append(slices.Clone(base[:2]),
		history.Event{T: 101, Proc: "fence", Kind: history.Write, Lease: "b1", Token: 2, Accepted: false, Reason: "stale", Fencing: true},
		history.Event{T: 102, Proc: "fence", Kind: history.Write, Lease: "a1", Token: 1, Accepted: true, Reason: "same-lease", Fencing: true},
	)
	if p, _ := Check(hist(late...), testConfig).Property("P1"); p.OK {
		t.Error("old holder's write accepted after the newer holder's attempt was not flagged")
	}

	// A write by a lease nobody acquired is stale once the key was acquired.
	ghost := append(slices.Clone(base[:2]),
		history.Event{T: 101, Proc: "fence", Kind: history.Write, Lease: "b1", Token: 2, Accepted: true, Reason: "newer", Fencing: true},
		history.Event{T: 102, Proc: "fence", Kind: history.Write, Lease: "x", Token: 3, Accepted: true, Reason: "newer", Fencing: true},
	)
	if p, _ := Check(hist(ghost...), testConfig).Property("P1"); p.OK {
		t.Error("accepted write of an unknown lease was not flagged")
	}
}

// TestTokenRotation checks P2 on rotated tokens: a rotation must go up,
// and may not reuse another lease's token.
func TestTokenRotation(t *testing.T) {
	ok := hist(
		history.Event{T: 0, Proc: "a", Kind: history.Acquired, Lease: "a1", Token: 1, Until: 50},
		history.Event{T: 10, Proc: "a", Kind: history.Belief, Lease: "a1", Token: 2, Until: 60},
		history.Event{T: 100, Proc: "b", Kind: history.Acquired, Lease: "b1", Token: 3, Until: 900},
	)
	if r := Check(ok, testConfig); !r.OK() {
		t.Errorf("rotation 1→2 then 3 flagged: %v", r.Failed())
	}
	down := slices.Clone(ok)
	down[1].Token = 0 // unchanged: no rotation
	down = append(down, history.Event{T: 200 * ms, Proc: "b", Kind: history.Belief, Key: "k", Lease: "b1", Token: 2, Until: 900 * ms})
	if p, _ := Check(down, testConfig).Property("P2"); p.OK {
		t.Error("rotation 3→2 not flagged")
	}
	reuse := slices.Clone(ok)
	reuse[2].Token = 2 // b gets the token a rotated to
	if p, _ := Check(reuse, testConfig).Property("P2"); p.OK {
		t.Error("token reused after rotation not flagged")
	}
}

// TestOldTokenAfterRotation checks P1 within one lease: once the fence
// accepted a lease's rotated token, a write of that lease with its
// pre-rotation token must be rejected; the counts say what happened.
func TestOldTokenAfterRotation(t *testing.T) {
	base := []history.Event{
		{T: 0, Proc: "a", Kind: history.Acquired, Lease: "a1", Token: 1, Until: 500},
		{T: 1, Proc: "a", Kind: history.Belief, Lease: "a1", Token: 1, Until: 500},
		{T: 2, Proc: "fence", Kind: history.Write, Lease: "a1", Token: 1, Accepted: true, Reason: "newer", Fencing: true},
		{T: 10, Proc: "a", Kind: history.Belief, Lease: "a1", Token: 2, Until: 600},
		{T: 11, Proc: "fence", Kind: history.Write, Lease: "a1", Token: 2, Accepted: true, Reason: "newer", Fencing: true},
		{T: 12, Proc: "fence", Kind: history.Write, Lease: "a1", Token: 1, Accepted: false, Reason: "stale", Fencing: true},
		{T: 20, Proc: "a", Kind: history.BatchRenew, N: 3},
		{T: 21, Proc: "a", Kind: history.Wait, Note: "watch"},
	}
	r := Check(hist(slices.Clone(base)...), testConfig)
	if !r.OK() {
		t.Fatalf("rotation with the old token refused flagged: %v", r.Failed())
	}
	st := r.Stats
	if st.Rotations != 1 || st.RotatedAccepted != 1 || st.OldTokenWrites != 1 || st.OldTokenAccepted != 0 ||
		st.BatchRenewals != 1 || st.MaxBatch != 3 || st.Waits != 1 || st.StaleAttempted != 0 {
		t.Errorf("stats %+v", st)
	}
	bad := slices.Clone(base)
	bad[5].Accepted, bad[5].Reason = true, "same-lease"
	r = Check(hist(bad...), testConfig)
	if p, _ := r.Property("P1"); p.OK || r.Stats.OldTokenAccepted != 1 {
		t.Errorf("pre-rotation token accepted after the rotated one not flagged: %+v", p)
	}
}

// TestCoalescedBatchCounts checks that the coalesced acquire and release
// batches a contender reports are counted, each kind on its own with its
// largest batch, and judge nothing: two leases of one client acquired and
// released in one batch each are a clean history.
func TestCoalescedBatchCounts(t *testing.T) {
	h := hist(
		history.Event{T: 0, Proc: "a", Kind: history.AcquireStart, Key: "k1", Lease: "a1"},
		history.Event{T: 0, Proc: "a", Kind: history.AcquireStart, Key: "k2", Lease: "a2"},
		history.Event{T: 5, Proc: "a", Kind: history.BatchAcquire, N: 2},
		history.Event{T: 6, Proc: "a", Kind: history.Acquired, Key: "k1", Lease: "a1", Token: 1, Until: 500},
		history.Event{T: 6, Proc: "a", Kind: history.Acquired, Key: "k2", Lease: "a2", Token: 2, Until: 500},
		history.Event{T: 7, Proc: "a", Kind: history.BatchAcquire, N: 4},
		history.Event{T: 8, Proc: "a", Kind: history.BatchAcquire, N: 3, Err: "connection reset"},
		history.Event{T: 20, Proc: "a", Kind: history.ReleaseStart, Key: "k1", Lease: "a1", Token: 1},
		history.Event{T: 20, Proc: "a", Kind: history.ReleaseStart, Key: "k2", Lease: "a2", Token: 2},
		history.Event{T: 25, Proc: "a", Kind: history.BatchRelease, N: 2},
		history.Event{T: 26, Proc: "a", Kind: history.Released, Key: "k1", Lease: "a1", Token: 1},
		history.Event{T: 26, Proc: "a", Kind: history.Released, Key: "k2", Lease: "a2", Token: 2},
	)
	r := Check(h, testConfig)
	if !r.OK() {
		t.Fatalf("coalesced acquisitions and releases flagged: %v", r.Failed())
	}
	st := r.Stats
	if st.BatchAcquires != 3 || st.MaxAcquireBatch != 4 || st.BatchReleases != 1 || st.MaxReleaseBatch != 2 ||
		st.BatchRenewals != 0 || st.MaxBatch != 0 {
		t.Errorf("batch counts: %d acquire batches (max %d), %d release batches (max %d), %d renewal batches (max %d); "+
			"want 3 (max 4), 1 (max 2), 0 (max 0)",
			st.BatchAcquires, st.MaxAcquireBatch, st.BatchReleases, st.MaxReleaseBatch, st.BatchRenewals, st.MaxBatch)
	}
}

// TestUnorderedAcquisitions checks that P2 does not judge the order of two
// acquisitions when the later-reported one's process was paused between
// its Acquire call and its report, but still requires unique tokens.
func TestUnorderedAcquisitions(t *testing.T) {
	h := hist(
		history.Event{T: 0, Proc: "a", Kind: history.AcquireStart},
		history.Event{T: 5, Proc: "harness", Kind: history.FaultStart, Note: "holder-pause"},
		history.Event{T: 5, Proc: "a", Kind: history.Pause},
		history.Event{T: 100, Proc: "b", Kind: history.AcquireStart},
		history.Event{T: 1200, Proc: "b", Kind: history.Acquired, Lease: "b1", Token: 2, Until: 2000},
		history.Event{T: 1300, Proc: "a", Kind: history.Resume},
		history.Event{T: 1300, Proc: "harness", Kind: history.FaultEnd, Note: "holder-pause"},
		// a's grant (token 1) was issued before the pause, reported after.
		history.Event{T: 1301, Proc: "a", Kind: history.Acquired, Lease: "a1", Token: 1, Until: 1250},
	)
	if p, _ := Check(h, testConfig).Property("P2"); !p.OK {
		t.Errorf("unobservable order flagged: %v", p.Violations)
	}
	h[len(h)-1].Token = 2
	if p, _ := Check(h, testConfig).Property("P2"); p.OK {
		t.Error("duplicate token not flagged when the order is unobservable")
	}
	h[len(h)-1].Token = 1
	h = slices.DeleteFunc(h, func(e history.Event) bool { return e.Kind == history.Pause || e.Kind == history.Resume })
	if p, _ := Check(h, testConfig).Property("P2"); p.OK {
		t.Error("token going backwards without a pause not flagged")
	}
}

// TestProgressRunEndsEarly checks that a run ending right after a fault,
// before any progress, fails P6 instead of passing vacuously.
func TestProgressRunEndsEarly(t *testing.T) {
	h := hist(
		history.Event{T: 0, Proc: "a", Kind: history.Acquired, Lease: "a1", Token: 1, Until: 900},
		history.Event{T: 10, Proc: "harness", Kind: history.FaultStart, Note: "x"},
		history.Event{T: 20, Proc: "harness", Kind: history.FaultEnd, Note: "x"},
	)
	p, _ := Check(h, testConfig).Property("P6")
	if p.OK || !strings.Contains(p.Violations[0].Msg, "before the run ended") {
		t.Errorf("P6 = %+v, want a violation saying the run ended too early", p)
	}
}

// TestMaxViolations checks that violations are counted in full but kept
// only up to the cap.
func TestMaxViolations(t *testing.T) {
	h := hist(
		history.Event{T: 0, Proc: "a", Kind: history.Acquired, Lease: "a1", Token: 1, Until: 50},
		history.Event{T: 100, Proc: "b", Kind: history.Acquired, Lease: "b1", Token: 2, Until: 900},
		history.Event{T: 101, Proc: "fence", Kind: history.Write, Lease: "b1", Token: 2, Accepted: true, Reason: "newer"},
	)
	for i := int64(0); i < 30; i++ {
		h = append(h, history.Event{T: (102 + i) * ms, Proc: "fence", Kind: history.Write, Key: "k", Lease: "a1", Token: 1, Accepted: true, Reason: "stale"})
	}
	cfg := testConfig
	cfg.MaxViolations = 5
	p, _ := Check(h, cfg).Property("P1")
	if p.Count != 30 || len(p.Violations) != 5 {
		t.Errorf("count %d kept %d, want 30 and 5", p.Count, len(p.Violations))
	}
}

func TestDist(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	if got, want := dist(ds), (Dist{N: 100, Min: 1, P50: 50, P99: 99, Max: 100}); got != want {
		t.Errorf("dist = %+v, want %+v", got, want)
	}
	if got := dist(nil); got != (Dist{}) {
		t.Errorf("dist(nil) = %+v", got)
	}
}

// TestFreedExcuses checks that P5 does not blame the store when the only
// waiting contender could not reach it (a fault targeted it, or it was
// paused) or when the whole store was under a fault.
func TestFreedExcuses(t *testing.T) {
	late := knobs{c1ReacquireAt: 3100} // fails P5 on its own (see TestNegativeControls)
	cases := []struct {
		name string
		ev   []history.Event
	}{
		{"waiter cut off", []history.Event{
			{T: 2000 * ms, Proc: "c1", Kind: history.FaultStart, Note: "blackhole"},
			{T: 3050 * ms, Proc: "c1", Kind: history.FaultEnd, Note: "blackhole"},
		}},
		{"waiter paused", []history.Event{
			{T: 2000 * ms, Proc: "c1", Kind: history.Pause},
			{T: 3050 * ms, Proc: "c1", Kind: history.Resume},
		}},
		{"store down", []history.Event{
			{T: 2000 * ms, Proc: "harness", Kind: history.FaultStart, Note: "server-pause"},
			{T: 3050 * ms, Proc: "harness", Kind: history.FaultEnd, Note: "server-pause"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := append(scenario(late), tc.ev...)
			if p, _ := Check(h, testConfig).Property("P5"); !p.OK {
				t.Errorf("P5 flagged: %v", p.Violations)
			}
		})
	}
	// A fault on another contender excuses nothing.
	h := append(scenario(late),
		history.Event{T: 2000 * ms, Proc: "c4", Kind: history.FaultStart, Note: "blackhole"},
		history.Event{T: 3050 * ms, Proc: "c4", Kind: history.FaultEnd, Note: "blackhole"})
	if p, _ := Check(h, testConfig).Property("P5"); p.OK {
		t.Error("P5 excused by a fault on an uninvolved contender")
	}
}

// longHistory generates a correct history of n leases over keys, with
// holder crashes, as a healthy run would record it (times in ns).
func longHistory(n int, keys []string, seed int64) history.History {
	rng := rand.New(rand.NewSource(seed))
	ttl := int64(time.Second)
	var h history.History
	t := map[string]int64{}
	tok := map[string]uint64{}
	for i := 0; i < n; i++ {
		key := keys[i%len(keys)]
		proc := key + string(rune('0'+rng.Intn(4))) // a process works on one key
		id := proc + "-" + time.Duration(i).String()
		start := t[key] + 1e6 + rng.Int63n(5e6)
		tok[key] += uint64(1 + rng.Intn(3))
		h = append(h,
			history.Event{T: start - 2e6, Proc: proc, Kind: history.AcquireStart, Key: key},
			history.Event{T: start, Proc: proc, Kind: history.Acquired, Key: key, Lease: id, Token: tok[key], Until: start + ttl*9/10})
		end := start + 50e6 + rng.Int63n(200e6)
		for w := start + 1e6; w < end; w += 5e6 {
			h = append(h,
				history.Event{T: w, Proc: proc, Kind: history.Belief, Key: key, Lease: id, Token: tok[key], Until: w + ttl*9/10},
				history.Event{T: w + 1e5, Proc: "fence", Kind: history.Write, Key: key, Lease: id, Token: tok[key], Accepted: true, Reason: "newer", Fencing: true})
		}
		if rng.Intn(20) == 0 {
			h = append(h,
				history.Event{T: end, Proc: "harness", Kind: history.FaultStart, Note: "holder-crash"},
				history.Event{T: end, Proc: proc, Kind: history.Crash},
				history.Event{T: end + 1e6, Proc: "harness", Kind: history.FaultEnd, Note: "holder-crash"})
			t[key] = end + ttl + rng.Int63n(100e6)
			// Someone waits for the key meanwhile.
			h = append(h, history.Event{T: end + 5e6, Proc: "w" + key, Kind: history.AcquireStart, Key: key},
				history.Event{T: t[key] - 1e6, Proc: "w" + key, Kind: history.AcquireFailed, Key: key, Err: "gave up for the test"})
			continue
		}
		h = append(h,
			history.Event{T: end, Proc: proc, Kind: history.ReleaseStart, Key: key, Lease: id, Token: tok[key]},
			history.Event{T: end + 1e6, Proc: proc, Kind: history.Released, Key: key, Lease: id, Token: tok[key]})
		t[key] = end + 1e6
	}
	return h
}

// TestLongCorrectHistory checks that a long, correct, generated history
// passes every property, and that checking it is fast enough for the
// soak profile.
func TestLongCorrectHistory(t *testing.T) {
	h := longHistory(3000, []string{"a", "b", "c"}, 1)
	begin := time.Now()
	r := Check(h, testConfig)
	took := time.Since(begin)
	if ids := failed(t, r); len(ids) != 0 {
		t.Fatalf("properties %v failed on a correct history", ids)
	}
	t.Logf("%d events checked in %v: %+v", len(h), took, r.Stats)
	if r.Stats.Acquisitions != 3000 || r.Stats.Crashes == 0 || r.Stats.OrphanTime.N != r.Stats.Crashes {
		t.Errorf("stats %+v: want 3000 acquisitions and an orphan time per crash", r.Stats)
	}
}
