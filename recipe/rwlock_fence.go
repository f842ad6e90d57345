package recipe

import (
	"sync"

	"github.com/fencelock/fencelock"
)

// RWFence is the resource side of a read-write lock's fencing, in memory:
// per resource it remembers the highest token any grant presented, and the
// highest token a writer presented and which grant that was. It admits
// reads and writes by the rule CheckRead and CheckWrite state, which
// docs/primitives.md also states for a database. A grant that was lost
// while its holder was paused still carries its old token: its late read
// is refused once a writer after it has written, and its late write once
// any grant after it has read or written.
//
// An RWFence is safe for concurrent use. Its zero value is ready to use.
type RWFence struct {
	// Observer, if set, receives an EventFenceRejected for every refused
	// read or write (Key is the resource). Set it before first use.
	Observer fencelock.Observer

	mu   sync.Mutex
	seen map[string]rwMark
}

type rwMark struct {
	top    fencelock.Token // the highest token of any read or write accepted
	write  fencelock.Token // the highest token of a write accepted
	writer string          // the grant that presented write
}

// CheckRead admits a read of resource by a read grant (or a write grant)
// carrying token: it accepts a token at least the highest a write
// presented (no writer has written since the grant entered), and records
// it. Anything else returns a *StaleTokenError whose Highest is that
// writer's token.
func (f *RWFence) CheckRead(resource string, token fencelock.Token) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.seen[resource]
	if token == 0 || token < m.write {
		return f.refuse(resource, token, "", m.write)
	}
	if token > m.top {
		m.top = token
		f.set(resource, m)
	}
	return nil
}

// CheckWrite admits a write to resource by a write grant carrying token
// from holder (the grant's Owner, unique per grant): it accepts a token
// greater than every token seen for the resource, read or written, or
// equal to the highest when the same holder wrote it (a live writer
// writing again), and records it. Anything else returns a
// *StaleTokenError whose Highest is the highest token seen.
func (f *RWFence) CheckWrite(resource string, token fencelock.Token, holder string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.seen[resource]
	if token > m.top || (token != 0 && token == m.top && token == m.write && holder == m.writer) {
		f.set(resource, rwMark{top: token, write: token, writer: holder})
		return nil
	}
	return f.refuse(resource, token, holder, m.top)
}

// Admit checks an access by grant g: a write for a write grant
// (CheckWrite with its token and owner), a read for a read grant.
func (f *RWFence) Admit(resource string, g *RWGrant) error {
	if g.Shared() {
		return f.CheckRead(resource, g.Token())
	}
	return f.CheckWrite(resource, g.Token(), g.Owner())
}

// Highest returns the highest token seen for resource and the highest a
// write presented (0 if none).
func (f *RWFence) Highest(resource string) (top, write fencelock.Token) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.seen[resource]
	return m.top, m.write
}

func (f *RWFence) set(resource string, m rwMark) {
	if f.seen == nil {
		f.seen = make(map[string]rwMark)
	}
	f.seen[resource] = m
}

func (f *RWFence) refuse(resource string, token fencelock.Token, holder string, highest fencelock.Token) error {
	if f.Observer != nil {
		f.Observer.Observe(fencelock.Event{Kind: fencelock.EventFenceRejected, Key: resource, Owner: holder, Token: token, Previous: highest})
	}
	return &fencelock.StaleTokenError{Resource: resource, Token: token, Highest: highest}
}
