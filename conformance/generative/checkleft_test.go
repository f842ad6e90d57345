package generative

import "testing"

// TestLateWhileClosingOnlyAfterClose checks that a late request excuses a
// record left behind (until its TTL) only when it was sent, or cut short,
// after its own client began to close: the history of the read-write
// program of seed 14197990689267534201, where client 0 began to close at
// 115 and its releases of one slot were late at 120 and 122, cut at 123,
// and landed after Close had closed the backend.
func TestLateWhileClosingOnlyAfterClose(t *testing.T) {
	history := func(closeAt int64, faults ...faultRec) *recorder {
		r := newRecorder()
		if closeAt > 0 {
			r.closed[0] = closeAt
		}
		r.faults = faults
		return r
	}
	late := func(seq int64, client int, kind string) faultRec {
		return faultRec{seq: seq, client: client, op: "release", kind: kind, owners: []string{"o"}}
	}
	for _, tc := range []struct {
		name string
		r    *recorder
		want bool
	}{
		{"late releases after close", history(115, late(96, 0, "late"), late(120, 0, "late"), late(122, 0, "late"), late(123, 0, "late-cut")), true},
		{"late-cut after close", history(115, late(123, 0, "late-cut")), true},
		{"late before close", history(115, late(96, 0, "late"), late(97, 0, "late")), false},
		{"never closed", history(0, late(120, 0, "late")), false},
		{"another client's close", history(115, late(120, 1, "late")), false},
		{"other faults after close", history(115, late(120, 0, "lose")), false},
	} {
		if got := tc.r.lateWhileClosing(); got != tc.want {
			t.Errorf("%s: lateWhileClosing() = %v, want %v", tc.name, got, tc.want)
		}
	}
}
