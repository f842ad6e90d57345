package zookeeper

import (
	"strconv"
	"strings"
)

// escapeKey turns a lock key into one znode name: every byte outside
// [A-Za-z0-9_-] becomes %XX (upper-case hex), so '/', '.', '%', spaces,
// non-ASCII and anything ZooKeeper might reject are encoded, the names "."
// and ".." cannot occur, and distinct keys give distinct names. The one
// reserved name, "zookeeper" (special at the root of the tree), has its first
// byte encoded as well. unescapeKey inverts it exactly.
func escapeKey(key string) string {
	var sb strings.Builder
	sb.Grow(len(key) + 8)
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(key); i++ {
		c := key[i]
		if safeByte(c) {
			sb.WriteByte(c)
			continue
		}
		sb.WriteByte('%')
		sb.WriteByte(hex[c>>4])
		sb.WriteByte(hex[c&15])
	}
	s := sb.String()
	if s == "zookeeper" {
		s = "%7Aookeeper"
	}
	return s
}

func safeByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// unescapeKey inverts escapeKey; ok is false for names escapeKey cannot
// produce (znodes that are not ours).
func unescapeKey(name string) (string, bool) {
	if name == "" {
		return "", false
	}
	var sb strings.Builder
	sb.Grow(len(name))
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c != '%' {
			if !safeByte(c) {
				return "", false
			}
			sb.WriteByte(c)
			continue
		}
		if i+2 >= len(name) {
			return "", false
		}
		h := name[i+1 : i+3]
		if strings.ToUpper(h) != h {
			return "", false
		}
		v, err := strconv.ParseUint(h, 16, 8)
		if err != nil || safeByte(byte(v)) && !(i == 0 && h == "7A" && name == "%7Aookeeper") {
			return "", false
		}
		sb.WriteByte(byte(v))
		i += 2
	}
	return sb.String(), true
}
