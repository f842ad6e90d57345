package backendkit

import "sync"

// Orphans is the set of records a backend failed to delete (a release or a
// queue-entry removal whose request failed, a create whose reply was lost)
// and must delete later, because its store keeps them alive on a session
// the backend goes on renewing (etcd's shared lease, ZooKeeper's session).
//
// A backend adds to it where the deletion failed and sweeps it at the
// start of, or after, the calls the engine drives anyway (a keep-alive
// that got through, an Acquire, a Renew, an Inspect): the backend itself
// never loops or waits to retry. The engine retries what it must in the
// background (its retry loop calls Inspect after a failed clean-up), so a
// backend that keeps an orphan pending can make the next Inspect of that
// key report it as a transient error.
//
// K names a record (an etcd key, a znode path); V is what its deletion
// must match (a mod revision) or needs (a nonce to search for). The zero
// Orphans is ready to use and safe for concurrent use.
type Orphans[K comparable, V comparable] struct {
	mu sync.Mutex
	m  map[K]V
}

// Add records k (replacing what was recorded for k).
func (o *Orphans[K, V]) Add(k K, v V) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = make(map[K]V)
	}
	o.m[k] = v
}

// Len returns how many records are pending.
func (o *Orphans[K, V]) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}

// Batch returns up to max pending records (every one if max <= 0), for one
// sweep. They stay pending until Done.
func (o *Orphans[K, V]) Batch(max int) map[K]V {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(o.m)
	if max > 0 {
		n = min(n, max)
	}
	out := make(map[K]V, n)
	for k, v := range o.m {
		if len(out) == n {
			break
		}
		out[k] = v
	}
	return out
}

// Done removes k if it is still recorded with v: a record added again
// meanwhile (a newer revision) stays pending.
func (o *Orphans[K, V]) Done(k K, v V) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if cur, ok := o.m[k]; ok && cur == v {
		delete(o.m, k)
	}
}

// Any reports whether some pending record satisfies f.
func (o *Orphans[K, V]) Any(f func(K, V) bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, v := range o.m {
		if f(k, v) {
			return true
		}
	}
	return false
}
