package recipe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// rwSeparator is what an RWLock puts between its key and the keys of its
// records (see Keys).
const rwSeparator = "/.rw/"

// MaxReaders is the number of reader slots of every RWLock: at most
// MaxReaders read grants of one key are held at once, and an RLock beyond
// them waits for a reader to leave. A writer takes every slot, so this is
// also the number of slot leases a write grant holds besides the gate.
// It is part of the keys' layout: every client of a key must use the
// same number, so it is a constant.
const MaxReaders = 16

// rwHeader starts the metadata of every record of a read-write lock; the
// holder's own WithMetadata payload follows the first newline.
const rwHeader = "fencelock-rwlock "

// RWLock is a read-write lock on one key, for every client of the store:
// many readers at once, or one writer. Every grant is fenced. Create one
// with NewRWLock; its methods are safe for concurrent use.
//
// # Design
//
// Two kinds of record, each an ordinary Lease: a gate that
// serialises entry, and MaxReaders reader slots (see Keys). A reader takes
// the gate, then one free slot, checks that its gate lease is still valid
// by its own clock, and releases the gate; its grant is the slot's lease.
// A writer takes the gate, then every slot, waiting for the readers
// inside to leave, and keeps them all; its grant is the gate and every
// slot. So no reader holds a grant while a writer does, no two writers do,
// and a writer waiting for readers to drain holds the gate: readers that
// come after it queue behind it, and a stream of readers cannot starve it.
//
// Readers pass the gate too, briefly. Where every wait polls, readers
// passing the gate one after another can keep it busy at every poll of a
// waiting writer; where the store notifies, a woken writer still races
// the readers woken with it. So a writer that finds the gate held takes
// a third kind of record first, the intent, and keeps it
// until it has the gate; every reader looks at the intent before it
// enters (one Inspect) and waits while a writer holds it. Only the
// readers that looked before the intent was taken can still pass the
// gate, so it falls free and the writer takes it. This holds whatever
// backend each client uses (a fleet halfway through a migration shares
// the records). Writers are preferred: a stream of writers can keep
// readers waiting.
//
// # Fencing
//
// A grant's token (RWGrant.Token) is the gate's token under which it
// entered: for a reader, the gate token it held when it took its slot;
// for a writer, its gate lease's current token (which only rotation moves,
// upwards). Gate tokens strictly increase, and a writer keeps the gate
// for its whole grant, so a writer's token is strictly greater than every
// grant's that entered before it, and every grant that enters after it
// carries a greater token still. A fenced resource therefore accepts a
// read whose token is at least the highest writer's token it has seen,
// and a write whose token is greater than every token it has seen (or
// equal to the highest, from the same writer): RWFence implements that
// rule, and docs/semaphores.md states it for a database.
//
// # Implementation
//
// Generic: an RWLock only uses the Client's public API (Acquire,
// TryAcquire, Inspect, List and the recipe seam, Client.Begin), so it
// works on every backend; no backend has a native one yet. Its costs:
// a read looks at the intent, takes two leases and releases one (three
// round trips more than a lock); a write takes and renews 1 + MaxReaders
// leases, and the intent too while it waits for the gate.
type RWLock struct {
	c       *fencelock.Client
	key     string
	gate    string
	intent  string     // a writer's intent while it waits for the gate
	readers *Semaphore // the slots, for readers: tryAll, race and poll
}

// NewRWLock returns the read-write lock on key, for c's store. It stores
// nothing. It returns an *fencelock.InvalidKeyError (matching
// fencelock.ErrInvalidKey) for a key that
// driver.ValidateKey refuses or whose longest record key would be longer
// than driver.MaxKeyLen. A backend with stricter key rules refuses a
// record's key when it is first used.
func NewRWLock(c *fencelock.Client, key string) (*RWLock, error) {
	if err := needClient(c); err != nil {
		return nil, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	_, records := Keys(key, 0)
	slots := records[2:]
	rw := &RWLock{c: c, key: key, gate: records[0], intent: records[1]}
	longest := max(len(rw.gate), len(slots[MaxReaders-1]))
	if longest > driver.MaxKeyLen {
		return nil, &fencelock.InvalidKeyError{Key: key, Reason: fmt.Sprintf("its read-write lock's record keys are up to %d bytes, longer than %d (a read-write lock's key may be at most %d bytes)",
			longest, driver.MaxKeyLen, driver.MaxKeyLen-longest+len(key))}
	}
	rw.readers = &Semaphore{c: c, key: key, n: MaxReaders, slots: slots}
	return rw, nil
}

// Key returns the read-write lock's key.
func (rw *RWLock) Key() string { return rw.key }

// rwTestHookEntered, if set, runs after a reader got the gate and before
// it takes a slot (tests pause a reader there).
var rwTestHookEntered func(gate *fencelock.Lease)

// RLock takes a read grant, waiting while a writer holds or waits for the
// lock (see Design) (or while MaxReaders readers hold it), until it has one or ctx
// ends (or WithWait's bound passes: an error matching ErrNotAcquired). A
// wait that ends without a grant leaves nothing behind in the store. opts
// apply to the slot's lease as to Client.Acquire (WithMetadata's payload
// after the lock's header, see Holders), and WithTTL and WithLabel to the
// gate's lease too.
func (rw *RWLock) RLock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, false, true, opts)
}

// TryRLock makes one attempt at a read grant: it returns an error
// matching ErrNotAcquired at once when a writer holds the gate (or waits
// for readers to drain), a writer waits for the gate (a *HeldError
// naming its intent), or every slot is held. Other readers do not make
// it fail: it tries the gate again while readers pass it, and gives up
// only when one reader stays in the gate for Options.MaxBackoff, or for
// as long as MaxReaders+4 of the store's round trips if that is longer
// (its process paused or dead: it holds the gate until its lease ends),
// or after 2×MaxReaders other readers passed the gate before it. It
// leaves nothing behind when it fails.
func (rw *RWLock) TryRLock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, false, false, opts)
}

// Lock takes the write grant, waiting for the gate and then for every
// reader inside to leave, until it has it or ctx ends (or WithWait's
// bound passes: an error matching ErrNotAcquired). While it waits for
// readers it holds the gate, so no new reader enters. A wait that ends
// without the grant leaves nothing behind in the store. opts apply to
// every lease of the grant as to Client.Acquire (WithMetadata's payload
// to the gate's only).
func (rw *RWLock) Lock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, true, true, opts)
}

// TryLock makes one attempt at the write grant: it returns an error
// matching ErrNotAcquired at once when the gate or any reader slot is
// held. It leaves nothing behind when it fails.
func (rw *RWLock) TryLock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, true, false, opts)
}

func (rw *RWLock) lock(ctx context.Context, write, wait bool, opts []fencelock.AcquireOption) (*RWGrant, error) {
	begin := rw.c.BeginTry
	if wait {
		begin = rw.c.Begin
	}
	k, err := begin(ctx, opts...) // Close ends the wait, and waits for its clean-up
	if err != nil {
		return nil, err
	}
	bound := k.Context()
	var run *fencelock.Call // a waiting call's: its requests, failures and pauses
	if wait {
		run = k
	}
	var g *RWGrant
	for {
		if write {
			g, err = rw.write(bound, ctx, k, wait)
		} else {
			g, err = rw.read(bound, ctx, k, run)
		}
		if !errors.Is(err, errGateLost) || !wait || bound.Err() != nil {
			break
		}
		// The gate was lost before the grant was complete: enter again.
	}
	if errors.Is(err, errGateLost) && bound.Err() != nil {
		err = bound.Err()
	}
	if err != nil && bound.Err() != nil && !definite(err) {
		err = k.Outcome(time.Now(), err) // the end of bound, joined with the store's failure
	}
	return g, k.End(err)
}

// errGateLost reports that a grant's gate lease (or a reader's slot
// lease) ended, by its holder's clock, before the grant was complete; the
// grant's leases were released, and a waiting call enters again.
var errGateLost = fmt.Errorf("%w: a lease of the read-write lock ended before the grant was complete", fencelock.ErrNotAcquired)

// rwOpts returns the options of a lease of call k: its metadata is the
// header line (and the caller's payload, with payload), it has no wait
// bound, and, without keepHold, no minimum hold.
func rwOpts(k *fencelock.Call, header string, payload, keepHold bool) []fencelock.AcquireOption {
	meta := []byte(rwHeader + header + "\n")
	if payload {
		meta = append(meta, k.Metadata()...)
	}
	return leaseOptions(k, meta, keepHold)
}

// enter takes the gate, waiting for it with wait.
func (rw *RWLock) enter(ctx context.Context, wait bool, opts []fencelock.AcquireOption) (*fencelock.Lease, error) {
	if wait {
		return rw.c.Acquire(ctx, rw.gate, opts...)
	}
	return rw.c.TryAcquire(ctx, rw.gate, opts...)
}

// valid reports whether l is held by its holder's clock: after its local
// validity has ended, the store may have given its key to another.
func valid(l *fencelock.Lease) bool { return l.Remaining() > 0 }

// enterWrite takes the gate for a writer of call k. A waiting writer that
// finds it held takes the intent first (waiting for other writers'), then
// waits for the gate, and gives the intent up once it has the gate or has
// given up.
func (rw *RWLock) enterWrite(ctx context.Context, k *fencelock.Call, wait bool) (*fencelock.Lease, error) {
	gopts := rwOpts(k, "write", true, true)
	if !wait {
		return rw.enter(ctx, wait, gopts)
	}
	gate, err := rw.c.TryAcquire(ctx, rw.gate, gopts...)
	if err == nil || definite(err) && !errors.Is(err, fencelock.ErrNotAcquired) {
		return gate, err
	}
	intent, err := rw.c.Acquire(ctx, rw.intent, rwOpts(k, "write intent", false, false)...)
	if err != nil {
		return nil, err
	}
	defer releaseAll(ctx, intent)
	return rw.c.Acquire(ctx, rw.gate, gopts...)
}

// enterRead takes the gate for a reader, waiting for it with wait. A try
// that finds the gate held by another reader passing it (readers pass it
// one at a time, for a few round trips) tries again rather than refuse:
// TryRLock refuses for a writer, holding or waiting, and for a full set of
// slots, never because of readers only. Before each new attempt it looks
// at the intent, so a writer that began to wait meanwhile refuses it as
// at its first look (writers stay preferred). Between attempts it waits
// with the client's backoff, started again from Options.MinBackoff each
// time another reader is found in the gate. It gives up when one reader
// has stayed in the gate for longer than a reader needs to pass it
// (stuckAfter: its process paused or died, and it holds the gate until
// its lease ends; a try does not wait for that), or after tryReadPasses
// readers passed the gate before it (a
// stream of readers it keeps losing the gate to). How long readers take
// to pass grows with their number and the store's round trips, so the
// bound is on progress, not on the whole wait. A gate held by a writer,
// or by a record that is not a reader's, refuses at once.
func (rw *RWLock) enterRead(ctx context.Context, wait bool, opts []fencelock.AcquireOption) (*fencelock.Lease, error) {
	if wait {
		return rw.enter(ctx, wait, opts)
	}
	o := rw.c.Options()
	var (
		holder  string    // the reader last seen in the gate
		since   time.Time // when it was first seen there
		passes  int       // other readers seen in the gate
		backoff time.Duration
		trip    time.Duration // the longest round trip of this call's own requests
	)
	timed := func(start time.Time) { trip = max(trip, time.Since(start)) }
	for {
		start := time.Now()
		gate, err := rw.enter(ctx, wait, opts)
		timed(start)
		if err == nil || !errors.Is(err, fencelock.ErrNotAcquired) {
			return gate, err
		}
		kind, owner := rw.gateHolder(ctx, err)
		switch kind {
		case gateFree:
			// Whoever held it left between the attempt and the look.
			if passes++; passes > tryReadPasses {
				return nil, err
			}
			holder = ""
		case gateReader:
			if owner != holder {
				if passes++; passes > tryReadPasses {
					return nil, err
				}
				holder, since, backoff = owner, time.Now(), o.MinBackoff
			}
			d := min(jitter(backoff), stuckAfter(o.MaxBackoff, trip)-time.Since(since))
			if d <= 0 {
				return nil, err // the reader stays in the gate
			}
			if sleep(ctx, d) != nil {
				return nil, ctx.Err()
			}
			backoff = min(2*backoff, o.MaxBackoff)
		default:
			return nil, err
		}
		start = time.Now()
		werr := rw.awaitNoWriter(ctx, nil)
		timed(start)
		if werr != nil {
			return nil, werr
		}
	}
}

// jitter returns a duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// sleep waits for d, or until ctx ends (its error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// readerPassTrips is how many of the store's round trips a reader needs,
// at most, to pass the gate: its look at the intent, the gate, up to
// MaxReaders tries at the slots (all but one held), the gate's release,
// and one to spare.
const readerPassTrips = MaxReaders + 4

// stuckAfter is how long a reader may stay in the gate before a TryRLock
// takes it for stuck: maxBackoff (Options.MaxBackoff), or the time a
// reader needs to pass the gate, at trip per round trip (the longest a
// request of the try took), if that is longer. A slow store, or slots
// nearly all held, make a reader that makes progress take longer than
// MaxBackoff.
func stuckAfter(maxBackoff, trip time.Duration) time.Duration {
	return max(maxBackoff, readerPassTrips*trip)
}

// tryReadPasses is how many other readers a TryRLock lets pass the gate
// before it, at most, while it tries for the gate (see enterRead).
const tryReadPasses = 2 * MaxReaders

// gateKind is who holds a read-write lock's gate, as enterRead sees it.
type gateKind int

const (
	gateOther  gateKind = iota // a writer, another record, or unknown
	gateFree                   // nobody
	gateReader                 // a reader passing it
)

// gateHolder says who holds the gate (and its owner), after an attempt
// at it was refused with refusal: from the holder the store named in
// refusal (its *HeldError) if that carries the holder's metadata, else
// from one Inspect of the gate. A failed look counts as gateOther.
func (rw *RWLock) gateHolder(ctx context.Context, refusal error) (gateKind, string) {
	var info fencelock.Info
	var he *fencelock.HeldError
	if errors.As(refusal, &he) && he.Holder.Owner != "" && he.Holder.Metadata != nil {
		info = he.Holder
	} else {
		var err error
		if info, err = rw.c.Inspect(ctx, rw.gate); err != nil {
			return gateOther, ""
		}
		if info.Owner == "" {
			return gateFree, ""
		}
	}
	header, _ := parseRWMeta(info.Metadata)
	if fields := strings.Fields(header); len(fields) > 0 && fields[0] == "read" {
		return gateReader, info.Owner
	}
	return gateOther, info.Owner
}

// awaitNoWriter returns once no writer holds the intent, by one Inspect
// of the store, waiting with run's pause (Call.Pause) while one does.
// With run (a waiting call), each Inspect is one of run's requests
// (Call.Request), and a failure is retried until ctx ends or run's window
// of the store's failures does (see Call.Outcome). Without run it returns
// a *fencelock.HeldError naming the intent's holder (matching
// ErrNotAcquired) instead of waiting, and a failure at once.
func (rw *RWLock) awaitNoWriter(ctx context.Context, run *fencelock.Call) error {
	for {
		start := time.Now()
		info, err := rw.inspectIntent(ctx, run)
		switch {
		case err == nil && info.Owner == "":
			if run != nil {
				run.Outcome(start, nil)
			}
			return nil
		case err == nil && run == nil:
			return &fencelock.HeldError{Holder: info}
		case err != nil && run == nil:
			return err
		}
		if err == nil {
			err = &fencelock.HeldError{Holder: info} // an answer: wait for its expiry at most
		}
		if err := run.Outcome(start, err); err != nil {
			return err
		}
		if err := run.Pause(ctx, err); err != nil {
			return err
		}
	}
}

// inspectIntent looks at the intent: with run, as one of run's requests.
func (rw *RWLock) inspectIntent(ctx context.Context, run *fencelock.Call) (fencelock.Info, error) {
	if run == nil {
		return rw.c.Inspect(ctx, rw.intent)
	}
	rctx, cancel := run.Request()
	defer cancel()
	return rw.c.Inspect(rctx, rw.intent)
}

// read takes a read grant for call k on ctx (k's context), whose values
// the grant carries from parent; run is k if it waits, else nil.
func (rw *RWLock) read(ctx, parent context.Context, k, run *fencelock.Call) (*RWGrant, error) {
	wait := run != nil
	if err := rw.awaitNoWriter(ctx, run); err != nil {
		return nil, err
	}
	gate, err := rw.enterRead(ctx, wait, rwOpts(k, "read gate", false, false))
	if err != nil {
		return nil, err
	}
	if h := rwTestHookEntered; h != nil {
		h(gate)
	}
	token := gate.Token()
	// Waiting for a slot ends when the gate is lost.
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(gate.Context(), func() { cancel(errGateLost) })
	defer stop()
	slotOpts := rwOpts(k, "read token="+strconv.FormatUint(uint64(token), 10), true, true)
	s := rw.readers
	start := time.Now()
	l, err := s.tryAll(rctx, slotOpts)
	if err != nil && wait && (!definite(err) || errors.Is(err, fencelock.ErrNotAcquired)) && rctx.Err() == nil {
		if polled(rw.c) {
			if oerr := run.Outcome(start, err); oerr != nil {
				err = oerr
			} else {
				l, err = s.poll(rctx, run, slotOpts, err)
			}
		} else {
			l, err = s.race(rctx, slotOpts)
		}
	}
	if err != nil {
		// Whether the gate ended before this call lets it go: the
		// release below ends it too, and that is no loss.
		lost := !stop()
		releaseAll(ctx, gate)
		if lost && ctx.Err() == nil {
			return nil, errGateLost
		}
		return nil, err
	}
	// A reader that paused between the gate and its slot may have lost
	// the gate to a writer that came and went meanwhile: its grant would
	// carry a token below that writer's. Only a gate lease still valid
	// when the slot is held proves that no writer entered since.
	if !valid(gate) {
		releaseAll(ctx, l, gate)
		return nil, errGateLost
	}
	releaseAll(ctx, gate)
	// The slot may have been lost while the gate was released (its
	// renewal told "not held"): never hand out a grant already lost.
	if !valid(l) {
		releaseAll(ctx, l)
		return nil, errGateLost
	}
	return newRWGrant(rw, parent, false, token, []*fencelock.Lease{l}), nil
}

// write takes the write grant for call k on ctx (k's context), whose
// values the grant carries from parent.
func (rw *RWLock) write(ctx, parent context.Context, k *fencelock.Call, wait bool) (*RWGrant, error) {
	gate, err := rw.enterWrite(ctx, k, wait)
	if err != nil {
		return nil, err
	}
	token := gate.Token()
	// Waiting for the slots ends when the gate is lost.
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(gate.Context(), func() { cancel(errGateLost) })
	defer stop()
	slotOpts := rwOpts(k, "write token="+strconv.FormatUint(uint64(token), 10)+" gate="+gate.Owner(), false, true)
	n := len(rw.readers.slots)
	leases := make([]*fencelock.Lease, n)
	errs := make([]error, n)
	take := func(i int, key string) {
		if wait {
			leases[i], errs[i] = rw.c.Acquire(wctx, key, slotOpts...)
		} else {
			leases[i], errs[i] = rw.c.TryAcquire(wctx, key, slotOpts...)
		}
		if errs[i] != nil && definite(errs[i]) && !errors.Is(errs[i], fencelock.ErrNotAcquired) {
			cancel(errs[i]) // a bad key, a closed client: no other wait can succeed
		}
	}
	if !polled(rw.c) {
		// Every slot at once, each with the engine's own waiting.
		var wg sync.WaitGroup
		for i, key := range rw.readers.slots {
			wg.Go(func() { take(i, key) })
		}
		wg.Wait()
	} else {
		// One slot after another where every wait polls: many polling
		// requests in flight at once, cut short when one fails, are
		// what a store that applies a request after its caller gave up
		// (FerretDB) turns into records left until their TTL.
		for i, key := range rw.readers.slots {
			if take(i, key); errs[i] != nil {
				break
			}
		}
	}
	all := append([]*fencelock.Lease{gate}, leases...)
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || errors.Is(first, context.Canceled) && !errors.Is(err, context.Canceled)) {
			first = err
		}
	}
	if first == nil {
		for _, l := range all {
			if !valid(l) {
				first = errGateLost
			}
		}
	}
	if first != nil {
		// Whether the gate ended before this call lets it go: the
		// release below ends it too, and that is no loss.
		lost := !stop() || errors.Is(first, errGateLost)
		releaseAll(ctx, all...)
		if lost && ctx.Err() == nil {
			return nil, errGateLost
		}
		return nil, first
	}
	return newRWGrant(rw, parent, true, token, all), nil
}

// releaseAll releases every non-nil lease of ls at once
// (Lease.ReleaseNow), with a fresh context bounded by
// Options.ReleaseTimeout; a failure is retried in the background by the
// engine, and the record expires with its TTL anyway. They are parts of a
// grant that was never handed out (a try refused, a wait that ended, a
// gate lost), or the gate a reader passed: their minimum hold does not
// apply, so that a refusal does not close the lock to everyone for the
// window.
func releaseAll(ctx context.Context, ls ...*fencelock.Lease) {
	releaseLeases(ctx, false, ls)
}

// releaseLeases releases every non-nil lease of ls at once, as releaseAll
// does; with hold, each keeps its record until its minimum hold ends.
// Its requests are clean-up requests: given an ended context with ctx's
// values, a release runs on a fresh one bounded by
// Options.ReleaseTimeout and by Client.Close's budget, so that Close
// leaves none of them running.
func releaseLeases(ctx context.Context, hold bool, ls []*fencelock.Lease) {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cancel()
	var wg sync.WaitGroup
	for _, l := range ls {
		switch {
		case l == nil:
		case hold:
			wg.Go(func() { _ = l.Release(rctx) })
		default:
			wg.Go(func() { _ = l.ReleaseNow(rctx) })
		}
	}
	wg.Wait()
}

// RWGrant is a read or write grant of an RWLock: one lease (a reader's
// slot) or several (a writer's gate and every slot), held together. The
// grant is lost when any of them is lost; its leases are then released at
// once. Its methods are safe for concurrent use.
type RWGrant struct {
	rw     *RWLock
	write  bool
	token  fencelock.Token
	leases []*fencelock.Lease // a reader's slot; a writer's gate, then its slots
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	state grantState
	err   error
}

// grantState is where an RWGrant is in its life.
type grantState int

const (
	held grantState = iota
	released
	lost
)

func newRWGrant(rw *RWLock, parent context.Context, write bool, token fencelock.Token, ls []*fencelock.Lease) *RWGrant {
	g := &RWGrant{rw: rw, write: write, token: token, leases: ls, state: held}
	g.ctx, g.cancel = context.WithCancelCause(context.WithoutCancel(parent))
	// The minimum hold is the grant's: it counts from now for every
	// lease, not from when each arrived (a writer's gate may have come
	// long before its last slot).
	now := rw.c.Options().Clock.Now()
	for _, l := range ls {
		l.RestartMinHold(now)
	}
	for _, l := range ls {
		l.OnEnd(g.partEnded)
	}
	return g
}

// partEnded ends the grant when one of its leases ended while it was held
// (lost, or released by Client.Close), and releases the others. It runs
// under that lease's lock, as the lease ends (Lease.OnEnd): the grant's
// Done is closed before the lease's own.
func (g *RWGrant) partEnded(cause error) {
	g.mu.Lock()
	if g.state != held {
		g.mu.Unlock()
		return
	}
	var lostErr *fencelock.LostError
	if errors.As(cause, &lostErr) {
		g.state, g.err = lost, lostErr
	} else {
		g.state = released
	}
	g.mu.Unlock()
	g.cancel(cause)
	// The grant was handed out: its other leases keep their minimum hold.
	// Not under the lease's lock; Close releases them itself once it has
	// begun.
	go g.rw.c.Go(func(context.Context) { releaseLeases(context.Background(), true, g.leases) })
}

// Key returns the read-write lock's key.
func (g *RWGrant) Key() string { return g.rw.key }

// Shared reports whether the grant is a read grant.
func (g *RWGrant) Shared() bool { return !g.write }

// Token returns the grant's fencing token: the gate's token under which
// it entered (for a writer, its gate lease's current token, which only
// rotation moves, upwards). A fenced resource checks it by the rule of
// RWFence.
func (g *RWGrant) Token() fencelock.Token {
	if g.write {
		return g.leases[0].Token()
	}
	return g.token
}

// Lease returns the grant's principal lease: a reader's slot, a writer's
// gate. Its Owner identifies the grant.
func (g *RWGrant) Lease() *fencelock.Lease { return g.leases[0] }

// Leases returns every lease the grant holds: a reader's slot; a writer's
// gate, then its MaxReaders slots.
func (g *RWGrant) Leases() []*fencelock.Lease { return append([]*fencelock.Lease(nil), g.leases...) }

// Owner returns the owner string of the grant's principal lease.
func (g *RWGrant) Owner() string { return g.leases[0].Owner() }

// Done returns a channel that is closed when the grant ends: released, or
// lost (Err then says why).
func (g *RWGrant) Done() <-chan struct{} { return g.ctx.Done() }

// Context returns a context that is cancelled when the grant ends; its
// context.Cause is the *LostError of the lease that was lost, ErrReleased
// or ErrClosed. It carries the values of the context given to the call
// that took the grant, but not its cancellation.
func (g *RWGrant) Context() context.Context { return g.ctx }

// Err returns nil while the grant is held and after Release, and a
// *LostError (matching ErrLeaseLost) once one of its leases was lost.
func (g *RWGrant) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Remaining returns how long the grant stays valid by the holder's own
// clock if no further renewal succeeds: the least of its leases'. Zero
// once it has ended.
func (g *RWGrant) Remaining() time.Duration {
	r := time.Duration(-1)
	for _, l := range g.leases {
		if lr := l.Remaining(); r < 0 || lr < r {
			r = lr
		}
	}
	return max(r, 0)
}

// Release ends the grant and releases every lease it holds (a writer's
// slots before its gate). It returns an error matching ErrNotHeld if the
// grant was already released or lost (ErrClosed if Client.Close released
// it), or if the store no longer had one of its records; the errors of
// its leases' releases otherwise, joined. If ctx has already ended,
// Release still asks the store, as Lease.Release does.
func (g *RWGrant) Release(ctx context.Context) error {
	g.mu.Lock()
	switch g.state {
	case lost:
		err := g.err
		g.mu.Unlock()
		return fmt.Errorf("%w: %w", fencelock.ErrNotHeld, err)
	case released:
		g.mu.Unlock()
		if errors.Is(context.Cause(g.ctx), fencelock.ErrClosed) {
			return fencelock.ErrClosed
		}
		return fencelock.ErrNotHeld
	}
	g.state = released
	g.mu.Unlock()
	g.cancel(fencelock.ErrReleased)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	release := func(ls []*fencelock.Lease) {
		for _, l := range ls {
			wg.Go(func() {
				if err := l.Release(ctx); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	if g.write {
		release(g.leases[1:])
		release(g.leases[:1])
	} else {
		release(g.leases)
	}
	return errors.Join(errs...)
}

// RWHolder is one holder of a read-write lock, as the store sees it.
type RWHolder struct {
	// Info is the holder's principal record: a reader's slot, a writer's
	// gate (or, once a writer lost its gate, the first slot it still
	// holds). Info.Key and Info.Token are that record's key and store
	// token; Metadata is the holder's own WithMetadata payload (nil if
	// none), without the lock's header.
	fencelock.Info
	// Write reports a writer.
	Write bool
	// Grant is the grant's fencing token (RWGrant.Token): the gate token
	// it entered under.
	Grant fencelock.Token
	// Slots is the number of reader slots the holder has: 1 for a reader,
	// MaxReaders for a writer that holds the lock (fewer while it waits
	// for readers to drain), 0 for a reader passing the gate.
	Slots int
}

// Holders lists every holder of the lock, across every client of the
// store, in the order of their grant tokens: readers, a writer (with its
// gate and slots as one holder), and a reader passing the gate. It is one
// List of the store (the records' prefix, see Keys). Records whose metadata
// a holder replaced with Lease.SetMetadata are reported as readers with
// no grant token.
func (rw *RWLock) Holders(ctx context.Context) ([]RWHolder, error) {
	prefix := rw.key + rwSeparator
	infos, err := rw.c.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var hs []RWHolder
	writers := map[string]int{} // gate owner → index in hs
	writer := func(gateOwner string, info fencelock.Info, token fencelock.Token) *RWHolder {
		if i, ok := writers[gateOwner]; ok {
			return &hs[i]
		}
		writers[gateOwner] = len(hs)
		hs = append(hs, RWHolder{Info: info, Write: true, Grant: token})
		return &hs[len(hs)-1]
	}
	// The gate first, so that a writer's holder is its gate's record.
	sort.SliceStable(infos, func(i, j int) bool { return infos[i].Key == rw.gate && infos[j].Key != rw.gate })
	for _, info := range infos {
		rest, ok := strings.CutPrefix(info.Key, prefix)
		if !ok {
			continue
		}
		header, payload := parseRWMeta(info.Metadata)
		info.Metadata = payload
		fields := strings.Fields(header)
		attr := func(name string) string {
			for _, f := range fields {
				if v, ok := strings.CutPrefix(f, name+"="); ok {
					return v
				}
			}
			return ""
		}
		tok, _ := strconv.ParseUint(attr("token"), 10, 64)
		switch {
		case rest == "gate" && len(fields) > 0 && fields[0] == "write":
			writer(info.Owner, info, info.Token)
		case rest == "gate":
			hs = append(hs, RWHolder{Info: info, Grant: info.Token})
		case !strings.HasPrefix(rest, "r/"):
			// Not a record of this lock (a lock below its key).
		case len(fields) > 0 && fields[0] == "write":
			_, gateOwner, _ := strings.Cut(header, " gate=") // last: an owner may contain spaces
			w := writer(gateOwner, info, fencelock.Token(tok))
			w.Slots++
		default:
			hs = append(hs, RWHolder{Info: info, Grant: fencelock.Token(tok), Slots: 1})
		}
	}
	sort.SliceStable(hs, func(i, j int) bool { return hs[i].Grant < hs[j].Grant })
	return hs, nil
}

// parseRWMeta splits a record's metadata into the lock's header (without
// its prefix; empty if none) and the holder's own payload.
func parseRWMeta(md []byte) (string, []byte) {
	rest, ok := strings.CutPrefix(string(md), rwHeader)
	if !ok {
		return "", md
	}
	header, payload, _ := strings.Cut(rest, "\n")
	if payload == "" {
		return header, nil
	}
	return header, []byte(payload)
}
