// Package recipe builds distributed primitives out of fencelock's leases:
// a counting Semaphore, a read-write lock (RWLock, with uncapped readers
// and an upgradeable read), grants of several keys all or nothing
// (AcquireAll, TryAcquireAll) and leader election (Elect, CurrentLeader,
// Observe). They work on every backend, and every
// grant they hand out is fenced.
//
//	sem, err := recipe.NewSemaphore(c, "jobs", 4)
//	permit, err := sem.Acquire(ctx)
//
//	rw, err := recipe.NewRWLock(c, "config")
//	g, err := rw.RLock(ctx)
//
//	all, err := recipe.AcquireAll(ctx, c, []string{"account/42", "account/7"})
//
//	err = recipe.Elect(ctx, c, "scheduler", hostname, addr, lead, nil)
//
// The package uses only fencelock's exported API: Client.Acquire,
// TryAcquire, Inspect and List, and the seam for composite calls
// (Client.Begin and Call: the resolved options, one bounded request at a
// time, one backoff, an end that Client.Close waits for; Lease.ReleaseNow,
// Lease.RestartMinHold, Lease.OnEnd and Client.Go). A third party writes
// its own recipe the same way.
package recipe
