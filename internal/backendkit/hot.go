package backendkit

import (
	"sync"
	"time"
)

// HotSet remembers keys recently found held, for a while. A backend whose
// Acquire is a write (a queue entry, a contender znode) reads first for a
// key in the set: a contender that will only wait anyway then costs the
// store reads instead of writes and their fsync.
//
// The set is a heuristic, never a source of truth: forgetting a key early
// costs one write, remembering it too long one read. Its memory is bounded:
// when Max keys are remembered, the expired ones are dropped, and if none
// has expired the set starts over empty.
//
// The zero HotSet is not usable; set TTL and Max. It is safe for
// concurrent use.
type HotSet struct {
	// TTL is how long a key stays hot after Mark.
	TTL time.Duration
	// Max bounds how many keys the set remembers.
	Max int

	mu   sync.Mutex
	keys map[string]time.Time
}

// Hot reports whether key was marked less than TTL ago.
func (h *HotSet) Hot(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.keys[key]
	if ok && time.Since(t) >= h.TTL {
		delete(h.keys, key)
		return false
	}
	return ok
}

// Mark makes key hot for TTL from now.
func (h *HotSet) Mark(key string) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys == nil {
		h.keys = make(map[string]time.Time)
	}
	if _, ok := h.keys[key]; !ok && len(h.keys) >= h.Max {
		for k, t := range h.keys {
			if now.Sub(t) >= h.TTL {
				delete(h.keys, k)
			}
		}
		if len(h.keys) >= h.Max {
			clear(h.keys)
		}
	}
	h.keys[key] = now
}

// Len returns how many keys the set holds (expired ones included until
// they are looked up or pruned).
func (h *HotSet) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.keys)
}
