package check

import "github.com/fencelock/fencelock/safety/history"

// events builds a test history, times in ms.
type events struct{ h history.History }

// lease adds an event of a lease (until 0: none).
func (b *events) lease(t int64, proc string, kind history.Kind, key, id string, tok uint64, until int64) {
	e := history.Event{T: t * ms, Proc: proc, Kind: kind, Key: key, Lease: id, Token: tok}
	if until != 0 {
		e.Until = until * ms
	}
	b.h = append(b.h, e)
}

// fence adds the fenced resource's verdict on an access (access "" for
// a plain write).
func (b *events) fence(t int64, key, id string, tok uint64, accepted bool, reason, access string) {
	b.h = append(b.h, history.Event{T: t * ms, Proc: "fence", Kind: history.Write, Key: key, Lease: id, Token: tok,
		Accepted: accepted, Reason: reason, Fencing: true, Access: access})
}

// harness adds a harness event (a fault, a crash).
func (b *events) harness(t int64, kind history.Kind, proc, note string) {
	b.h = append(b.h, history.Event{T: t * ms, Proc: proc, Kind: kind, Note: note})
}
