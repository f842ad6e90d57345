package backendkit

import "strings"

// Codec percent-encodes the bytes of a reserved set as %XX (upper-case
// hex) and leaves every other byte as it is. '%' is always reserved, so
// the encoding is a prefix code, byte by byte: Escape(p) is a prefix of
// Escape(k) exactly when p is a prefix of k (what a List by prefix relies
// on), and distinct strings have distinct encodings.
//
// A Codec is immutable and safe for concurrent use.
type Codec struct {
	reserved [256]bool
}

// NewCodec returns a Codec that escapes '%' and every byte of reserved.
func NewCodec(reserved string) *Codec {
	return NewCodecFunc(func(c byte) bool { return strings.IndexByte(reserved, c) >= 0 })
}

// NewCodecFunc returns a Codec that escapes '%' and every byte for which
// reserved reports true.
func NewCodecFunc(reserved func(c byte) bool) *Codec {
	c := &Codec{}
	for i := range 256 {
		c.reserved[i] = reserved(byte(i))
	}
	c.reserved['%'] = true
	return c
}

const hexDigits = "0123456789ABCDEF"

// Escape returns s with every reserved byte written as %XX.
func (c *Codec) Escape(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if c.reserved[s[i]] {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var sb strings.Builder
	sb.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !c.reserved[b] {
			sb.WriteByte(b)
			continue
		}
		sb.WriteByte('%')
		sb.WriteByte(hexDigits[b>>4])
		sb.WriteByte(hexDigits[b&15])
	}
	return sb.String()
}

// Unescape reverses Escape. It reports false for every string Escape
// cannot produce: a reserved byte written as itself, an escape of a byte
// that is not reserved, lower-case hex, or a truncated escape. So a name
// that Unescape accepts is the encoding of exactly one string.
func (c *Codec) Unescape(e string) (string, bool) {
	if strings.IndexByte(e, '%') < 0 {
		for i := 0; i < len(e); i++ {
			if c.reserved[e[i]] {
				return "", false
			}
		}
		return e, true
	}
	var sb strings.Builder
	sb.Grow(len(e))
	for i := 0; i < len(e); i++ {
		b := e[i]
		if b != '%' {
			if c.reserved[b] {
				return "", false
			}
			sb.WriteByte(b)
			continue
		}
		if i+2 >= len(e) {
			return "", false
		}
		hi, lo := unhex(e[i+1]), unhex(e[i+2])
		if hi < 0 || lo < 0 {
			return "", false
		}
		v := byte(hi<<4 | lo)
		if !c.reserved[v] {
			return "", false
		}
		sb.WriteByte(v)
		i += 2
	}
	return sb.String(), true
}

// unhex is the value of an upper-case hex digit, or -1.
func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
