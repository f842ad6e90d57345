package recipe

import "strconv"

// Keys returns the keys of the store records a recipe on key is made
// of, for tools that read the store itself (a listing, a history checker,
// a clean-up); using a Semaphore or an RWLock needs none of them. Every
// record is an ordinary lease on its key.
//
// With permits > 0 they are a Semaphore's of that many permits: prefix
// is what each of its slot keys starts with (Semaphore.Holders lists
// it), and records are its slot keys, 0 to permits−1 (permit i is a
// lease on records[i]: Lease.Key, the key a fenced resource checks the
// permit's token against). With permits == 0 they are an RWLock's: prefix
// is what each of its records starts with (RWLock.Holders lists it), and
// records are its gate (a writer's grant), a waiting writer's intent and
// its upgrade record, in that order. Its reader slots, as many as it has
// readers, are prefix + "r/" + i for i from 0 (a reader's grant is a
// lease on one).
//
// Keys that contain a recipe's separator (the prefix of Keys("", n)) are
// reserved for that recipe: a plain lock on such a key occupies one of
// its records. Keys checks nothing: NewSemaphore and NewRWLock refuse a
// key whose records would be too long.
func Keys(key string, permits int) (prefix string, records []string) {
	if permits > 0 {
		prefix = key + permitSeparator
		records = make([]string, permits)
		for i := range records {
			records[i] = prefix + strconv.Itoa(i)
		}
		return prefix, records
	}
	prefix = key + rwSeparator
	return prefix, []string{prefix + "gate", prefix + "w", prefix + "u"}
}
