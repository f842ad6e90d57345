package contender

import (
	"context"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
	"github.com/fencelock/fencelock/safety/fence"
)

// Primitives beyond the lock.
//
// With Config.Permits = N, every key is a semaphore of N permits
// (recipe.NewSemaphore). A round then takes a permit instead of
// the lock; its AcquireStart and AcquireFailed events name the
// semaphore's key, and everything from Acquired on names the permit's
// slot key (Lease.Key): Belief, Lost, the releases, and the writes to the
// fenced resource, which fences each slot key on its own with the slot's
// token, as docs/primitives.md says a resource must. The checker groups
// the slot keys by their semaphore (safety/check, S1 and S2).
//
// With Config.RW, every key is a read-write lock (recipe.NewRWLock).
// A round takes the write grant one time in three (each worker's second,
// fifth, … round), else a read grant. Its AcquireStart names the lock's gate key for a write
// (a writer waits for the gate) and the lock's key for a read; from
// Acquired on, events name the grant's principal lease's key: a writer's
// gate key, a reader's slot key (each exclusive: P3 per key judges that no
// two writers, and no two readers of one slot, overlap). Its accesses go
// to one fenced resource per lock, named by the lock's key, as reads or
// writes (fence.Client.Access) with the grant's token (RWGrant.Token),
// judged by recipe.RWFence's rule. The checker judges the lock as a
// whole (safety/check, W1..W3).

// grant is what a round holds: a *fencelock.Lease (a lock or a permit)
// or a *recipe.RWGrant.
type grant interface {
	Token() fencelock.Token
	Remaining() time.Duration
	Done() <-chan struct{}
	Err() error
	Release(context.Context) error
	Owner() string
}

// held is a round's grant and where its events and writes go.
type held struct {
	grant
	// key names the grant in events: the lease's key (a permit's slot
	// key; a read-write grant's principal lease's key).
	key string
	// resource is the fenced resource's key its writes go to, and access
	// how ("" for a lock or permit; fence.AccessRead or AccessWrite).
	resource, access string
}

// startKey returns the key an AcquireStart names for a round on key (a
// writer waits for the gate of the read-write lock).
func (w *worker) startKey(key string, write bool) string {
	if w.k.cfg.RW && write {
		_, records := recipe.Keys(key, 0)
		return records[0] // the gate
	}
	return key
}

// acquire takes the lock on key, a permit of the semaphore on key
// (Config.Permits), or a read (or, with write, the write) grant of the
// read-write lock on key (Config.RW): with once, one attempt, else a
// blocking call.
func (w *worker) acquire(ctx context.Context, key string, once, write bool) (held, error) {
	k := w.k
	var l *fencelock.Lease
	var err error
	switch {
	case k.cfg.RW:
		rw, err := recipe.NewRWLock(k.cli, key)
		if err != nil {
			return held{}, err
		}
		var g *recipe.RWGrant
		switch {
		case write && once:
			g, err = rw.TryLock(ctx)
		case write:
			g, err = rw.Lock(ctx)
		case once:
			g, err = rw.TryRLock(ctx)
		default:
			g, err = rw.RLock(ctx)
		}
		if err != nil {
			return held{}, err
		}
		access := fence.AccessRead
		if write {
			access = fence.AccessWrite
		}
		return held{grant: g, key: g.Lease().Key(), resource: key, access: access}, nil
	case k.cfg.Permits > 0:
		sem, serr := recipe.NewSemaphore(k.cli, key, k.cfg.Permits)
		if serr != nil {
			return held{}, serr
		}
		if once {
			l, err = sem.TryAcquire(ctx)
		} else {
			l, err = sem.Acquire(ctx)
		}
	case once:
		l, err = k.cli.TryAcquire(ctx, key)
	default:
		l, err = k.cli.Acquire(ctx, key)
	}
	if err != nil {
		return held{}, err
	}
	return held{grant: l, key: l.Key(), resource: l.Key()}, nil
}
