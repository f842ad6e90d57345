package etcd

import (
	"strings"

	"github.com/fencelock/fencelock/internal/backendkit"
)

// Key layout. Every key's queue lives under
//
//	PREFIX + escape(key) + "/"
//
// and each contender (holder or waiter) is one entry in it:
//
//	PREFIX + escape(key) + "/" + escape(owner)
//
// escape percent-encodes '%' and '/' (and nothing else), so an escaped key
// never contains '/': the first '/' after PREFIX ends the key, and one key's
// queue prefix is never a prefix of another key's queue. The encoding is a
// prefix code byte by byte, so escape(p) is a prefix of escape(k) exactly
// when p is a prefix of k, which is what List(prefix) relies on.

// keyCodec escapes '%' and '/' (see above).
var keyCodec = backendkit.NewCodec("/")

// escape percent-encodes '%' and '/' in s.
func escape(s string) string { return keyCodec.Escape(s) }

// unescape reverses escape. It reports false for text escape never
// produces.
func unescape(s string) (string, bool) { return keyCodec.Unescape(s) }

// queuePrefix returns the etcd key prefix of key's queue.
func (b *Backend) queuePrefix(key string) string {
	return b.prefix + escape(key) + "/"
}

// entryKey returns the etcd key of owner's entry in key's queue.
func (b *Backend) entryKey(key, owner string) string {
	return b.queuePrefix(key) + escape(owner)
}

// markerKey returns the etcd key of key's rotation marker: written (with
// no lease, never deleted) by every token rotation, so that its mod
// revision is the last rotated token. It has no '/' after the prefix, so
// it is never taken for a queue entry.
func (b *Backend) markerKey(key string) string {
	return b.prefix + escape(key)
}

// parseEntry splits an etcd key under the backend's prefix into the lock
// key and owner it encodes.
func (b *Backend) parseEntry(k string) (key, owner string, ok bool) {
	rest, found := strings.CutPrefix(k, b.prefix)
	if !found {
		return "", "", false
	}
	ek, eo, found := strings.Cut(rest, "/")
	if !found {
		return "", "", false
	}
	if key, ok = unescape(ek); !ok {
		return "", "", false
	}
	if owner, ok = unescape(eo); !ok {
		return "", "", false
	}
	return key, owner, true
}
