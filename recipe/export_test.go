package recipe

import "github.com/fencelock/fencelock"

// SetRWTestHookEntered sets the hook a reader runs after it got the gate
// and before it takes a slot; the returned function removes it.
func SetRWTestHookEntered(f func(gate *fencelock.Lease)) (restore func()) {
	rwTestHookEntered = f
	return func() { rwTestHookEntered = nil }
}

// The key layout, for the tests (Keys is the public way).
const (
	PermitSeparator = permitSeparator
	RWSeparator     = rwSeparator
)

// SlotKey returns the key of permit slot i.
func (s *Semaphore) SlotKey(i int) string { return s.slots[i] }

// GateKey returns the key of the lock's gate.
func (rw *RWLock) GateKey() string { return rw.gate }

// IntentKey returns the key of a waiting writer's intent.
func (rw *RWLock) IntentKey() string { return rw.intent }

// SlotKey returns the key of reader slot i.
func (rw *RWLock) SlotKey(i int) string { return rw.slotKey(i) }

// UpgradeKey returns the key of the lock's upgrade record.
func (rw *RWLock) UpgradeKey() string { return rw.upgrade }

// SetRWTestHookDrain sets the hook a writer runs before it waits for a
// reader it found; the returned function removes it.
func SetRWTestHookDrain(f func(readers []fencelock.Info)) (restore func()) {
	rwTestHookDrain = f
	return func() { rwTestHookDrain = nil }
}

// SetMultiTestHookTaken sets the hook a multi-key call runs after each key
// it took; the returned function removes it.
func SetMultiTestHookTaken(f func(taken []*fencelock.Lease)) (restore func()) {
	multiTestHookTaken = f
	return func() { multiTestHookTaken = nil }
}
