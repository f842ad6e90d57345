package zookeeper

import "github.com/fencelock/fencelock/internal/backendkit"

// keyCodec encodes every byte outside [A-Za-z0-9_-] as %XX (upper-case
// hex), so '/', '.', '%', spaces, non-ASCII and anything ZooKeeper might
// reject are encoded, the names "." and ".." cannot occur, and distinct
// keys give distinct names.
var keyCodec = backendkit.NewCodecFunc(func(c byte) bool {
	return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_')
})

// reservedName is the one name keyCodec can produce that ZooKeeper treats
// specially (at the root of the tree); escapeKey writes it as
// escapedReserved instead.
const (
	reservedName    = "zookeeper"
	escapedReserved = "%7Aookeeper"
)

// escapeKey turns a lock key into one znode name with keyCodec, with the
// reserved name "zookeeper" having its first byte encoded as well.
// unescapeKey inverts it exactly.
func escapeKey(key string) string {
	s := keyCodec.Escape(key)
	if s == reservedName {
		s = escapedReserved
	}
	return s
}

// unescapeKey inverts escapeKey; ok is false for names escapeKey cannot
// produce (znodes that are not ours).
func unescapeKey(name string) (string, bool) {
	switch name {
	case "":
		return "", false
	case escapedReserved:
		return reservedName, true
	}
	return keyCodec.Unescape(name)
}
