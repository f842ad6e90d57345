package recipe

import "github.com/fencelock/fencelock"

// SetRWTestHookEntered sets the hook a reader runs after it got the gate
// and before it takes a slot; the returned function removes it.
func SetRWTestHookEntered(f func(gate *fencelock.Lease)) (restore func()) {
	rwTestHookEntered = f
	return func() { rwTestHookEntered = nil }
}
