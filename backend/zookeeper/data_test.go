package zookeeper

import (
	"bytes"
	"testing"
)

// TestNodeData: a contender znode's data carries the owner and metadata exactly,
// and a znode without metadata is the owner alone, as earlier versions
// wrote it, which reads back with nil metadata.
func TestNodeData(t *testing.T) {
	for _, tc := range []struct {
		owner string
		md    []byte
		raw   string // the stored value
	}{
		{"o", nil, "o"},
		{"o", []byte{}, "o"},
		{"owner-1", []byte("addr"), "owner-1\x00addr"},
		{"o", []byte("\x00\x00\xff"), "o\x00\x00\x00\xff"},
	} {
		v := nodeData(tc.owner, tc.md)
		if string(v) != tc.raw {
			t.Errorf("nodeData(%q, %q) = %q; want %q", tc.owner, tc.md, v, tc.raw)
		}
		owner, md := parseData(v)
		want := tc.md
		if len(want) == 0 {
			want = nil
		}
		if owner != tc.owner || !bytes.Equal(md, want) || (want == nil) != (md == nil) {
			t.Errorf("parseData(%q) = %q, %q; want %q, %q", v, owner, md, tc.owner, want)
		}
	}
	// A trailing NUL with nothing after it is no metadata.
	if owner, md := parseData([]byte("o\x00")); owner != "o" || md != nil {
		t.Errorf(`parseData("o\x00") = %q, %q; want "o", nil`, owner, md)
	}
}
