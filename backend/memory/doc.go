// Package memory is fencelock's in-process backend.
//
// It keeps locks in a Store inside the current process. Use it where every
// contender lives in one process (tests, a single binary coordinating its
// own goroutines) and as the reference that other backends are measured
// against: it implements every optional capability of package driver.
//
// It is also a test tool for applications: a Store can force a lease to
// expire (Expire), take it away and tell the holder (ForceRelease), and a
// Backend can be cut off from its store (SetUnreachable), so code that
// handles lost leases can be tested without a database.
//
//	store := memory.NewStore()
//	a, err := fencelock.New(store.Backend(), nil) // two clients, one store
//	if err != nil { … }
//	b, err := fencelock.New(store.Backend(), nil)
//
// ExampleStore runs this in full.
//
// # URLs
//
// fencelock.Open takes
//
//	mem://NAME
//	mem:NAME (the same)
//
// for example mem://orders, which opens a Backend on Named("orders"):
// every URL with the same name, in one process, reaches the same Store
// (mem:// is the store named ""). The scheme is case-insensitive. There is
// no path and there are no parameters of this package; fencelock.Open
// accepts the engine's (ttl, renew_interval, margin, rotate_every, owner,
// lock_delay, require) and removes them first, and any other parameter is
// an error. A mem URL
// carries no credentials, so there is nothing to redact. This package
// registers the scheme in its init, as every backend does: a program that
// opens mem URLs imports it, for its side effect if need be,
//
//	import _ "github.com/fencelock/fencelock/backend/memory"
//
// and without it Open fails with fencelock.ErrUnknownScheme naming that
// import. This package has no Open: New, NewStore and Named are its
// constructors, since an in-process store has nothing to connect to and
// cannot fail to open.
//
// Expiry is judged by the Store's clock (time.Now, so it follows fake time
// inside a testing/synctest bubble). Tokens come from a per-key counter that
// is never deleted, so they strictly increase for the life of the Store.
package memory
