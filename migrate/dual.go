package migrate

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// cleanupTimeout bounds the releases Dual makes on its own (after a
// partial acquire), with a fresh context: the caller's may be dead.
const cleanupTimeout = 10 * time.Second

// Dual is a driver.Backend that holds each lease on two backends at once,
// for the rolling-deploy phase of a migration (see the package doc).
//
// Both sides must implement driver.TokenFloorer (PostgreSQL, Redis and
// memory do): continuity of tokens depends on it. Dual implements
// driver.TokenFloorer itself (both sides), driver.BatchRenewer (one batch
// per side), driver.ForceReleaser (new side first, then old, where supported), driver.LossNotifier (forwarded to the sides
// that push loss), driver.Watcher (a wake-up from either side) and
// driver.Describer. It owns both backends: Close closes them.
type Dual struct {
	old, new   driver.Backend
	oldF, newF driver.TokenFloorer
	oldName    string
	newName    string

	mu     sync.Mutex
	unseen map[subKey]subState // see settle
	high   int                 // prune unseen when it reaches this size

	releasing map[leaseKey]time.Time // see releaseStarted
	relHigh   int                    // prune releasing when it reaches this size
}

var (
	_ driver.Backend       = (*Dual)(nil)
	_ driver.TokenFloorer  = (*Dual)(nil)
	_ driver.ForceReleaser = (*Dual)(nil)
	_ driver.LossNotifier  = (*Dual)(nil)
	_ driver.Watcher       = (*Dual)(nil)
	_ driver.WatchProber   = (*Dual)(nil)
	_ driver.Describer     = (*Dual)(nil)
	_ driver.BatchRenewer  = (*Dual)(nil)
	_ driver.Guarantor     = (*Dual)(nil)
)

// ErrNoFloor is returned by NewDual and CopyTokens when a backend cannot
// report or raise its token floor (it does not implement
// driver.TokenFloorer), so token continuity cannot be guaranteed. It
// matches driver.ErrUnsupported.
var ErrNoFloor = fmt.Errorf("%w: migrate: backend has no token floor (driver.TokenFloorer)", driver.ErrUnsupported)

// NewDual returns a backend that holds every lease on old and on new. It
// returns an error matching ErrNoFloor if either lacks driver.TokenFloorer.
// The Dual owns old and new: its Close closes both.
func NewDual(old, new driver.Backend) (*Dual, error) {
	if old == nil || new == nil {
		return nil, &driver.InvalidOptionError{Option: "Dual backend", Value: "nil", Reason: "both the old and the new backend are required"}
	}
	oldF, ok := old.(driver.TokenFloorer)
	if !ok {
		return nil, fmt.Errorf("%w: old backend %s", ErrNoFloor, nameOf(old))
	}
	newF, ok := new.(driver.TokenFloorer)
	if !ok {
		return nil, fmt.Errorf("%w: new backend %s", ErrNoFloor, nameOf(new))
	}
	return &Dual{old: old, new: new, oldF: oldF, newF: newF, oldName: nameOf(old), newName: nameOf(new)}, nil
}

func nameOf(b driver.Backend) string {
	if d, ok := b.(driver.Describer); ok {
		return d.Describe().Name
	}
	return fmt.Sprintf("%T", b)
}

// Old returns the old backend.
func (d *Dual) Old() driver.Backend { return d.old }

// New returns the new backend.
func (d *Dual) New() driver.Backend { return d.new }

// sub is one side's part of a dual grant, kept in the grant's Handle.
type sub struct {
	Token  driver.Token `json:"t"`
	Handle string       `json:"h,omitempty"`
}

type handle struct {
	Old sub `json:"o"`
	New sub `json:"n"`
	// Delayed records that the grant was acquired with a lock delay
	// (AcquireRequest.LockDelay): when one side refuses a renewal, the
	// other side's record is left to expire, so that its delay marker
	// keeps the key quiet there too (see finish).
	Delayed bool `json:"d,omitempty"`
}

func (d *Dual) encode(g driver.Grant, o, n driver.Grant, delayed bool) driver.Grant {
	h, _ := json.Marshal(handle{Old: sub{o.Token, o.Handle}, New: sub{n.Token, n.Handle}, Delayed: delayed})
	g.Handle = string(h)
	g.Token = max(o.Token, n.Token)
	g.TTL = minTTL(o.TTL, n.TTL)
	g.Valid = 0
	if o.Valid > 0 || n.Valid > 0 { // a side vouches for less than it keeps
		g.Valid = minTTL(cmp.Or(o.Valid, o.TTL), cmp.Or(n.Valid, n.TTL))
	}
	return g
}

func minTTL(a, b time.Duration) time.Duration {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// sides returns the two sub-grants of g. A grant without a Handle (the
// engine builds one from Inspect, after an ambiguous acquire or a
// rotation it did not see) has its sides looked up: each side's record,
// if it belongs to g's owner, and only if g's token is the one Inspect
// reports for them (the larger); any other token is a stale grant's, and
// ErrNotHeld, as a single store answers a stale token.
func (d *Dual) sides(ctx context.Context, g driver.Grant) (o, n driver.Grant, err error) {
	o = driver.Grant{Key: g.Key, Owner: g.Owner}
	n = o
	if g.Handle == "" {
		for _, s := range []struct {
			b driver.Backend
			g *driver.Grant
		}{{d.old, &o}, {d.new, &n}} {
			info, err := s.b.Inspect(ctx, g.Key)
			if err != nil {
				return o, n, err
			}
			if info.Owner == g.Owner {
				s.g.Token = info.Token
			}
		}
		if g.Token != max(o.Token, n.Token) {
			return o, n, driver.ErrNotHeld
		}
		return o, n, nil
	}
	var h handle
	if err := json.Unmarshal([]byte(g.Handle), &h); err != nil {
		return o, n, &driver.InvalidOptionError{Option: "Dual grant handle", Value: fmt.Sprintf("%.40q", g.Handle), Reason: "not a handle issued by migrate.Dual"}
	}
	if g.Token != max(h.Old.Token, h.New.Token) {
		// Not the grant Dual issued with this handle: a stale or forged
		// token must not borrow the current holder's sides.
		return o, n, driver.ErrNotHeld
	}
	o.Token, o.Handle = h.Old.Token, h.Old.Handle
	n.Token, n.Handle = h.New.Token, h.New.Handle
	return o, n, nil
}

// Acquire implements driver.Backend: old first, then new. If new refuses
// or fails, the old side is released before Acquire returns. The token is
// the larger of the two, and the side that issued the smaller one has its
// floor raised to it before the grant is returned: if that fails, both
// sides are released and the error returned, because the next holder on
// that side could otherwise get a lower token than this one.
//
// Before the old side, Acquire reads the new side's record, and if
// another owner holds the key there it returns that holder's HeldError
// without taking the old side: the new side would refuse it anyway, and
// meanwhile its old record, with a token above the new side's holder's,
// would be what Inspect reports (see merge), a holder that never held.
//
// The request goes to both sides as it is, lock delay included
// (AcquireRequest.LockDelay): a side in its delay refuses, as for a
// holder, and one that cannot keep a delay fails the call with
// ErrUnsupported.
func (d *Dual) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	info, err := d.new.Inspect(ctx, req.Key)
	if err != nil {
		return driver.Grant{}, fmt.Errorf("migrate: new backend: %w", err)
	}
	if info.Locked() && info.Owner != req.Owner {
		return driver.Grant{}, &driver.HeldError{Holder: info}
	}
	o, err := d.old.Acquire(ctx, req)
	if err != nil {
		return driver.Grant{}, err
	}
	n, err := d.new.Acquire(ctx, req)
	if err != nil {
		var held *driver.HeldError
		if !errors.As(err, &held) {
			// An ambiguous failure may have left a record on the new
			// side: remove it if it is ours.
			d.cleanup(req.Key, req.Owner, driver.Grant{}, newSide)
		}
		d.cleanup(req.Key, req.Owner, o, oldSide)
		return driver.Grant{}, err
	}
	g := d.encode(driver.Grant{Key: req.Key, Owner: req.Owner}, o, n, req.LockDelay > 0)
	if err := d.level(ctx, req.Key, o.Token, n.Token); err != nil {
		d.cleanup(req.Key, req.Owner, n, newSide)
		d.cleanup(req.Key, req.Owner, o, oldSide)
		return driver.Grant{}, err
	}
	return g, nil
}

// level raises the floor of the side whose token is the lower one to the
// higher, so that both sides' next grants exceed the dual token.
func (d *Dual) level(ctx context.Context, key string, ot, nt driver.Token) error {
	switch {
	case ot < nt:
		if err := d.oldF.RaiseFloor(ctx, key, nt); err != nil {
			return fmt.Errorf("migrate: raising the old backend's token floor of %q to %d: %w", key, nt, err)
		}
	case nt < ot:
		if err := d.newF.RaiseFloor(ctx, key, ot); err != nil {
			return fmt.Errorf("migrate: raising the new backend's token floor of %q to %d: %w", key, ot, err)
		}
	}
	return nil
}

// cleanup releases one side's grant with a fresh bounded context, best
// effort. With no token (g.Token == 0), the side's record is looked up
// and released if it belongs to owner.
func (d *Dual) cleanup(key, owner string, g driver.Grant, side int) {
	b := d.side(side)
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if g.Token == 0 {
		info, err := b.Inspect(ctx, key)
		if err != nil || info.Owner != owner {
			return
		}
		g = driver.Grant{Key: key, Owner: owner, Token: info.Token}
	}
	_ = b.Release(ctx, g) // an error leaves the record to its TTL
}

// The two sides, as onBoth numbers them.
const (
	oldSide = 0
	newSide = 1
)

// side returns the backend of side i.
func (d *Dual) side(i int) driver.Backend {
	if i == oldSide {
		return d.old
	}
	return d.new
}

// floorer returns the TokenFloorer of side i.
func (d *Dual) floorer(i int) driver.TokenFloorer {
	if i == oldSide {
		return d.oldF
	}
	return d.newF
}

// onBoth runs f for the old and the new side concurrently and returns both
// results, with the sides' errors combined by joinSides.
func onBoth[T any](f func(side int) (T, error)) (old, new T, err error) {
	var (
		wg     sync.WaitGroup
		errNew error
	)
	wg.Go(func() { new, errNew = f(newSide) })
	old, errOld := f(oldSide)
	wg.Wait()
	return old, new, joinSides(errOld, errNew)
}

// joinSides combines the two sides' errors: ErrNotHeld from either wins
// (the lease is lost even if the other side only failed transiently).
func joinSides(errOld, errNew error) error {
	switch {
	case errOld == nil && errNew == nil:
		return nil
	case errors.Is(errOld, driver.ErrNotHeld):
		return fmt.Errorf("migrate: old backend: %w", errOld)
	case errors.Is(errNew, driver.ErrNotHeld):
		return fmt.Errorf("migrate: new backend: %w", errNew)
	case errOld != nil && errNew != nil:
		return errors.Join(fmt.Errorf("migrate: old backend: %w", errOld), fmt.Errorf("migrate: new backend: %w", errNew))
	case errOld != nil:
		return fmt.Errorf("migrate: old backend: %w", errOld)
	default:
		return fmt.Errorf("migrate: new backend: %w", errNew)
	}
}

// A renewal can change one side and still fail as a whole: one side
// rotates its token, the other fails transiently (or the floors cannot be
// levelled afterwards). The engine then keeps the dual grant it had and
// retries with it, and the rotated side, asked with its old token, would
// answer ErrNotHeld: the lease would be lost though nobody else holds the
// key. So Dual remembers, per side, what such a renewal left in the store
// (unseen, keyed by the sub-grant the engine's dual grant still names), and
// the retry (or a release) sends that instead. Only the side's own answer
// to this Dual for exactly that key, owner and token is remembered, and the
// side still checks owner, token and expiry. An entry lasts as long as the
// record it describes could (the renewal's TTL) and is dropped once the
// engine holds a grant that names the new sub-grants, or the lease is
// refused.

// subKey names one side's part of a dual grant as the engine holds it.
type subKey struct {
	side       int
	key, owner string
	token      driver.Token
}

// subState is what a side's store has for a subKey.
type subState struct {
	g     driver.Grant
	until time.Time
}

// current returns the sub-grants to send for held (the sides the engine's
// dual grant names): each as held, or as a failed renewal left it in its
// store. moved reports whether any differs from held.
func (d *Dual) current(held [2]driver.Grant) (cur [2]driver.Grant, moved bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	for i, h := range held {
		cur[i] = h
		if e, ok := d.unseen[subKey{i, h.Key, h.Owner, h.Token}]; ok && now.Before(e.until) {
			cur[i], moved = e.g, true
		}
	}
	return cur, moved
}

// settle records the outcome of renewing one dual grant whose sides the
// engine holds as held: got and errs are each side's answer, reported is
// what the engine is told (nil: renewed, and it now holds the new
// sides). When the engine is told of a transient failure, a side that did
// renew is remembered if its token changed; a side that failed keeps what
// was known of it.
func (d *Dual) settle(held, got [2]driver.Grant, errs [2]error, reported error, ttl time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	for i, h := range held {
		k := subKey{i, h.Key, h.Owner, h.Token}
		switch {
		case reported == nil || errors.Is(reported, driver.ErrNotHeld):
			delete(d.unseen, k) // the engine has the new sides, or the lease is over
		case errs[i] != nil:
			// Unknown: keep what was known.
		case got[i].Token != h.Token:
			if d.unseen == nil {
				d.unseen = make(map[subKey]subState)
			}
			d.unseen[k] = subState{g: got[i], until: now.Add(ttl)}
		default:
			delete(d.unseen, k)
		}
	}
	if len(d.unseen) >= max(d.high, 64) {
		for k, e := range d.unseen {
			if !now.Before(e.until) {
				delete(d.unseen, k)
			}
		}
		d.high = 2 * len(d.unseen)
	}
}

// movedOn reports whether a side that refused a renewal of g (errs) still
// has a record of g's owner, or could not be asked: the refusal was of a
// token that moved, not of the lease.
func (d *Dual) movedOn(g driver.Grant, errs [2]error) bool {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for i, err := range errs {
		if !errors.Is(err, driver.ErrNotHeld) {
			continue
		}
		info, err := d.side(i).Inspect(ctx, g.Key)
		if err != nil || info.Owner == g.Owner {
			return true
		}
	}
	return false
}

// releaseMoved releases side i's record of g's owner, whatever its
// token, and returns nil if it did; otherwise refused, the side's answer
// to the release of the token it was sent.
func (d *Dual) releaseMoved(ctx context.Context, g driver.Grant, i int, refused error) error {
	info, err := d.side(i).Inspect(ctx, g.Key)
	if err != nil || info.Owner != g.Owner {
		return refused
	}
	if err := d.side(i).Release(ctx, driver.Grant{Key: g.Key, Owner: g.Owner, Token: info.Token}); err != nil {
		return refused
	}
	return nil
}

// leaseKey names a lease by key and owner (owners are unique per lease).
type leaseKey struct{ key, owner string }

// releaseMemory is how long Dual remembers that a lease's release began.
const releaseMemory = time.Minute

// startRelease remembers that the release of the lease of key and owner
// began, for releaseStarted.
func (d *Dual) startRelease(key, owner string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if d.releasing == nil {
		d.releasing = make(map[leaseKey]time.Time)
	}
	if len(d.releasing) >= max(d.relHigh, 64) {
		for k, until := range d.releasing {
			if !now.Before(until) {
				delete(d.releasing, k)
			}
		}
		d.relHigh = 2 * len(d.releasing)
	}
	d.releasing[leaseKey{key, owner}] = now.Add(releaseMemory)
}

// releaseStarted reports whether a release of the lease of key and owner
// began through this Dual in the last releaseMemory.
func (d *Dual) releaseStarted(key, owner string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	until, ok := d.releasing[leaseKey{key, owner}]
	return ok && time.Now().Before(until)
}

// forget drops what is remembered of side i's sub-grant h.
func (d *Dual) forget(i int, h driver.Grant) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.unseen, subKey{i, h.Key, h.Owner, h.Token})
}

// finish turns the two sides' answers to a renewal of g into the dual
// answer: ErrNotHeld from either side is ErrNotHeld (and the other side's
// record, if it renewed, is released); otherwise any side's
// error is a transient error; otherwise, after a rotation (or when a side
// was sent what an earlier failed renewal left), the sides' floors are
// levelled as Acquire does, and the grant is g with both new sub-grants.
// What the engine does not learn is remembered (settle).
func (d *Dual) finish(ctx context.Context, g driver.Grant, held, sent, got [2]driver.Grant, errs [2]error, req driver.RenewRequest, moved bool) (driver.Grant, error) {
	for i := range got {
		if errs[i] != nil {
			continue
		}
		if got[i].Key == "" {
			got[i].Key, got[i].Owner = sent[i].Key, sent[i].Owner
		}
		if got[i].Handle == "" {
			got[i].Handle = sent[i].Handle
		}
	}
	err := joinSides(errs[0], errs[1])
	if err == nil && (req.Rotate || moved) {
		err = d.level(ctx, g.Key, got[0].Token, got[1].Token)
	}
	if err != nil && !errors.Is(err, driver.ErrNotHeld) {
		d.raiseAboveRotation(ctx, g.Key, sent, got, errs)
	}
	d.settle(held, got, errs, err, req.TTL)
	if errors.Is(err, driver.ErrNotHeld) && !delayed(g) && !d.releaseStarted(g.Key, g.Owner) && !d.movedOn(g, errs) {
		// The lease is over, and nobody will release what the other
		// side just renewed: release it now, as Acquire does after a
		// refusal, so that "not held" means gone from both sides (the
		// record would otherwise keep the key from others on that side
		// until its TTL, and take a stale call with this grant). Not
		// if the holder's release has begun: the refusal may be that
		// release's doing, and the release (with the engine's look-up
		// by owner after a "not held") removes what is left. Nor if
		// the refusing side still has the owner's record under another
		// token: a rotation the caller has not seen moved it, and the
		// engine looks it up by owner and carries on with both sides.
		// Nor if the lease asked for a lock delay (delayed): the lease
		// ended without a release, and a release on the other side
		// would end its record cleanly, freeing the key at once there
		// for the clients that use only that side, while this holder's
		// last writes may still be on their way; left to expire, the
		// record's end starts its delay.
		for i := range got {
			if errs[i] == nil {
				d.cleanup(g.Key, g.Owner, got[i], i)
			}
		}
	}
	if err != nil {
		return driver.Grant{}, err
	}
	return d.encode(g, got[0], got[1], delayed(g)), nil
}

// delayed reports whether g's handle says it was acquired with a lock
// delay. A grant without a handle (built from Inspect by the engine) is
// taken as delayed: its request is not known, and leaving a record to
// its TTL costs only time, where releasing it could cut a delay short.
func delayed(g driver.Grant) bool {
	if g.Handle == "" {
		return true
	}
	var h handle
	return json.Unmarshal([]byte(g.Handle), &h) != nil || h.Delayed
}

// raiseAboveRotation raises, best effort, the floor of a side that failed
// a renewal transiently to the token the other side rotated to in it.
// Every token of a live dual lease then stays below the next grant on
// either side, as after a levelled renewal: should the holder stop here
// (a crash), whoever takes the key on the failed side, whose record
// expires first, has the larger token, and merge reports it, not the
// holder's rotated record. A failed raise leaves the levelling to the
// engine's retry, as before.
func (d *Dual) raiseAboveRotation(ctx context.Context, key string, sent, got [2]driver.Grant, errs [2]error) {
	for i := range got {
		other := 1 - i
		if errs[i] == nil && errs[other] != nil && got[i].Token > sent[i].Token {
			_ = d.floorer(other).RaiseFloor(ctx, key, got[i].Token)
		}
	}
}

// Renew implements driver.Backend: both sides, concurrently. ErrNotHeld
// from either side is ErrNotHeld: a dual lease never falls back to one
// side, and the other side's record is released (left to expire if the
// lease asked for a lock delay: see finish). A rotating renewal levels the sides' floors as Acquire does. If
// one side rotated and the renewal still failed (the other side failed
// transiently), the engine's retry with the grant it holds is sent with
// the rotated side's new token, so the lease survives.
func (d *Dual) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	o, n, err := d.sides(ctx, g)
	if err != nil {
		return driver.Grant{}, err
	}
	held := [2]driver.Grant{o, n}
	sent, moved := d.current(held)
	var errs [2]error
	no, nn, _ := onBoth(func(i int) (driver.Grant, error) {
		r, err := d.side(i).Renew(ctx, sent[i], req)
		errs[i] = err
		return r, err
	})
	return d.finish(ctx, g, held, sent, [2]driver.Grant{no, nn}, errs, req, moved)
}

// RenewBatch implements driver.BatchRenewer: one batch per side, the two
// concurrently, so a client holding thousands of dual leases renews them
// in two round trips (PostgreSQL and Redis both batch). A side without
// BatchRenewer renews its grants one after another. A grant is renewed
// only if both sides renewed it; ErrNotHeld from either side is that
// grant's ErrNotHeld. A side whose whole batch fails fails each of its
// grants transiently (the batch as a whole fails only if both sides'
// batches do), and what the other side did is remembered as in Renew.
func (d *Dual) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	out := make([]driver.RenewResult, len(grants))
	var (
		held, sent [2][]driver.Grant
		moved      []bool
		idx        []int // position in grants of each entry of held/sent
	)
	for i, g := range grants {
		o, n, err := d.sides(ctx, g)
		if err != nil {
			out[i].Err = err
			continue
		}
		h := [2]driver.Grant{o, n}
		s, mv := d.current(h)
		for k := range h {
			held[k], sent[k] = append(held[k], h[k]), append(sent[k], s[k])
		}
		moved, idx = append(moved, mv), append(idx, i)
	}
	var (
		res  [2][]driver.RenewResult
		errs [2]error
	)
	onBoth(func(k int) (struct{}, error) {
		res[k], errs[k] = renewAll(ctx, d.side(k), sent[k], req)
		if errs[k] == nil && len(res[k]) != len(sent[k]) {
			errs[k] = fmt.Errorf("%s returned %d batch results for %d grants", nameOf(d.side(k)), len(res[k]), len(sent[k]))
		}
		return struct{}{}, nil
	})
	if errs[oldSide] != nil && errs[newSide] != nil {
		return nil, joinSides(errs[oldSide], errs[newSide]) // neither side answered
	}
	for j, i := range idx {
		var (
			got [2]driver.Grant
			e   [2]error
		)
		for k := range got {
			if errs[k] != nil {
				e[k] = errs[k]
			} else {
				got[k], e[k] = res[k][j].Grant, res[k][j].Err
			}
		}
		out[i].Grant, out[i].Err = d.finish(ctx, grants[i],
			[2]driver.Grant{held[0][j], held[1][j]}, [2]driver.Grant{sent[0][j], sent[1][j]}, got, e, req, moved[j])
	}
	return out, nil
}

// renewAll renews grants on one side: in one batch if the side can,
// otherwise one by one.
func renewAll(ctx context.Context, b driver.Backend, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if len(grants) == 0 {
		return nil, nil
	}
	if br, ok := b.(driver.BatchRenewer); ok {
		return br.RenewBatch(ctx, grants, req)
	}
	res := make([]driver.RenewResult, len(grants))
	for i, g := range grants {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		res[i].Grant, res[i].Err = b.Renew(ctx, g, req)
	}
	return res, nil
}

// Release implements driver.Backend: the new side first, then the old,
// the reverse of Acquire's order. The old side is the gate every dual
// acquire passes first, so it is opened last: while a release is under
// way nobody can take old and then be refused by new (an acquire that
// took old would be rolled back, and Inspect would meanwhile show its
// owner as the holder of a key it never held). If the new side fails
// transiently, the old side is kept and the error returned (the engine
// retries the release; the record expires with its TTL otherwise); a
// transient failure of the old side is returned as such too. It returns
// ErrNotHeld if either side no longer had the grant, once the other's
// record is gone.
func (d *Dual) Release(ctx context.Context, g driver.Grant) error {
	d.startRelease(g.Key, g.Owner)
	o, n, err := d.sides(ctx, g)
	if err != nil {
		return err
	}
	held := [2]driver.Grant{o, n}
	sub, _ := d.current(held) // what a failed renewal may have left
	// A grant without a Handle is the engine's clean-up by owner: each
	// side's record was looked up. A side with no record of the owner's
	// has nothing left to release, which is success as long as the other
	// side had one: this releases what remains of the lease (a release
	// that raced a rotation removed one side and was refused by the
	// other, whose record had moved to a new token).
	lookedUp := g.Handle == "" && (sub[oldSide].Token != 0 || sub[newSide].Token != 0)
	release := func(i int) error {
		if sub[i].Token == 0 { // looked up and not ours: nothing to release
			if !lookedUp {
				return driver.ErrNotHeld
			}
			return nil
		}
		err := d.side(i).Release(ctx, sub[i])
		if err == nil || errors.Is(err, driver.ErrNotHeld) {
			d.forget(i, held[i])
		}
		return err
	}
	errNew := release(newSide)
	if errNew != nil && !errors.Is(errNew, driver.ErrNotHeld) {
		return fmt.Errorf("migrate: new backend: %w", errNew)
	}
	errOld := release(oldSide)
	// A side that refused while the other released the lease's record
	// (so the lease was live when its release began) was moved by a
	// rotating renewal racing this release: its record is the owner's
	// under a token the caller has not seen. Release it by owner now, as
	// the engine would after a "not held", but before it can expire
	// while the caller waits (owners are unique per lease).
	if errors.Is(errOld, driver.ErrNotHeld) && errNew == nil && sub[newSide].Token != 0 {
		errOld = d.releaseMoved(ctx, g, oldSide, errOld)
	}
	if errors.Is(errNew, driver.ErrNotHeld) && errOld == nil && sub[oldSide].Token != 0 {
		errNew = d.releaseMoved(ctx, g, newSide, errNew)
	}
	if errOld != nil && !errors.Is(errOld, driver.ErrNotHeld) {
		// Not "not held", even if new said so: the old side may still
		// have the record, and a retry must remove it.
		return fmt.Errorf("migrate: old backend: %w", errOld)
	}
	return joinSides(errOld, errNew)
}

// merge combines the two sides' records of one key. A key held by the
// same owner on both is reported with the dual token (the larger) and the
// shorter remaining time. A key held on one side only is reported with
// that side's holder (the old side's: a client of the old side alone, or
// a dual Acquire that has not reached the new side yet).
//
// A key held by different owners on the two sides is reported with the
// holder of the larger token: the later grant, the one the arbiter of the
// phase gave the key to. Every dual grant raises both sides' floors to its
// token before it is returned, so a grant on either side after a dual
// holder lost that side has a larger token than any of that holder's.
// With old-only and dual clients (the old side decides), a dual holder
// whose old record expired first and an old-only client that took the
// key since: the old side's token is the larger. With dual and new-only
// clients (the new side decides), a dual holder whose new record expired
// first and a new-only client: the new side's is. Reporting the other
// side would name a holder that has lost, until its record there expires.
// On equal tokens (no dual grant orders them) the new side's holder is
// reported.
//
// The one disagreement where the later grant is not the holder is a dual
// Acquire that took the old side and is then refused by the new one (and
// rolls back): Observe would deliver a leader that never led. Acquire
// makes it rare by refusing before the old side when the new side is
// held by another owner: it remains only when the new side is taken
// between that look and the new side's Acquire.
func merge(key string, o, n driver.Info) driver.Info {
	info := n
	switch {
	case o.Locked() && n.Locked() && o.Owner == n.Owner:
		info = o
		info.Token = max(o.Token, n.Token)
		info.Remaining = min(o.Remaining, n.Remaining)
	case o.Locked() && (!n.Locked() || o.Token > n.Token):
		info = o
	}
	info.Key = key
	return info
}

// Inspect implements driver.Backend (see merge for how the sides'
// records combine).
func (d *Dual) Inspect(ctx context.Context, key string) (driver.Info, error) {
	io, in, err := onBoth(func(i int) (driver.Info, error) { return d.side(i).Inspect(ctx, key) })
	if err != nil {
		return driver.Info{}, err
	}
	return merge(key, io, in), nil
}

// List implements driver.Backend: the keys held on either side, merged
// per key as Inspect does, sorted.
func (d *Dual) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	lo, ln, err := onBoth(func(i int) ([]driver.Info, error) { return d.side(i).List(ctx, prefix) })
	if err != nil {
		return nil, err
	}
	byKey := make(map[string]*[2]driver.Info)
	for i, l := range [][]driver.Info{lo, ln} {
		for _, info := range l {
			p := byKey[info.Key]
			if p == nil {
				p = new([2]driver.Info)
				byKey[info.Key] = p
			}
			p[i] = info
		}
	}
	out := make([]driver.Info, 0, len(byKey))
	for k, p := range byKey {
		out = append(out, merge(k, p[0], p[1]))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// ForceRelease implements driver.ForceReleaser on both sides, the new
// side first, then the old, in Release's order and for the same reason:
// the old side is the gate every dual acquire passes first, and while the
// holder's record is still on new, a dual acquire that got through an
// open gate would be refused by new and roll back, and meanwhile Inspect
// (so Leader and Observe) would report it as the holder of a key it never
// held. If the new side fails, the old side is left as it is and the
// error returned (a retry finishes the job). It returns
// driver.ErrUnsupported if neither side can force-release; a side that
// cannot is skipped (its record expires with its TTL, and the holder's
// next renewal, refused by the other side, ends the lease). A dual
// Acquire that took the old side before the force-release reached it and
// the new side after it had passed there has its new record released too
// (see forceStraggler): after ForceRelease, the owner it forced holds
// nothing on either side.
func (d *Dual) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	_, okOld := d.old.(driver.ForceReleaser)
	_, okNew := d.new.(driver.ForceReleaser)
	if !okOld && !okNew {
		return driver.Info{}, driver.ErrUnsupported
	}
	var infos [2]driver.Info
	for _, i := range []int{newSide, oldSide} {
		f, ok := d.side(i).(driver.ForceReleaser)
		if !ok {
			continue
		}
		info, err := f.ForceRelease(ctx, key)
		if err != nil {
			return driver.Info{}, fmt.Errorf("migrate: %s backend: %w", sideName(i), err)
		}
		infos[i] = info
	}
	if err := d.forceStraggler(ctx, key, infos); err != nil {
		return driver.Info{}, err
	}
	return merge(key, infos[oldSide], infos[newSide]), nil
}

// forceStraggler finishes a ForceRelease that raced a dual Acquire of
// key: the Acquire took the old side before the force-release reached
// it, and the new side after the force-release had passed it, so the old
// side's record was forced away (infos[oldSide]) and the new side now
// holds the same owner's. That lease is over (its old record is gone,
// and a side that pushes loss has told its holder so), and nobody else
// would remove the new record before its TTL: the holder's engine never
// renews or releases a lost lease. Meanwhile the key would be refused to
// every dual client and to the new side's own clients, and Inspect would
// name the forced holder. The record is released here, by owner and
// token, unless the old side has a record of that owner again (owners
// are unique per lease and an Acquire takes the old side first, so a
// record of the owner on both sides is a grant made after this force-
// release; a record of anyone else is left alone).
func (d *Dual) forceStraggler(ctx context.Context, key string, infos [2]driver.Info) error {
	forced := infos[oldSide]
	if !forced.Locked() {
		return nil
	}
	if _, ok := d.new.(driver.ForceReleaser); !ok {
		return nil // the new side keeps its records until their TTL, as documented
	}
	info, err := d.new.Inspect(ctx, key)
	if err != nil {
		return fmt.Errorf("migrate: new backend: %w", err)
	}
	if info.Owner != forced.Owner {
		return nil
	}
	o, err := d.old.Inspect(ctx, key)
	if err != nil {
		return fmt.Errorf("migrate: old backend: %w", err)
	}
	if o.Owner == forced.Owner {
		return nil
	}
	err = d.new.Release(ctx, driver.Grant{Key: key, Owner: info.Owner, Token: info.Token})
	if err != nil && !errors.Is(err, driver.ErrNotHeld) { // not held: gone already
		return fmt.Errorf("migrate: new backend: %w", err)
	}
	return nil
}

// sideName names side i in errors.
func sideName(i int) string {
	if i == oldSide {
		return "old"
	}
	return "new"
}

// NotifyLoss implements driver.LossNotifier by subscribing on the sides
// that push loss (etcd, ZooKeeper, memory); lost is called once, for the
// first side that reports. Sides that do not push are covered by renewal.
func (d *Dual) NotifyLoss(g driver.Grant, lost func(cause error)) (stop func()) {
	o, n, err := d.sides(context.Background(), g)
	if err != nil {
		return func() {}
	}
	var once sync.Once
	report := func(side string) func(error) {
		return func(cause error) {
			once.Do(func() { lost(fmt.Errorf("migrate: %s backend: %w", side, cause)) })
		}
	}
	var stops []func()
	if ln, ok := d.old.(driver.LossNotifier); ok {
		stops = append(stops, ln.NotifyLoss(o, report("old")))
	}
	if ln, ok := d.new.(driver.LossNotifier); ok {
		stops = append(stops, ln.NotifyLoss(n, report("new")))
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

// CanWatch implements driver.WatchProber: whether either side can watch.
// With neither, the engine polls from the start, and Semaphore and
// RWLock wait as they do on a backend that can only be polled.
func (d *Dual) CanWatch() bool {
	_, o := driver.Watches(d.old)
	_, n := driver.Watches(d.new)
	return o || n
}

// Watch implements driver.Watcher: a wake-up from either side's Watcher.
// It returns driver.ErrUnsupported if neither side has one (the engine
// then polls). The channel closes when ctx ends or either side's
// subscription ends.
func (d *Dual) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	var ins []<-chan struct{}
	ctx, cancel := context.WithCancel(ctx)
	for _, b := range []driver.Backend{d.old, d.new} {
		if w, ok := driver.Watches(b); ok {
			ch, err := w.Watch(ctx, key)
			if err != nil {
				cancel()
				return nil, err
			}
			ins = append(ins, ch)
		}
	}
	if len(ins) == 0 {
		cancel()
		return nil, driver.ErrUnsupported
	}
	out := make(chan struct{}, 1)
	forward := func(ch <-chan struct{}) {
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-ch:
				if !ok {
					cancel() // one side's subscription ended: end ours
					return
				}
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}
	var wg sync.WaitGroup
	for _, ch := range ins {
		wg.Go(func() { forward(ch) })
	}
	go func() {
		wg.Wait()
		cancel()
		close(out)
	}()
	return out, nil
}

// HighWater implements driver.TokenFloorer: per key, the larger of the
// two sides' marks; Global likewise.
func (d *Dual) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	ho, hn, err := onBoth(func(i int) (driver.HighWater, error) { return d.floorer(i).HighWater(ctx, prefix) })
	if err != nil {
		return driver.HighWater{}, err
	}
	out := driver.HighWater{Keys: make(map[string]driver.Token, len(ho.Keys)), Global: max(ho.Global, hn.Global)}
	for _, m := range []map[string]driver.Token{ho.Keys, hn.Keys} {
		for k, t := range m {
			out.Keys[k] = max(out.Keys[k], t)
		}
	}
	return out, nil
}

// RaiseFloor implements driver.TokenFloorer on both sides. For key "", a
// side without a global floor returns driver.ErrUnsupported (after the
// other side was raised).
func (d *Dual) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	_, _, err := onBoth(func(i int) (struct{}, error) { return struct{}{}, d.floorer(i).RaiseFloor(ctx, key, floor) })
	return err
}

// Describe implements driver.Describer.
func (d *Dual) Describe() driver.Description {
	desc := driver.Description{
		Name:          "dual(" + d.oldName + "," + d.newName + ")",
		Fencing:       "the larger of the two sides' tokens, pushed into the other side's floor before the grant is returned",
		Liveness:      "held on both sides; lost when either side loses it",
		Scope:         driver.ScopeStore,
		FailoverSafe:  true,
		LossDetection: "the earlier of the two sides' (a refusal or a pushed loss on either side ends the lease)",
	}
	for _, s := range []struct {
		label string
		b     driver.Backend
	}{{"old", d.old}, {"new", d.new}} {
		if ds, ok := s.b.(driver.Describer); ok {
			sd := ds.Describe()
			desc.Clock += s.label + " " + sd.Name + ": " + sd.Clock + "; "
			desc.Failover += s.label + " " + sd.Name + ": " + sd.Failover + "; "
			if sd.Scope != driver.ScopeStore {
				desc.Scope = driver.ScopeKey
			}
			desc.FailoverSafe = desc.FailoverSafe && sd.FailoverSafe
			for _, w := range sd.Warnings {
				desc.Warnings = append(desc.Warnings, s.label+" "+sd.Name+": "+w)
			}
		}
	}
	desc.Clock = strings.TrimSuffix(desc.Clock, "; ")
	desc.Failover = strings.TrimSuffix(desc.Failover, "; ")
	if desc.Failover == "" {
		desc.Scope, desc.FailoverSafe, desc.Failover = driver.ScopeKey, false, "unknown: neither side describes itself"
	}
	return desc
}

// Guarantees implements driver.Guarantor: a lease is held on both sides,
// so a guarantee is met only where both sides meet it. Each side is
// measured (a side that measures nothing leaves every guarantee to the
// engine's judgement of the dual itself); a guarantee that only one side
// measured is left out, and so judged by the engine, which reports it
// unknown unless the dual's own interfaces show it (FIFO, pushed loss).
// Observed and Fix name the side each part is about.
func (d *Dual) Guarantees(ctx context.Context) (map[driver.Guarantee]driver.Measurement, error) {
	var got [2]map[driver.Guarantee]driver.Measurement
	names := [2]string{"old " + d.oldName, "new " + d.newName}
	for i, b := range []driver.Backend{d.old, d.new} {
		g, ok := b.(driver.Guarantor)
		if !ok {
			return nil, nil
		}
		m, err := g.Guarantees(ctx)
		if err != nil {
			return nil, fmt.Errorf("migrate: measuring the %s side: %w", names[i], err)
		}
		got[i] = m
	}
	out := map[driver.Guarantee]driver.Measurement{}
	for g, o := range got[0] {
		n, ok := got[1][g]
		if !ok {
			continue
		}
		m := driver.Measurement{
			Met:      o.Met && n.Met,
			Observed: names[0] + ": " + o.Observed + "; " + names[1] + ": " + n.Observed,
		}
		var fixes []string
		for i, side := range []driver.Measurement{o, n} {
			if !side.Met && side.Fix != "" {
				fixes = append(fixes, names[i]+": "+side.Fix)
			}
		}
		m.Fix = strings.Join(fixes, "; ")
		out[g] = m
	}
	return out, nil
}

// Close implements driver.Backend: it closes both sides.
func (d *Dual) Close() error {
	return errors.Join(d.old.Close(), d.new.Close())
}
