package etcd

import (
	"bytes"
	"testing"
)

// TestEntryValue: an entry's value carries the owner and metadata exactly,
// the owner always ended by a NUL (which ownedBy relies on); an entry
// without metadata reads back with nil metadata, and so does the owner
// alone, as earlier versions wrote it.
func TestEntryValue(t *testing.T) {
	for _, tc := range []struct {
		owner string
		md    []byte
		raw   string // the stored value
	}{
		{"o", nil, "o\x00"},
		{"o", []byte{}, "o\x00"},
		{"owner-1", []byte("addr"), "owner-1\x00addr"},
		{"o", []byte("\x00\x00\xff"), "o\x00\x00\x00\xff"},
	} {
		v := entryValue(tc.owner, tc.md)
		if v != tc.raw {
			t.Errorf("entryValue(%q, %q) = %q; want %q", tc.owner, tc.md, v, tc.raw)
		}
		owner, md := parseValue([]byte(v))
		want := tc.md
		if len(want) == 0 {
			want = nil
		}
		if owner != tc.owner || !bytes.Equal(md, want) || (want == nil) != (md == nil) {
			t.Errorf("parseValue(%q) = %q, %q; want %q, %q", v, owner, md, tc.owner, want)
		}
	}
	// An earlier version's value without metadata: the owner alone.
	if owner, md := parseValue([]byte("o")); owner != "o" || md != nil {
		t.Errorf(`parseValue("o") = %q, %q; want "o", nil`, owner, md)
	}
}
