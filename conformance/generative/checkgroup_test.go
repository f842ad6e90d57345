package generative

import (
	"strings"
	"testing"

	"github.com/fencelock/fencelock"
)

// A multi-key grant ends when one of its members is lost, and releases
// the others: the member's loss, as the engine reported it, ends every
// member's window, so a sibling's key taken by another lease after the
// loss (and before the sibling's worker noticed the grant's end) is no
// second holder. A sibling's key taken while the grant was still held
// is. (Seen with a client whose clock jumped past two members'
// validity: the grant released its third member, another worker of the
// client got that key, and the first worker, asleep in its hold,
// recorded its end later.) Mutation caught: groupLost never cutting a
// window (the checker then reports the first case).
func TestMultiGrantMemberLossEndsEverySiblingsWindow(t *testing.T) {
	lost := &fencelock.LostError{Key: "k0", Token: 1, Cause: fencelock.ErrLocalExpiry}
	for _, tc := range []struct {
		name   string
		loss   int64 // when the grant's k0 member was lost
		newGot int64 // when the next lease of k2 was granted
		two    bool  // NoTwoHolders expected
	}{
		{"key taken after a member's loss", 10, 20, false},
		{"key taken before a member's loss", 25, 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			k0 := &leaseRec{id: 1, client: 1, key: "k0", owner: "a", inv: 1, got: 5, end: tc.loss, cause: lost, tokens: []tokObs{{1, 5}}, group: 1}
			k2 := &leaseRec{id: 2, client: 1, key: "k2", owner: "b", inv: 1, got: 5, end: 30, tokens: []tokObs{{1, 5}}, group: 1}
			next := &leaseRec{id: 3, client: 1, key: "k2", owner: "c", inv: 6, got: tc.newGot, end: 40, tokens: []tokObs{{2, tc.newGot}}}
			for _, l := range []*leaseRec{k0, k2, next} {
				r.leases = append(r.leases, l)
				r.byOwner[l.owner] = l
			}
			var two []string
			for _, v := range r.check() {
				if v.property == "NoTwoHolders" {
					two = append(two, v.String())
				}
			}
			if got := len(two) > 0; got != tc.two {
				t.Errorf("NoTwoHolders reported: %v (%s); want %v", got, strings.Join(two, "; "), tc.two)
			}
		})
	}
}
