// Package tokenfloor is the offset history behind the token floors of the
// backends whose native tokens are one counter for the whole store (etcd
// revisions, ZooKeeper zxids), which a deleted and recreated lock record
// cannot reset but a restore or a move to another cluster can.
//
// A token is a native token n plus the offset in force at n:
//
//	token(n) = n + off(n)
//
// The offsets form a History: a list of segments, each a start and an
// offset; off(n) is the offset of the last segment whose start is below n.
// Segments are only ever appended, with a larger start and an offset at
// least the previous one, each starting at the native token of the write
// that appended it (a write no lock record shares), so off never decreases
// and token is strictly increasing in n: the order of tokens is the order
// of native tokens, and a holder's token does not change when a floor is
// raised while it holds. Native maps a token back to n exactly.
//
// Both backends store the history as text, one segment a line, "start
// offset", whose last line may have the start "-": the native token of
// the write that stored it, which the writer cannot know in advance. They
// differ in what such a last line holds: etcd stores the offset itself
// (ParseOffsets, EncodeOffsets), ZooKeeper the floor asked for, whose
// offset is resolved when the text is read (ParseFloor, EncodeFloor).
//
// Offsets and floors stay at or below MaxOffset, so a token stays below
// 2^63 while native tokens are below 2^62. A history never shrinks (a held
// lock or a waiter may come from any segment); once it has ExactSegments
// segments a new offset is at least twice the previous one (NextOffset),
// so it has at most ExactSegments + 63.
//
// This package does no I/O: reading and writing the stored history, and
// knowing which native tokens a read covers, is each backend's own.
package tokenfloor

import (
	"math"
	"strconv"
	"strings"

	"github.com/fencelock/fencelock/driver"
)

// MaxOffset bounds offsets and floors: token = native + offset stays below
// 2^63 while native tokens are below 2^62.
const MaxOffset = 1 << 62

// ExactSegments is how many segments a history may have before a new
// offset must at least double the previous one.
const ExactSegments = 64

// History is the offset function: segment i covers native tokens above
// its start (up to the next segment's start), with its offset. The first
// segment, start 0 and offset 0, covers the native tokens before any
// raise. The zero History has no segments: it is no history read yet
// (IsZero); Empty is the history of a store never raised.
//
// A History is a value: Append returns a new one and never changes the
// segments of the one it was called on.
type History struct {
	starts, offs []int64
}

// Empty returns the history with the first segment only: every offset 0.
func Empty() History { return History{starts: []int64{0}, offs: []int64{0}} }

// IsZero reports whether h is the zero History (not even Empty).
func (h History) IsZero() bool { return h.starts == nil }

// Len returns the number of segments, the first one included.
func (h History) Len() int { return len(h.starts) }

// Segment returns segment i's start and offset.
func (h History) Segment(i int) (start, off int64) { return h.starts[i], h.offs[i] }

// Last returns the last segment's offset: the offset of every native token
// above its start.
func (h History) Last() int64 { return h.offs[len(h.offs)-1] }

// Off returns the offset in force at native token n.
func (h History) Off(n int64) int64 {
	i := len(h.starts) - 1
	for i > 0 && h.starts[i] >= n {
		i--
	}
	return h.offs[i]
}

// Token returns n's token, n + Off(n).
func (h History) Token(n int64) driver.Token { return driver.Token(n + h.Off(n)) }

// Native maps a token back to its native token, or 0 if no native token
// maps to it (a token from another history, or between two segments).
// Token is strictly increasing, so at most one segment matches.
func (h History) Native(t driver.Token) int64 {
	if t == 0 || t > math.MaxInt64 {
		return 0
	}
	for i := len(h.starts) - 1; i >= 0; i-- {
		n := int64(t) - h.offs[i]
		if n > h.starts[i] && (i == len(h.starts)-1 || n <= h.starts[i+1]) {
			return n
		}
	}
	return 0
}

// NextOffset returns the offset of a segment appended for a raise that
// needs need: need itself, but at least the last offset, and from
// ExactSegments segments on at least twice it; at most MaxOffset.
func (h History) NextOffset(need int64) int64 {
	least := h.Last()
	if len(h.starts) >= ExactSegments {
		least = 2 * h.Last()
	}
	return min(max(need, least), MaxOffset)
}

// Append returns h with a segment (start, off) added at the end. It does
// not check the segment (see Valid).
func (h History) Append(start, off int64) History {
	return History{
		starts: append(h.starts[:len(h.starts):len(h.starts)], start),
		offs:   append(h.offs[:len(h.offs):len(h.offs)], off),
	}
}

// valid reports whether a segment (start, off) may follow h: a start
// above the last one and an offset above the last one, at most MaxOffset.
// sameOff allows an offset equal to the last one.
func (h History) valid(start, off int64, sameOff bool) bool {
	prevStart, prevOff := h.starts[len(h.starts)-1], h.Last()
	if start <= prevStart || off > MaxOffset || off < prevOff {
		return false
	}
	return off > prevOff || sameOff
}

// line is one stored segment, "start value"; dash is true for a last
// line whose start is "-".
type line struct {
	start int64
	value int64
	dash  bool
}

// parseLines splits text into its lines; ok is false if one does not
// parse. Blank text is no line.
func parseLines(text string) ([]line, bool) {
	text = strings.TrimSpace(text)
	if text == "" {
		return nil, true
	}
	raw := strings.Split(text, "\n")
	out := make([]line, 0, len(raw))
	for i, l := range raw {
		s, v, ok := strings.Cut(l, " ")
		if !ok {
			return nil, false
		}
		value, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, false
		}
		ln := line{value: value}
		if s == "-" && i == len(raw)-1 {
			ln.dash = true
		} else if ln.start, err = strconv.ParseInt(s, 10, 64); err != nil {
			return nil, false
		}
		out = append(out, ln)
	}
	return out, true
}

// ParseOffsets reads a history stored as etcd stores it: lines "start
// offset", each offset above the one before, the last line possibly
// "- offset", starting at dashStart (the mod revision of the key that
// holds the text). ok is false if the text does not parse or its segments
// do not increase.
func ParseOffsets(text string, dashStart int64) (h History, ok bool) {
	lines, ok := parseLines(text)
	if !ok {
		return History{}, false
	}
	h = Empty()
	for _, l := range lines {
		start := l.start
		if l.dash {
			start = dashStart
		}
		if !h.valid(start, l.value, false) {
			return History{}, false
		}
		h = h.Append(start, l.value)
	}
	return h, true
}

// EncodeOffsets writes h as ParseOffsets reads it; a last segment with
// start 0 is written "-": it starts at the revision of the write.
func (h History) EncodeOffsets() string {
	var sb strings.Builder
	for i := 1; i < len(h.starts); i++ {
		if i == len(h.starts)-1 && h.starts[i] == 0 {
			sb.WriteString("-")
		} else {
			sb.WriteString(strconv.FormatInt(h.starts[i], 10))
		}
		sb.WriteByte(' ')
		sb.WriteString(strconv.FormatInt(h.offs[i], 10))
		sb.WriteByte('\n')
	}
	return sb.String()
}

// ParseFloor reads a history stored as ZooKeeper stores it: lines "start
// offset", each offset above the one before, the last line possibly
// "- F": a segment starting at dashStart (the mzxid of the znode that
// holds the text) whose offset is what floor F needs there, NextOffset(F
// - dashStart); floor is F (0 if there is no such line). ok is false if
// the text does not parse, its segments do not increase, or F is not in
// (0, MaxOffset].
func ParseFloor(text string, dashStart int64) (h History, floor int64, ok bool) {
	lines, ok := parseLines(text)
	if !ok {
		return History{}, 0, false
	}
	h = Empty()
	for _, l := range lines {
		if l.value <= 0 || l.value > MaxOffset {
			return History{}, 0, false
		}
		start, off := l.start, l.value
		if l.dash {
			start, off, floor = dashStart, h.NextOffset(l.value-dashStart), l.value
		}
		if !h.valid(start, off, l.dash) {
			return History{}, 0, false
		}
		h = h.Append(start, off)
	}
	return h, floor, true
}

// EncodeFloor writes h as ParseFloor reads it, with every segment's start
// explicit and a segment whose offset is the previous one left out (it
// changes no token), then "- floor" if floor is not zero.
func (h History) EncodeFloor(floor int64) string {
	var sb strings.Builder
	prev := int64(0)
	for i := 1; i < len(h.starts); i++ {
		if h.offs[i] == prev {
			continue
		}
		prev = h.offs[i]
		sb.WriteString(strconv.FormatInt(h.starts[i], 10))
		sb.WriteByte(' ')
		sb.WriteString(strconv.FormatInt(h.offs[i], 10))
		sb.WriteByte('\n')
	}
	if floor > 0 {
		sb.WriteString("- ")
		sb.WriteString(strconv.FormatInt(floor, 10))
		sb.WriteByte('\n')
	}
	return sb.String()
}
