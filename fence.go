package fencelock

import (
	"fmt"
	"sync"
)

// StaleTokenError reports a write refused because a higher fencing token
// (or the same token from another grant) has already been seen for the
// resource. It matches ErrStaleToken.
type StaleTokenError struct {
	// Resource is the fenced resource.
	Resource string
	// Token is the refused token.
	Token Token
	// Highest is the highest token the resource has accepted.
	Highest Token
}

// Error implements error.
func (e *StaleTokenError) Error() string {
	return fmt.Sprintf("fencelock: stale fencing token %d for %q (highest seen %d)", e.Token, e.Resource, e.Highest)
}

// Is reports whether target is ErrStaleToken.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// Fence is the resource side of fencing, in memory: it remembers, per
// resource, the highest token it has accepted and which grant presented it,
// and admits writes by the fencing rule, which Check states. A lease that
// was lost while its holder was paused (GC, swap, SIGSTOP) still carries its
// old token, so its late write is refused once the next holder has written.
//
// A Fence is safe for concurrent use. Its zero value is ready to use.
//
// When the resource is a database, the same rule belongs inside it, so that
// the check, the record and the write are one atomic step: docs/fencing.md
// states the rule and gives patterns for PostgreSQL (SQL, psql) and Redis
// (Lua) that are tested against real servers with the same table of cases
// as Fence.
type Fence struct {
	// Observer, if set, receives an EventFenceRejected for every refused
	// write (Key is the resource). Set it before first use.
	Observer Observer

	mu   sync.Mutex
	seen map[string]fenceMark
}

type fenceMark struct {
	token  Token
	holder string
}

// Check admits a write to resource carrying token from holder (a lease's
// Owner, unique per grant). It accepts, and records, a token greater than
// any seen for resource, or equal to the highest from the same holder (a
// live holder writing again). Anything else returns a *StaleTokenError.
func (f *Fence) Check(resource string, token Token, holder string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.seen[resource]
	if token > m.token || (token == m.token && holder == m.holder && token != 0) {
		if f.seen == nil {
			f.seen = make(map[string]fenceMark)
		}
		f.seen[resource] = fenceMark{token: token, holder: holder}
		return nil
	}
	if f.Observer != nil {
		f.Observer.Observe(Event{Kind: EventFenceRejected, Key: resource, Owner: holder, Token: token, Previous: m.token})
	}
	return &StaleTokenError{Resource: resource, Token: token, Highest: m.token}
}

// Admit is Check with the lease's current token and owner.
func (f *Fence) Admit(resource string, l *Lease) error {
	return f.Check(resource, l.Token(), l.Owner())
}

// Highest returns the highest token accepted for resource (0 if none).
func (f *Fence) Highest(resource string) Token {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[resource].token
}
