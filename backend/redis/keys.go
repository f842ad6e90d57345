package redis

import (
	"strings"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
)

// Key layout. For the lock key K under prefix P (default "fencelock"):
//
//	{P:E}:lock      string "<token>\n<owner>\n<meta>" with a PX TTL
//	{P:E}:token     the key's token counter (INCR), never expires
//	{P:E}:released  pub/sub channel a release publishes on
//	{P:E}:ended     the lock-delay marker (see lua/acquire.lua): the
//	                holder's lock delay, outliving :lock by it
//
// where E is K with '%', '{' and '}' percent-escaped. Redis Cluster hashes
// only the part between the first '{' and the next '}', so all three names
// of one key share a slot (a script may touch them together), and because E
// has no '}', the whole of P:E is the hash tag: distinct keys spread over
// the slots instead of every key with a '}' in it landing on one. The
// escaping maps each character on its own, so the escape of a prefix is a
// prefix of the escape of every key starting with it, which is what List's
// SCAN MATCH pattern needs.

const (
	lockSuffix     = ":lock"
	tokenSuffix    = ":token"
	releasedSuffix = ":released"
	endedSuffix    = ":ended"
)

// keyCodec percent-escapes '%', '{' and '}'.
var keyCodec = backendkit.NewCodec("{}")

// escapeKey percent-escapes '%', '{' and '}'.
func escapeKey(k string) string { return keyCodec.Escape(k) }

// unescapeKey reverses escapeKey; ok is false if e is not an escaped key.
func unescapeKey(e string) (string, bool) { return keyCodec.Unescape(e) }

// keyspace turns lock keys into Redis names under one prefix.
type keyspace struct {
	prefix string // validated: no '{', '}', glob characters or spaces
}

func (ks keyspace) base(key string) string { return "{" + ks.prefix + ":" + escapeKey(key) + "}" }

// names returns the lock record, the counter and the release channel of key.
func (ks keyspace) names(key string) (lock, counter, channel string) {
	b := ks.base(key)
	return b + lockSuffix, b + tokenSuffix, b + releasedSuffix
}

func (ks keyspace) lockName(key string) string { return ks.base(key) + lockSuffix }

// marker is the lock-delay marker of key.
func (ks keyspace) marker(key string) string { return ks.base(key) + endedSuffix }

func (ks keyspace) channel(key string) string { return ks.base(key) + releasedSuffix }

// pattern is the SCAN MATCH pattern for the lock records of every key that
// starts with prefix.
func (ks keyspace) pattern(prefix string) string { return ks.patternOf(prefix, lockSuffix) }

// counterPattern is the SCAN MATCH pattern for the token counters of every
// key that starts with prefix.
func (ks keyspace) counterPattern(prefix string) string { return ks.patternOf(prefix, tokenSuffix) }

func (ks keyspace) patternOf(prefix, suffix string) string {
	return "{" + globEscape(ks.prefix+":"+escapeKey(prefix)) + "*}" + suffix
}

// keyOf returns the lock key of a lock record's name, if name is one.
func (ks keyspace) keyOf(name string) (string, bool) { return ks.keyOfName(name, lockSuffix) }

// keyOfCounter returns the lock key of a token counter's name, if name is
// one.
func (ks keyspace) keyOfCounter(name string) (string, bool) { return ks.keyOfName(name, tokenSuffix) }

func (ks keyspace) keyOfName(name, suffix string) (string, bool) {
	head := "{" + ks.prefix + ":"
	if !strings.HasPrefix(name, head) || !strings.HasSuffix(name, "}"+suffix) {
		return "", false
	}
	return unescapeKey(name[len(head) : len(name)-len("}"+suffix)])
}

// globEscape escapes the characters that Redis's glob matching (SCAN
// MATCH) treats specially.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\^`) {
		return s
	}
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\', '^':
			sb.WriteByte('\\')
			sb.WriteByte(c)
		default:
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

// DefaultPrefix is the namespace of every Redis key the backend writes,
// unless Options.Prefix says otherwise.
const DefaultPrefix = "fencelock"

// maxPrefixLen bounds Options.Prefix.
const maxPrefixLen = 128

// validatePrefix checks Options.Prefix: 1 to 128 bytes of letters, digits
// and "_-.:/". Braces would break the hash tag, glob characters List's SCAN
// pattern.
func validatePrefix(p string) error {
	bad := func(reason string) error {
		return &driver.InvalidOptionError{Option: "Prefix", Value: quote(p), Reason: reason}
	}
	if p == "" {
		return bad("empty")
	}
	if len(p) > maxPrefixLen {
		return bad("longer than 128 bytes")
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '_' || c == '-' || c == '.' || c == ':' || c == '/':
		default:
			return bad("may hold only letters, digits and _ - . : /")
		}
	}
	return nil
}

// slot is Redis Cluster's hash slot of a key: CRC16 (XMODEM) of its hash
// tag, or of the whole key if it has none, modulo 16384.
func slot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16(key) & 16383)
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
