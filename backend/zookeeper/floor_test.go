package zookeeper

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/tokenfloor"
)

// TestFloorHistory checks the floor znode's format: the last segment's
// offset is resolved from its floor and the znode's mzxid, a later write
// spells it out unchanged, tokens map back to exactly one zxid, and data
// that would make tokens decrease is refused.
func TestFloorHistory(t *testing.T) {
	h, err := parseHistory([]byte("- 1000\n"), 100)
	if err != nil {
		t.Fatal(err)
	}
	// Every zxid above the write (100) is above the floor once offset.
	if got := h.Off(101); 101+got <= 1000 {
		t.Fatalf("off(101) = %d: token %d not above the floor 1000", got, 101+got)
	}
	if h.Off(100) != 0 || h.Off(50) != 0 {
		t.Fatalf("zxids up to the write keep offset 0: off(100) = %d, off(50) = %d", h.Off(100), h.Off(50))
	}
	for _, z := range []int64{1, 99, 100, 101, 5000} {
		if got := h.Native(driver.Token(z + h.Off(z))); got != z {
			t.Fatalf("native(token(%d)) = %d", z, got)
		}
	}
	if got := h.Native(950); got != 0 {
		t.Fatalf("native(950) = %d: token 950 is in the gap no zxid maps to", got)
	}

	// Spelled out, then raised again at mzxid 200: the old segment keeps
	// its start and offset, the new one has the offset the floor needs.
	data := h.EncodeFloor(1500)
	if data != "100 900\n- 1500\n" {
		t.Fatalf("encode = %q", data)
	}
	h2, err := parseHistory([]byte(data), 200)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Off(150) != 900 || h2.Off(201) != 1300 {
		t.Fatalf("off(150) = %d (want 900), off(201) = %d (want 1500 - 200)", h2.Off(150), h2.Off(201))
	}
	// A floor the tokens from 200 on exceed already keeps the offset: the
	// segment is left out of the next write.
	h2b, err := parseHistory([]byte("100 900\n- 1050\n"), 200)
	if err != nil || h2b.Off(201) != 900 {
		t.Fatalf("parse(- 1050 at 200) = %+v, %v; want offset 900 kept", h2b, err)
	}
	if got := h2b.EncodeFloor(0); got != "100 900\n" {
		t.Fatalf("encode = %q, want the unchanged segment only", got)
	}
	// Once the history is tokenfloor.ExactSegments long, a new offset at least
	// doubles the previous one.
	var long []byte
	for i := 1; i < tokenfloor.ExactSegments; i++ {
		long = fmt.Appendf(long, "%d %d\n", 100*i, i)
	}
	long = fmt.Appendf(long, "- %d\n", 100*tokenfloor.ExactSegments+1)
	h4, err := parseHistory(long, 100*tokenfloor.ExactSegments)
	if err != nil || h4.Last() != 2*(tokenfloor.ExactSegments-1) {
		t.Fatalf("offset after %d segments = %d, %v; want %d", tokenfloor.ExactSegments, h4.Last(), err, 2*(tokenfloor.ExactSegments-1))
	}

	// A floor below the write's zxid gives an equal offset, which the next
	// write leaves out.
	h3, err := parseHistory([]byte("- 10\n"), 100)
	if err != nil || h3.Off(101) != 0 {
		t.Fatalf("parse(- 10) = %+v, %v", h3, err)
	}
	if got := h3.EncodeFloor(0); got != "" {
		t.Fatalf("encode of a history with only a zero offset = %q, want empty", got)
	}

	for _, bad := range []string{"x 1\n", "100 0\n", "100 5\n50 9\n", "100 9\n200 9\n", "100 9\n200 5\n", "- 5\n100 9\n", "100\n"} {
		if _, err := parseHistory([]byte(bad), 300); !errors.Is(err, errFloorZnode) {
			t.Errorf("parseHistory(%q) = %v, want errFloorZnode", bad, err)
		}
	}
}
