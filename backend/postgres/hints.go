package postgres

import "sync"

// maxHeldHints bounds heldHints: at most this many keys (of at most
// driver.MaxKeyLen bytes each, so at most 2 MiB of keys) are remembered;
// past it a new key replaces one picked at random (a map's iteration
// order).
const maxHeldHints = 4096

// heldHints is the set of keys whose last acquisition through this Backend
// found another owner holding them. It only picks Acquire's statement: a
// key in the set goes to acquire, which answers a held key with a
// read-only transaction (a waiter woken by a release, or a caller polling
// a busy key); any other key goes to acquireFree, the cheaper statement
// for a free key, which writes the row even when another owner holds it.
// Both statements are correct in every state of the row, so a wrong or
// forgotten hint costs a write, never safety.
type heldHints struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

func (h *heldHints) has(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.keys[key]
	return ok
}

// note records what an attempt on key found: held by another owner or not.
func (h *heldHints) note(key string, held bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !held {
		delete(h.keys, key)
		return
	}
	if h.keys == nil {
		h.keys = make(map[string]struct{})
	}
	if _, ok := h.keys[key]; !ok && len(h.keys) >= maxHeldHints {
		for k := range h.keys {
			delete(h.keys, k)
			break
		}
	}
	h.keys[key] = struct{}{}
}
