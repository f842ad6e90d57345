package recipe

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// MaxKeys is the largest number of distinct keys AcquireAll and
// TryAcquireAll take in one grant. A grant renews one lease per key, so
// the bound keeps a grant's cost reasonable.
const MaxKeys = 256

// AcquireAll takes every key of keys, all or nothing, waiting while any
// of them is held, until it has them all or ctx ends (or WithWait's bound
// passes: an error matching ErrNotAcquired). The grant holds one lease
// per key, each with its own fencing token for that key's fenced
// resource (MultiGrant.Token), as a lock of the key alone would.
//
// Keys are taken in their canonical order (sorted, duplicates removed),
// each with Client.Acquire's waiting, holding the ones already taken:
// two callers whose sets overlap take their common keys in the same order,
// so neither can hold a key the other has taken while waiting for one the
// other holds, and neither waits for the other in a cycle. A wait that
// ends without every key (ctx, WithWait, Client.Close: ErrClosed, a store
// failure, a bad key) releases the keys already taken at once
// (Lease.ReleaseNow, bounded by Options.ReleaseTimeout) before it
// returns: no partial grant is handed out, and none is left in the store.
// A key lost while the call waits for a later one makes it release every
// key and start again.
//
// Every backend takes the keys one request at a time; none has a native
// multi-key acquire yet. That is still all or nothing for the caller:
// the keys taken first are leases that no one else can take, and they are
// handed out only once the last is held, or given back.
//
// opts apply to every lease as to Client.Acquire; WithWait bounds the
// whole call, WithMetadata is stored with every key. A client that
// already holds one of the keys itself (a lease of its own) waits for it
// like any other holder.
func AcquireAll(ctx context.Context, c *fencelock.Client, keys []string, opts ...fencelock.AcquireOption) (*MultiGrant, error) {
	return acquireAll(ctx, c, keys, true, opts)
}

// TryAcquireAll makes one attempt at every key of keys, in their
// canonical order (see AcquireAll): it returns an error matching
// ErrNotAcquired (a *HeldError naming the first holder found) at once
// when any key is held, having released the keys it took before that one.
// opts apply as to AcquireAll.
func TryAcquireAll(ctx context.Context, c *fencelock.Client, keys []string, opts ...fencelock.AcquireOption) (*MultiGrant, error) {
	return acquireAll(ctx, c, keys, false, opts)
}

// CanonicalKeys returns keys in the order AcquireAll takes them: sorted,
// duplicates removed. MultiGrant.Keys returns the same.
func CanonicalKeys(keys []string) []string {
	out := slices.Clone(keys)
	slices.Sort(out)
	return slices.Compact(out)
}

// multiTestHookTaken, if set, runs after a key of a multi-key call was
// taken and before the next one is (tests pause a call there).
var multiTestHookTaken func(taken []*fencelock.Lease)

func acquireAll(ctx context.Context, c *fencelock.Client, keys []string, wait bool, opts []fencelock.AcquireOption) (*MultiGrant, error) {
	if err := needClient(c); err != nil {
		return nil, err
	}
	order := CanonicalKeys(keys)
	if len(order) == 0 || len(order) > MaxKeys {
		return nil, badOption("keys", len(order), "a multi-key grant takes 1 to %d distinct keys", MaxKeys)
	}
	for _, key := range order {
		if err := driver.ValidateKey(key); err != nil {
			return nil, err
		}
	}
	begin := c.BeginTry
	if wait {
		begin = c.Begin
	}
	k, err := begin(ctx, opts...) // Close ends the wait, and waits for its clean-up
	if err != nil {
		return nil, err
	}
	bound := k.Context()
	lopts := leaseOptions(k, k.Metadata(), true)
	var g *MultiGrant
	for {
		g, err = takeAll(bound, ctx, c, order, wait, lopts)
		if !errors.Is(err, errMemberLost) || !wait || bound.Err() != nil {
			break
		}
		// A key taken was lost before the grant was complete: start again.
	}
	if errors.Is(err, errMemberLost) && bound.Err() != nil {
		err = bound.Err()
	}
	return g, k.End(err)
}

// errMemberLost reports that a lease of a multi-key grant ended, by its
// holder's clock, before the grant was complete; the leases taken were
// released, and a waiting call starts again.
var errMemberLost = fmt.Errorf("%w: a key of the multi-key grant was lost before the grant was complete", fencelock.ErrNotAcquired)

// takeAll takes every key of order, in order, on ctx (the call's
// context), for a grant that carries parent's values. On any failure it
// releases what it took, at once, and returns the failure.
func takeAll(ctx, parent context.Context, c *fencelock.Client, order []string, wait bool, opts []fencelock.AcquireOption) (*MultiGrant, error) {
	// The wait for a later key ends when an earlier one is lost.
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	taken := make([]*fencelock.Lease, 0, len(order))
	var stops []func() bool
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	fail := func(err error) (*MultiGrant, error) {
		lost := errors.Is(context.Cause(wctx), errMemberLost)
		releaseAll(ctx, taken...)
		if lost && ctx.Err() == nil {
			return nil, errMemberLost
		}
		return nil, err
	}
	for _, key := range order {
		var l *fencelock.Lease
		var err error
		if wait {
			l, err = c.Acquire(wctx, key, opts...)
		} else {
			l, err = c.TryAcquire(wctx, key, opts...)
		}
		if err != nil {
			return fail(err)
		}
		taken = append(taken, l)
		stops = append(stops, context.AfterFunc(l.Context(), func() { cancel(errMemberLost) }))
		if h := multiTestHookTaken; h != nil {
			h(taken)
		}
	}
	// Never hand out a grant one of whose keys has ended meanwhile.
	for _, l := range taken {
		if !valid(l) {
			cancel(errMemberLost)
			return fail(errMemberLost)
		}
	}
	return newMultiGrant(c, parent, taken), nil
}

// MultiGrant is a grant of several keys, all held together: one lease
// per key, each with its own fencing token. The engine renews each lease
// as it renews a lock (on a backend that renews in batches, together in
// one request). The grant is lost when any of its leases is lost (its
// Context ends with that lease's *LostError as cause), and its other
// leases are then released. Its methods are safe for concurrent use.
type MultiGrant struct {
	leaseGroup // leases in canonical key order, never replaced: read without its lock
}

func newMultiGrant(c *fencelock.Client, parent context.Context, ls []*fencelock.Lease) *MultiGrant {
	g := &MultiGrant{}
	g.start(c, parent, ls)
	return g
}

// Keys returns the grant's keys, in canonical order (see CanonicalKeys).
func (g *MultiGrant) Keys() []string {
	keys := make([]string, len(g.leases))
	for i, l := range g.leases {
		keys[i] = l.Key()
	}
	return keys
}

// Leases returns the grant's leases, one per key, in the order of Keys.
func (g *MultiGrant) Leases() []*fencelock.Lease { return g.leaseList() }

// Lease returns the grant's lease on key, or nil if key is not one of
// its keys.
func (g *MultiGrant) Lease(key string) *fencelock.Lease {
	i, ok := slices.BinarySearchFunc(g.leases, key, func(l *fencelock.Lease, k string) int {
		switch {
		case l.Key() < k:
			return -1
		case l.Key() > k:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return g.leases[i]
}

// Token returns the fencing token of the grant's lease on key (0 if key
// is not one of its keys): a fenced resource of key checks it as it
// checks a lock's token (docs/fencing.md).
func (g *MultiGrant) Token(key string) fencelock.Token {
	if l := g.Lease(key); l != nil {
		return l.Token()
	}
	return 0
}

// Done returns a channel that is closed when the grant ends: released, or
// lost (Err then says why).
func (g *MultiGrant) Done() <-chan struct{} { return g.ctx.Done() }

// Context returns a context that is cancelled when the grant ends; its
// context.Cause is the *LostError of the lease that was lost, ErrReleased
// or ErrClosed. It carries the values of the context given to the call
// that took the grant, but not its cancellation.
func (g *MultiGrant) Context() context.Context { return g.ctx }

// Err returns nil while the grant is held and after Release, and a
// *LostError (matching ErrLeaseLost) once one of its leases was lost.
func (g *MultiGrant) Err() error { return g.lostErr() }

// Remaining returns how long the grant stays valid by the holder's own
// clock if no further renewal succeeds: the least of its leases'. Zero
// once it has ended.
func (g *MultiGrant) Remaining() time.Duration { return g.remaining() }

// Release ends the grant and releases every lease it holds, at once. It
// returns an error matching ErrNotHeld if the grant was already released
// or lost (ErrClosed if Client.Close released it), or if the store no
// longer had one of its records; the errors of its leases' releases
// otherwise, joined. If ctx has already ended, Release still asks the
// store, as Lease.Release does.
func (g *MultiGrant) Release(ctx context.Context) error { return g.release(ctx) }
