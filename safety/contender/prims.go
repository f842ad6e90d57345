package contender

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/recipe"
	"github.com/fencelock/fencelock/safety/fence"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/mono"
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
//
// With Config.Upgrade as well, every third round (each worker's first,
// fourth, … round) takes an upgradeable read grant
// (RWLock.UpgradeableRLock), reads with it, and upgrades it
// (RWGrant.Upgrade) before it writes: two grants in the history, one
// after the other. The read grant is a lease of the round's id on its
// slot key, whose belief ends (ReleaseStart) when Upgrade is called and
// whose Released follows Upgrade's return; the write grant is a lease of
// the round's id with "u" appended on the gate key, from an AcquireStart
// of the gate (before Upgrade is called) to its Acquired (Upgrade
// returned) or AcquireFailed (Upgrade failed: the read grant is then
// released). W1..W3 judge the upgraded write as any writer's.
//
// With Config.Multi = M, a round takes a set of 2 to M distinct keys all
// or nothing (recipe.AcquireAll; every second round, each worker's
// second, fourth, …, makes one attempt, recipe.TryAcquireAll): one lease per key
// in the history, with the round's id, a dot and the key's place in the
// set (canonical order, from 1) as its lease id, so that every key's events read as a lock's:
// an AcquireStart per key before the call, an Acquired per key of the
// grant (its token is that key's lease's, MultiGrant.Token) or an
// AcquireFailed per key, a Belief per key before each round of writes,
// a write per key to that key's fenced resource with that key's token,
// a Lost per key when the grant is lost, and a ReleaseStart and Released
// per key. The contender's backend reports every record the store
// granted it and every release it asked for (history.StoreAcquired,
// StoreReleased), so that the checker's M1 sees whether a call handed out
// or gave back every record it took.

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

// upgradeRound is one round of an upgradeable read that upgrades
// (Config.Upgrade): read grant, reads, Upgrade, writes, release.
func (w *worker) upgradeRound(ctx context.Context, key, id string) {
	k := w.k
	cfg := k.cfg
	rid, wid := id, id+"u"
	k.out.Emit(history.Event{Kind: history.AcquireStart, Key: key, Lease: rid})
	rw, err := recipe.NewRWLock(k.cli, key)
	if err != nil {
		k.out.Emit(history.Event{Kind: history.AcquireFailed, Key: key, Lease: rid, Err: err.Error()})
		return
	}
	actx, cancel := context.WithTimeout(ctx, cfg.AcquireTimeout)
	g, err := rw.UpgradeableRLock(actx)
	cancel()
	if err != nil {
		k.out.Emit(history.Event{Kind: history.AcquireFailed, Key: key, Lease: rid, Err: err.Error()})
		return
	}
	slot := g.Lease().Key()
	now := mono.Now()
	k.out.Emit(history.Event{T: now, Kind: history.Acquired, Key: slot, Lease: rid, Token: uint64(g.Token()),
		Until: now + int64(g.Remaining()), Note: g.Owner()})
	// Which of the round's two grants a loss ends.
	var mu sync.Mutex
	curKey, curID := slot, rid
	k.leaseWatches.Add(1)
	go func() {
		defer k.leaseWatches.Done()
		<-g.Done()
		if lerr := g.Err(); lerr != nil {
			mu.Lock()
			ck, ci := curKey, curID
			mu.Unlock()
			k.out.Emit(history.Event{Kind: history.Lost, Key: ck, Lease: ci, Token: uint64(g.Token()), Err: lerr.Error()})
		}
	}()
	if lost := w.hold(ctx, held{grant: g, key: slot, resource: key, access: fence.AccessRead}, slot, rid); lost {
		return
	}
	k.out.Emit(history.Event{Kind: history.ReleaseStart, Key: slot, Lease: rid, Token: uint64(g.Token())})
	_, records := recipe.Keys(key, 0)
	gate := records[0]
	k.out.Emit(history.Event{Kind: history.AcquireStart, Key: gate, Lease: wid})
	uctx, cancel := context.WithTimeout(ctx, cfg.AcquireTimeout)
	err = g.Upgrade(uctx)
	cancel()
	if err != nil {
		k.out.Emit(history.Event{Kind: history.AcquireFailed, Key: gate, Lease: wid, Err: err.Error()})
		rerr := w.release(g)
		k.out.Emit(history.Event{Kind: history.Released, Key: slot, Lease: rid, Token: uint64(g.Token()), Err: errString(rerr)})
		return
	}
	k.out.Emit(history.Event{Kind: history.Released, Key: slot, Lease: rid})
	mu.Lock()
	curKey, curID = gate, wid
	mu.Unlock()
	now = mono.Now()
	k.out.Emit(history.Event{T: now, Kind: history.Acquired, Key: gate, Lease: wid, Token: uint64(g.Token()),
		Until: now + int64(g.Remaining()), Note: g.Owner()})
	if lost := w.hold(ctx, held{grant: g, key: gate, resource: key, access: fence.AccessWrite}, gate, wid); lost {
		return
	}
	k.out.Emit(history.Event{Kind: history.ReleaseStart, Key: gate, Lease: wid, Token: uint64(g.Token())})
	rerr := w.release(g)
	k.out.Emit(history.Event{Kind: history.Released, Key: gate, Lease: wid, Token: uint64(g.Token()), Err: errString(rerr)})
}

// release releases a round's grant on a fresh context: a stop must not
// leave it behind.
func (w *worker) release(g interface{ Release(context.Context) error }) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*w.k.cfg.TTL)
	defer cancel()
	return g.Release(ctx)
}

// multiRound is one round of a multi-key grant (Config.Multi): take a
// set of keys all or nothing, write to each key's resource with its token
// while the grant is believed held, release.
func (w *worker) multiRound(ctx context.Context, id string) {
	k := w.k
	cfg := k.cfg
	n := 2 + w.rng.IntN(cfg.Multi-1)
	var pick []string
	for _, i := range w.rng.Perm(len(cfg.Keys))[:n] {
		pick = append(pick, cfg.Keys[i])
	}
	keys := recipe.CanonicalKeys(pick)
	ids := make(map[string]string, n)
	for i, key := range keys {
		ids[key] = id + "." + strconv.Itoa(i+1)
		k.out.Emit(history.Event{Kind: history.AcquireStart, Key: key, Lease: ids[key]})
	}
	actx, cancel := context.WithTimeout(ctx, cfg.AcquireTimeout)
	take := recipe.AcquireAll
	if w.n%2 == 0 {
		take = recipe.TryAcquireAll // one attempt: a refusal gives back the keys taken before
	}
	g, err := take(actx, k.cli, keys)
	cancel()
	if err != nil {
		for _, key := range keys {
			k.out.Emit(history.Event{Kind: history.AcquireFailed, Key: key, Lease: ids[key], Err: err.Error()})
		}
		return
	}
	// The grant's keys as it reports them: a key asked for but not in
	// the grant ends its attempt with AcquireFailed (M1 judges that).
	have := g.Keys()
	now := mono.Now()
	until := now + int64(g.Remaining())
	for _, key := range keys {
		if l := g.Lease(key); l != nil {
			k.out.Emit(history.Event{T: now, Kind: history.Acquired, Key: key, Lease: ids[key], Token: uint64(l.Token()), Until: until, Note: l.Owner()})
		} else {
			k.out.Emit(history.Event{T: now, Kind: history.AcquireFailed, Key: key, Lease: ids[key], Err: "the grant does not hold this key"})
		}
	}
	k.leaseWatches.Add(1)
	go func() {
		defer k.leaseWatches.Done()
		<-g.Done()
		if lerr := g.Err(); lerr != nil {
			for _, key := range have {
				k.out.Emit(history.Event{Kind: history.Lost, Key: key, Lease: ids[key], Token: uint64(g.Token(key)), Err: lerr.Error()})
			}
		}
	}()
	if lost := w.multiHold(ctx, g, have, ids); lost {
		return
	}
	for _, key := range have {
		k.out.Emit(history.Event{Kind: history.ReleaseStart, Key: key, Lease: ids[key], Token: uint64(g.Token(key))})
	}
	rerr := w.release(g)
	for _, key := range have {
		k.out.Emit(history.Event{Kind: history.Released, Key: key, Lease: ids[key], Token: uint64(g.Token(key)), Err: errString(rerr)})
	}
}

// multiHold is hold for a multi-key grant: before each round of writes
// one check of the grant and a Belief per key, then a write per key to
// its own resource with its own token. It reports whether the grant was
// lost.
func (w *worker) multiHold(ctx context.Context, g *recipe.MultiGrant, keys []string, ids map[string]string) (lost bool) {
	k := w.k
	cfg := k.cfg
	hold := cfg.Hold/2 + time.Duration(w.rng.Int64N(int64(cfg.Hold/2)+1))
	end := time.Now().Add(hold)
	toks := make([]uint64, len(keys))
	for ctx.Err() == nil && time.Now().Before(end) {
		t := mono.Now()
		rem := g.Remaining()
		if rem <= 0 {
			select {
			case <-g.Done():
			case <-ctx.Done():
			}
			break
		}
		for i, key := range keys {
			toks[i] = uint64(g.Token(key))
			k.out.Emit(history.Event{T: t, Kind: history.Belief, Key: key, Lease: ids[key], Token: toks[i], Until: t + int64(rem)})
		}
		k.mu.Lock()
		pause := k.pauseNext
		k.pauseNext = false
		k.mu.Unlock()
		if pause {
			k.out.Emit(history.Event{Kind: history.Pause, Key: keys[0], Lease: ids[keys[0]], Token: toks[0], Note: "self: between grant check and writes"})
			stopSelf()
		}
		for i, key := range keys {
			w.write(ctx, key, ids[key], toks[i], "")
		}
		select {
		case <-g.Done():
		case <-ctx.Done():
		case <-time.After(cfg.WriteEvery):
		}
	}
	return g.Err() != nil
}
