package etcd

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"

	"github.com/fencelock/fencelock/internal/backendkit"
)

// Key layout. Every key's queue lives under
//
//	PREFIX + escape(key) + "/"
//
// and each contender (holder or waiter) is one entry in it:
//
//	PREFIX + escape(key) + "/" + name        value: owner NUL [metadata]
//
// escape percent-encodes '%' and '/' (and nothing else), so an escaped key
// never contains '/': the first '/' after PREFIX ends the key, and one key's
// queue prefix is never a prefix of another key's queue. The encoding is a
// prefix code byte by byte, so escape(p) is a prefix of escape(k) exactly
// when p is a prefix of k, which is what List(prefix) relies on.
//
// An entry's name is the writing Backend's id and a slot number that the
// Backend reuses once the slot's entry is released (see slotTable); the
// owner is in the value. Earlier versions named an entry escape(owner);
// such entries read the same way, because nothing takes the owner from the
// name. Names are reused because etcd keeps every name ever deleted in its
// index until a compaction, and every range over a queue walks them: a key
// that took a fresh name per acquisition slowed down with every one.

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

// newBackendID returns a random id naming a Backend's entries.
func newBackendID() string {
	var p [8]byte
	_, _ = rand.Read(p[:]) // never fails (crypto/rand)
	return hex.EncodeToString(p[:])
}

// nameIn returns the name of entry k within the queue whose prefix is qp.
func nameIn(qp, k string) string { return strings.TrimPrefix(k, qp) }

// slotName returns the name of this backend's entry slot i.
func (b *Backend) slotName(i int) string { return b.id + "." + strconv.Itoa(i) }

// slotOf returns the slot number of name if this backend names entries so.
func (b *Backend) slotOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, b.id+".")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0
}

// validName reports whether name is an entry name as this version writes
// them (slotName of some backend): 16 hex digits, '.', and 1 to 9 decimal
// digits. Only such names are carried in a Handle; anything else in a
// Handle (a forged name, or an earlier version's escape(owner)) is ignored
// and the entry is found by token.
func validName(name string) bool {
	id, slot, ok := strings.Cut(name, ".")
	if !ok || len(id) != 16 || len(slot) < 1 || len(slot) > 9 {
		return false
	}
	for _, c := range []byte(id) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	for _, c := range []byte(slot) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// markerKey returns the etcd key of key's rotation marker: written (with
// no lease, never deleted) by every token rotation, so that its mod
// revision is the last rotated token. It has no '/' after the prefix, so
// it is never taken for a queue entry.
func (b *Backend) markerKey(key string) string {
	return b.prefix + escape(key)
}

// parseEntry returns the lock key of an etcd key under the backend's
// prefix that names a queue entry.
func (b *Backend) parseEntry(k string) (key string, ok bool) {
	rest, found := strings.CutPrefix(k, b.prefix)
	if !found {
		return "", false
	}
	ek, _, found := strings.Cut(rest, "/")
	if !found {
		return "", false
	}
	return unescape(ek)
}

// slotTable hands out entry slots per lock key: a slot is reserved, for
// its owner, from the call that puts an entry under its name until that
// entry is released or found lost, so that two live acquisitions of one
// Backend rarely pick the same name. It is an optimisation, not what
// safety rests on: every put that creates an entry is guarded in etcd
// (Acquire's by an empty queue, a waiter's by the name being free), and
// every later write or delete by the entry's mod revision, so a slot
// handed out twice costs a retry, never an overwrite. A failed call frees
// its slot whatever it left behind: a retry by the same owner finds its
// entry by owner (Acquire at the queue's head, a waiter among the
// backend's entries of the queue), not by name, so no reservation outlives
// the calls and grants that made it.
type slotTable struct {
	mu   sync.Mutex
	keys map[string][]string // key → owner per slot ("" when free)
}

// take reserves a slot of key for owner: the one owner already holds, if
// any, else the lowest free one.
func (t *slotTable) take(key, owner string) int { return t.reserve(key, owner, true) }

// takeNew reserves for owner the lowest free slot of key, even if owner
// already holds one.
func (t *slotTable) takeNew(key, owner string) int { return t.reserve(key, owner, false) }

func (t *slotTable) reserve(key, owner string, reuse bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	slots := t.slotsLocked(key)
	free := -1
	for i, o := range slots {
		if reuse && o == owner {
			return i
		}
		if o == "" && free < 0 {
			free = i
		}
	}
	if free < 0 {
		free = len(slots)
		slots = append(slots, "")
	}
	slots[free] = owner
	t.keys[key] = slots
	return free
}

// claim reserves slot i of key for owner unless another owner holds it.
func (t *slotTable) claim(key string, i int, owner string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	slots := t.slotsLocked(key)
	for len(slots) <= i {
		slots = append(slots, "")
	}
	t.keys[key] = slots
	if slots[i] != "" && slots[i] != owner {
		return false
	}
	slots[i] = owner
	return true
}

// slotsLocked returns key's slots; t.mu is held.
func (t *slotTable) slotsLocked(key string) []string {
	if t.keys == nil {
		t.keys = make(map[string][]string)
	}
	return t.keys[key]
}

// free releases slot i of key if owner still holds it.
func (t *slotTable) free(key string, i int, owner string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	slots := t.keys[key]
	if i < 0 || i >= len(slots) || slots[i] != owner {
		return
	}
	slots[i] = ""
	for len(slots) > 0 && slots[len(slots)-1] == "" {
		slots = slots[:len(slots)-1]
	}
	if len(slots) == 0 {
		delete(t.keys, key)
		return
	}
	t.keys[key] = slots
}

// freeName releases the slot that entry name of key stands for, if it is
// one of this backend's and owner holds it.
func (b *Backend) freeName(key, name, owner string) {
	if i, ok := b.slotOf(name); ok {
		b.slots.free(key, i, owner)
	}
}
