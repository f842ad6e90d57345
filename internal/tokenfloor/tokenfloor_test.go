package tokenfloor

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fencelock/fencelock/driver"
)

// segs returns h's segments after the first, as {start, off} pairs.
func segs(h History) [][2]int64 {
	var out [][2]int64
	for i := 1; i < h.Len(); i++ {
		s, o := h.Segment(i)
		out = append(out, [2]int64{s, o})
	}
	return out
}

// three is a history with segments from 100 (offset 900) and from 200
// (offset 1300): native tokens 1..100 keep theirs, 101..200 map to
// 1001..1100, 201.. to 1501...
var three = Empty().Append(100, 900).Append(200, 1300)

func TestOffIsTheOffsetOfTheLastSegmentStartingBelow(t *testing.T) {
	for _, tc := range []struct {
		h    History
		n    int64
		want int64
	}{
		{Empty(), 1, 0},
		{Empty(), 1 << 40, 0},
		{three, 1, 0},
		{three, 100, 0}, // a segment covers native tokens above its start
		{three, 101, 900},
		{three, 200, 900},
		{three, 201, 1300},
		{three, 1 << 40, 1300},
	} {
		if got := tc.h.Off(tc.n); got != tc.want {
			t.Errorf("%v.Off(%d) = %d, want %d", segs(tc.h), tc.n, got, tc.want)
		}
		if got, want := tc.h.Token(tc.n), driver.Token(tc.n+tc.want); got != want {
			t.Errorf("%v.Token(%d) = %d, want %d", segs(tc.h), tc.n, got, want)
		}
	}
}

func TestNativeInvertsTokenAndRejectsTheGaps(t *testing.T) {
	for _, tc := range []struct {
		t    driver.Token
		want int64
	}{
		{0, 0},
		{1, 1},
		{100, 100},
		{101, 0},  // between segments: no native token maps here
		{1000, 0}, // 100 + 900: 100 is in the first segment, not the second
		{1001, 101},
		{1100, 200},
		{1101, 0},
		{1500, 0},
		{1501, 201},
		{1 << 63, 0}, // above MaxInt64
	} {
		if got := three.Native(tc.t); got != tc.want {
			t.Errorf("Native(%d) = %d, want %d", tc.t, got, tc.want)
		}
	}
	for n := int64(1); n <= 400; n++ {
		if got := three.Native(three.Token(n)); got != n {
			t.Fatalf("Native(Token(%d)) = %d", n, got)
		}
	}
}

func TestNextOffsetIsWhatTheRaiseNeedsThenDoubles(t *testing.T) {
	long := Empty()
	for i := 1; i < ExactSegments; i++ {
		long = long.Append(int64(100*i), int64(i))
	}
	// long has ExactSegments segments, the last offset ExactSegments-1.
	short := Empty().Append(10, 50)
	top := Empty()
	for i := 1; i < ExactSegments; i++ {
		top = top.Append(int64(100*i), MaxOffset/2+int64(i))
	}
	for _, tc := range []struct {
		name string
		h    History
		need int64
		want int64
	}{
		{"needed offset", short, 80, 80},
		{"below the last offset", short, 20, 50},
		{"negative need", short, -5, 50},
		{"empty history", Empty(), 7, 7},
		{"capped", short, MaxOffset + 10, MaxOffset},
		{"doubled once long", long, ExactSegments, 2 * (ExactSegments - 1)},
		{"need above double once long", long, 1000, 1000},
		{"double capped", top, 0, MaxOffset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.h.NextOffset(tc.need); got != tc.want {
				t.Errorf("NextOffset(%d) = %d, want %d", tc.need, got, tc.want)
			}
		})
	}
}

func TestAppendLeavesTheOriginalAlone(t *testing.T) {
	base := Empty().Append(10, 5)
	a := base.Append(20, 6)
	b := base.Append(30, 7)
	if base.Len() != 2 || !slices.Equal(segs(a), [][2]int64{{10, 5}, {20, 6}}) || !slices.Equal(segs(b), [][2]int64{{10, 5}, {30, 7}}) {
		t.Fatalf("base %v, a %v, b %v: an Append changed another history", segs(base), segs(a), segs(b))
	}
}

func TestParseOffsetsAcceptsOnlyIncreasingSegments(t *testing.T) {
	for _, tc := range []struct {
		text string
		mod  int64
		want [][2]int64 // nil with ok false: rejected
		ok   bool
	}{
		{"", 5, nil, true},
		{"  \n", 5, nil, true},
		{"100 900\n", 300, [][2]int64{{100, 900}}, true},
		{"100 900\n- 1300\n", 300, [][2]int64{{100, 900}, {300, 1300}}, true},
		{"- 7\n", 300, [][2]int64{{300, 7}}, true},
		{"100 900\n200 1300", 300, [][2]int64{{100, 900}, {200, 1300}}, true},
		{"100 900\n- 900\n", 300, nil, false},   // offset not above the previous
		{"100 900\n- 800\n", 300, nil, false},   // offset down
		{"100 900\n- 1300\n", 100, nil, false},  // dash start not above the previous
		{"100 900\n50 1300\n", 300, nil, false}, // start down
		{"- 900\n200 1300\n", 300, nil, false},  // "-" before the last line
		{"100 0\n", 300, nil, false},            // offset 0 adds nothing
		{"100 -4\n", 300, nil, false},           // negative
		{"0 5\n", 300, nil, false},              // start 0 is the first segment's
		{"100\n", 300, nil, false},              // no offset
		{"100 x\n", 300, nil, false},            // not a number
		{fmt.Sprintf("10 %d\n", MaxOffset), 300, [][2]int64{{10, MaxOffset}}, true},
		{fmt.Sprintf("10 %d\n", MaxOffset+1), 300, nil, false},
	} {
		h, ok := ParseOffsets(tc.text, tc.mod)
		if ok != tc.ok || ok && !slices.Equal(segs(h), tc.want) {
			t.Errorf("ParseOffsets(%q, %d) = %v, %v; want %v, %v", tc.text, tc.mod, segs(h), ok, tc.want, tc.ok)
		}
	}
}

func TestEncodeOffsetsRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		h    History
		want string
	}{
		{Empty(), ""},
		{three, "100 900\n200 1300\n"},
		{three.Append(0, 2000), "100 900\n200 1300\n- 2000\n"}, // start 0: the write's revision
	} {
		got := tc.h.EncodeOffsets()
		if got != tc.want {
			t.Errorf("EncodeOffsets(%v) = %q, want %q", segs(tc.h), got, tc.want)
		}
		h, ok := ParseOffsets(got, 500)
		want := segs(tc.h)
		if n := len(want); n > 0 && want[n-1][0] == 0 {
			want[n-1][0] = 500
		}
		if !ok || !slices.Equal(segs(h), want) {
			t.Errorf("ParseOffsets(EncodeOffsets(%v)) = %v, %v; want %v", segs(tc.h), segs(h), ok, want)
		}
	}
}

func TestParseFloorResolvesTheLastSegment(t *testing.T) {
	long := []byte{}
	for i := 1; i < ExactSegments; i++ {
		long = fmt.Appendf(long, "%d %d\n", 100*i, i)
	}
	for _, tc := range []struct {
		name  string
		text  string
		mzxid int64
		want  [][2]int64
		floor int64
		ok    bool
	}{
		{"empty", "", 100, nil, 0, true},
		{"floor above the write", "- 1000\n", 100, [][2]int64{{100, 900}}, 1000, true},
		{"floor below the write keeps offset 0", "- 10\n", 100, [][2]int64{{100, 0}}, 10, true},
		{"floor the previous offset covers", "100 900\n- 1050\n", 200, [][2]int64{{100, 900}, {200, 900}}, 1050, true},
		{"floor above the previous offset", "100 900\n- 1500\n", 200, [][2]int64{{100, 900}, {200, 1300}}, 1500, true},
		{"doubles once long", string(long) + fmt.Sprintf("- %d\n", 100*ExactSegments+1), 100 * ExactSegments,
			append(longSegs(), [2]int64{100 * ExactSegments, 2 * (ExactSegments - 1)}), 100*ExactSegments + 1, true},
		{"floor zero", "- 0\n", 100, nil, 0, false},
		{"floor above MaxOffset", fmt.Sprintf("- %d\n", MaxOffset+1), 100, nil, 0, false},
		{"write not after the previous segment", "100 900\n- 1500\n", 100, nil, 0, false},
		{"explicit offset not above the previous", "100 900\n200 900\n", 300, nil, 0, false},
		{"dash before the last line", "- 1500\n200 900\n", 300, nil, 0, false},
		{"garbage", "floor\n", 300, nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, floor, ok := ParseFloor(tc.text, tc.mzxid)
			if ok != tc.ok || ok && (!slices.Equal(segs(h), tc.want) || floor != tc.floor) {
				t.Errorf("ParseFloor(%q, %d) = %v, floor %d, %v; want %v, floor %d, %v",
					tc.text, tc.mzxid, segs(h), floor, ok, tc.want, tc.floor, tc.ok)
			}
		})
	}
}

func longSegs() [][2]int64 {
	var out [][2]int64
	for i := 1; i < ExactSegments; i++ {
		out = append(out, [2]int64{int64(100 * i), int64(i)})
	}
	return out
}

func TestEncodeFloorDropsSegmentsThatChangeNoOffset(t *testing.T) {
	h := Empty().Append(100, 900).Append(200, 900).Append(300, 1300).Append(400, 1300)
	for _, tc := range []struct {
		floor int64
		want  string
	}{
		{0, "100 900\n300 1300\n"},
		{5000, "100 900\n300 1300\n- 5000\n"},
	} {
		if got := h.EncodeFloor(tc.floor); got != tc.want {
			t.Errorf("EncodeFloor(%d) = %q, want %q", tc.floor, got, tc.want)
		}
	}
	if got := Empty().Append(100, 0).EncodeFloor(0); got != "" {
		t.Errorf("EncodeFloor of a history with only zero offsets = %q, want empty", got)
	}
}

// TestRaisedFloorsBoundEveryLaterToken replays random raises the way both
// backends make them (an etcd RaiseFloor appends NextOffset(F - C - 1) at
// the write's revision W > C when the current offset does not reach F; a
// ZooKeeper one stores "- F" and resolves it at W) and checks the floor
// rule: after a raise to F written at W, every native token above W maps
// to a token above F, tokens stay strictly increasing, and Native inverts
// Token on every segment.
func TestRaisedFloorsBoundEveryLaterToken(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		eh, zh := Empty(), Empty()
		em, zm := int64(0), int64(0) // the floor record's last write
		ztext := ""
		w := int64(0)
		type raise struct{ w, f int64 }
		var raises []raise
		for range 1 + rng.IntN(2*ExactSegments) {
			c := w + 1 + rng.Int64N(50) // the revision the raise read at
			w = c + 1 + rng.Int64N(3)   // the revision of its write, if any
			f := int64(eh.Token(c)) + rng.Int64N(200) - 100
			if rng.IntN(10) == 0 {
				f += rng.Int64N(1 << 40)
			}
			if f <= 0 {
				continue
			}
			raises = append(raises, raise{w, f})
			// etcd: nothing if F <= M + cur; else a rewrite, which appends
			// a segment only when the current offset falls short.
			if f > em+eh.Last() {
				if need := f - c - 1; need > eh.Last() {
					eh = eh.Append(w, eh.NextOffset(need))
				}
				em = w
			}
			// ZooKeeper: nothing if F <= M + cur; else re-encoded with
			// "- F", read back at the write's zxid.
			if f > zm+zh.Last() {
				var ok bool
				ztext = zh.EncodeFloor(f)
				if zh, _, ok = ParseFloor(ztext, w); !ok {
					t.Fatalf("round %d: ParseFloor(%q, %d) failed", round, ztext, w)
				}
				zm = w
			}
		}
		for name, h := range map[string]History{"etcd": eh, "zookeeper": zh} {
			for _, r := range raises {
				for _, n := range []int64{r.w + 1, r.w + 2, r.w + 50, w + 1} {
					if n > r.w && int64(h.Token(n)) <= r.f {
						t.Fatalf("round %d, %s %v: floor %d raised at %d, but Token(%d) = %d",
							round, name, segs(h), r.f, r.w, n, h.Token(n))
					}
				}
			}
			prev := driver.Token(0)
			for n := int64(1); n <= w+5; n++ {
				tok := h.Token(n)
				if tok <= prev {
					t.Fatalf("round %d, %s: Token(%d) = %d, not above Token(%d) = %d", round, name, n, tok, n-1, prev)
				}
				if got := h.Native(tok); got != n {
					t.Fatalf("round %d, %s: Native(Token(%d)) = %d", round, name, n, got)
				}
				prev = tok
			}
			if h.Len() > ExactSegments+63 {
				t.Fatalf("round %d, %s: %d segments, above the bound %d", round, name, h.Len(), ExactSegments+63)
			}
		}
		if strings.Count(ztext, "-") > 1 {
			t.Fatalf("round %d: stored floor text %q has more than one dash line", round, ztext)
		}
	}
}
