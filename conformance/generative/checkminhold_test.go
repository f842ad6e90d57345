package generative

import (
	"testing"
	"time"

	"github.com/fencelock/fencelock"
)

// minHoldHistory is the history of TestGenerativeMemoryOldAndDual that
// MinHoldRespected once flagged: client 0's TryAcquire of "k" was granted
// token late (its call began at 1), and its client began to close at 3;
// client 1's lease was granted token 2 at 6 with a 900ms minimum hold and
// released into it at 11; client 0's call returned its lease at 14, all
// at the same (fake) instant. closed says whether client 0 closed.
func minHoldHistory(late fencelock.Token, closed bool) *recorder {
	r := newRecorder()
	at := time.Unix(1000, 0)
	x := &leaseRec{id: 1, client: 1, key: "k", owner: "x", inv: 4, got: 6, end: 11, via: "wait-cancelled",
		tokens: []tokObs{{2, 6}}, minHold: 900 * time.Millisecond, invAt: at, gotAt: at, heldMin: true}
	y := &leaseRec{id: 2, client: 0, key: "k", owner: "y", inv: 1, got: 14, end: 19, via: "try",
		tokens: []tokObs{{late, 14}}, invAt: at, gotAt: at}
	for _, l := range []*leaseRec{x, y} {
		r.leases = append(r.leases, l)
		r.byOwner[l.owner] = l
	}
	if closed {
		r.closed[0], r.closeAt[0] = 3, at
	}
	return r
}

func withProperty(vs []violation, property string) []violation {
	var out []violation
	for _, v := range vs {
		if v.property == property {
			out = append(out, v)
		}
	}
	return out
}

// Defect (found running the generative mode on the 1+2 migration mix):
// MinHoldRespected took a lease whose call returned after another's
// release into its minimum hold for one granted after it, though its
// token (1, below the held lease's 2) shows the store granted it first;
// Close had ended it before its worker recorded the grant. The whole
// checker accepts that history. Mutation caught: dropping the token
// order from MinHoldRespected (judging by the return alone).
func TestMinHoldIgnoresALeaseGrantedBeforeTheHolder(t *testing.T) {
	if vs := minHoldHistory(1, true).check(); len(vs) != 0 {
		t.Errorf("a lease granted token 1 before the holder's token 2, returned after its release: %v; want no violation", vs)
	}
}

// A lease granted after the holder (a higher token) inside its minimum
// hold is still a MinHoldRespected violation, and one with a lower token
// that believed it held after the release (its client still open) is a
// TokensIncreaseAcrossHolders violation: the token order excuses neither.
func TestMinHoldStillFlagsALeaseGrantedAfterTheHolder(t *testing.T) {
	if vs := withProperty(minHoldHistory(3, true).check(), "MinHoldRespected"); len(vs) != 1 {
		t.Errorf("a lease granted token 3 inside the hold of token 2: violations %v; want MinHoldRespected", vs)
	}
	if vs := withProperty(minHoldHistory(1, false).check(), "TokensIncreaseAcrossHolders"); len(vs) != 1 {
		t.Errorf("a lease holding token 1 after the holder of token 2 released: violations %v; want TokensIncreaseAcrossHolders", vs)
	}
}

// A client whose clock jumped ahead (its process paused: jumpClock)
// counts a minimum hold by that clock, so the hold ends that much
// earlier by the harness's: MinHoldRespected shortens the hold by the
// holder's client's jumps, and by no other client's. Mutation caught:
// aheadOf left out of MinHoldRespected (the generative mode then reports
// holds the engine rightly ended), or the jumps of any client counted.
func TestMinHoldShortenedByTheHoldersClockJumps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ahead map[int]time.Duration
		flags int
	}{
		{"holder's clock ahead by the whole hold", map[int]time.Duration{1: 900 * time.Millisecond}, 0},
		{"holder's clock ahead by less", map[int]time.Duration{1: 100 * time.Millisecond}, 1},
		{"another client's clock ahead", map[int]time.Duration{0: 900 * time.Millisecond}, 1},
	} {
		r := minHoldHistory(3, true)
		r.ahead = tc.ahead
		if vs := withProperty(r.check(), "MinHoldRespected"); len(vs) != tc.flags {
			t.Errorf("%s: a lease granted token 3 at the holder's acquire: MinHoldRespected violations %v; want %d", tc.name, vs, tc.flags)
		}
	}
}
