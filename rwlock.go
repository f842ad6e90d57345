package fencelock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// RWSeparator is what an RWLock puts between its key and the keys of its
// records: the gate key + RWSeparator + "gate", the reader slot keys
// key + RWSeparator + "r/0" … key + RWSeparator + "r/" +
// strconv.Itoa(MaxReaders-1), and a waiting writer's intent
// key + RWSeparator + "w". Keys that contain it are reserved for
// read-write locks: a plain lock on such a key occupies the gate or a
// reader slot.
const RWSeparator = "/.rw/"

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
// with Client.RWLock; its methods are safe for concurrent use.
//
// # Design
//
// Two kinds of record, each an ordinary Lease: a gate (GateKey) that
// serialises entry, and MaxReaders reader slots (SlotKey). A reader takes
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
// a third kind of record first, the intent (IntentKey), and keeps it
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
// Generic: an RWLock only uses the Client's Acquire, TryAcquire and List,
// so it works on every backend; no backend has a native one yet. Its costs:
// a read looks at the intent, takes two leases and releases one (three
// round trips more than a lock); a write takes and renews 1 + MaxReaders
// leases, and the intent too while it waits for the gate.
type RWLock struct {
	c       *Client
	key     string
	gate    string
	intent  string     // a writer's intent while it waits for the gate
	readers *Semaphore // the slots, for readers: tryAll, race and poll
}

// RWLock returns the read-write lock on key. It stores nothing. It returns
// an *InvalidKeyError (matching ErrInvalidKey) for a key that
// driver.ValidateKey refuses or whose longest record key would be longer
// than driver.MaxKeyLen. A backend with stricter key rules refuses a
// record's key when it is first used.
func (c *Client) RWLock(key string) (*RWLock, error) {
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	rw := &RWLock{c: c, key: key, gate: key + RWSeparator + "gate", intent: key + RWSeparator + "w"}
	slots := make([]string, MaxReaders)
	for i := range slots {
		slots[i] = key + RWSeparator + "r/" + strconv.Itoa(i)
	}
	longest := max(len(rw.gate), len(slots[MaxReaders-1]))
	if longest > driver.MaxKeyLen {
		return nil, &InvalidKeyError{Key: key, Reason: fmt.Sprintf("its read-write lock's record keys are up to %d bytes, longer than %d (a read-write lock's key may be at most %d bytes)",
			longest, driver.MaxKeyLen, driver.MaxKeyLen-longest+len(key))}
	}
	rw.readers = &Semaphore{c: c, key: key, n: MaxReaders, slots: slots}
	return rw, nil
}

// Key returns the read-write lock's key.
func (rw *RWLock) Key() string { return rw.key }

// GateKey returns the key of the lock's gate.
func (rw *RWLock) GateKey() string { return rw.gate }

// IntentKey returns the key of the intent record that a writer waiting
// for the gate holds (see Design).
func (rw *RWLock) IntentKey() string { return rw.intent }

// SlotKey returns the key of reader slot i (0 ≤ i < MaxReaders).
func (rw *RWLock) SlotKey(i int) string { return rw.readers.slots[i] }

// rwTestHookEntered, if set, runs after a reader got the gate and before
// it takes a slot (tests pause a reader there).
var rwTestHookEntered func(gate *Lease)

// RLock takes a read grant, waiting while a writer holds or waits for the
// lock (see Design) (or while MaxReaders readers hold it), until it has one or ctx
// ends (or WithWait's bound passes: an error matching ErrNotAcquired). A
// wait that ends without a grant leaves nothing behind in the store. opts
// apply to the slot's lease as to Client.Acquire (WithMetadata's payload
// after the lock's header, see Holders), and WithTTL and WithLabel to the
// gate's lease too.
func (rw *RWLock) RLock(ctx context.Context, opts ...AcquireOption) (*RWGrant, error) {
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
func (rw *RWLock) TryRLock(ctx context.Context, opts ...AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, false, false, opts)
}

// Lock takes the write grant, waiting for the gate and then for every
// reader inside to leave, until it has it or ctx ends (or WithWait's
// bound passes: an error matching ErrNotAcquired). While it waits for
// readers it holds the gate, so no new reader enters. A wait that ends
// without the grant leaves nothing behind in the store. opts apply to
// every lease of the grant as to Client.Acquire (WithMetadata's payload
// to the gate's only).
func (rw *RWLock) Lock(ctx context.Context, opts ...AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, true, true, opts)
}

// TryLock makes one attempt at the write grant: it returns an error
// matching ErrNotAcquired at once when the gate or any reader slot is
// held. It leaves nothing behind when it fails.
func (rw *RWLock) TryLock(ctx context.Context, opts ...AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, true, false, opts)
}

func (rw *RWLock) lock(ctx context.Context, write, wait bool, opts []AcquireOption) (*RWGrant, error) {
	cfg, err := rw.c.resolveCall(opts)
	if err != nil {
		return nil, err
	}
	parent := ctx
	if wait && cfg.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, cfg.wait, errWaitBound)
		defer cancel()
	}
	bound, done, err := rw.c.begin(ctx) // Close ends the wait, and waits for its clean-up
	if err != nil {
		return nil, err
	}
	defer done()
	var run *storeRun // a waiting call's count of the store's failures
	if wait {
		run = newStoreRun(bound, cfg.ttl)
	}
	var g *RWGrant
	for {
		if write {
			g, err = rw.write(bound, parent, wait, opts)
		} else {
			g, err = rw.read(bound, parent, run, opts)
		}
		if !errors.Is(err, errGateLost) || !wait || bound.Err() != nil {
			break
		}
		// The gate was lost before the grant was complete: enter again.
	}
	if errors.Is(err, errGateLost) && bound.Err() != nil {
		err = rw.c.ended(bound, nil)
	}
	if err != nil && bound.Err() != nil && !definite(err) {
		err = rw.c.ended(bound, err)
	}
	if wait {
		err = waitBoundErr(parent, ctx, cfg.wait, closedErr(parent, bound, err))
	} else {
		err = closedErr(parent, bound, err)
	}
	return g, err
}

// errGateLost reports that a grant's gate lease (or a reader's slot
// lease) ended, by its holder's clock, before the grant was complete; the
// grant's leases were released, and a waiting call enters again.
var errGateLost = fmt.Errorf("%w: a lease of the read-write lock ended before the grant was complete", ErrNotAcquired)

// rwOpts returns opts followed by the lock's own: meta replaces the
// metadata with the header line (and the caller's payload, with
// payload), and the wait bound and, without keepHold, the minimum hold
// are dropped.
func rwOpts(opts []AcquireOption, header string, payload, keepHold bool) []AcquireOption {
	own := func(c *callConfig) {
		if payload {
			c.meta = append([]byte(rwHeader+header+"\n"), c.meta...)
		} else {
			c.meta = []byte(rwHeader + header + "\n")
		}
		c.wait, c.setWait = 0, false
		if !keepHold {
			c.minHold, c.setMinHold = 0, false
		}
	}
	return append(append([]AcquireOption(nil), opts...), own)
}

// enter takes the gate, waiting for it with wait.
func (rw *RWLock) enter(ctx context.Context, wait bool, opts []AcquireOption) (*Lease, error) {
	if wait {
		return rw.c.Acquire(ctx, rw.gate, opts...)
	}
	return rw.c.TryAcquire(ctx, rw.gate, opts...)
}

// valid reports whether l is held by its holder's clock: after its local
// validity has ended, the store may have given its key to another.
func valid(l *Lease) bool { return l.Remaining() > 0 }

// enterWrite takes the gate for a writer. A waiting writer that finds it
// held takes the intent first (waiting for other writers'), then waits
// for the gate, and gives the intent up once it has the gate or has
// given up.
func (rw *RWLock) enterWrite(ctx context.Context, wait bool, opts []AcquireOption) (*Lease, error) {
	gopts := rwOpts(opts, "write", true, true)
	if !wait {
		return rw.enter(ctx, wait, gopts)
	}
	gate, err := rw.c.TryAcquire(ctx, rw.gate, gopts...)
	if err == nil || definite(err) && !errors.Is(err, ErrNotAcquired) {
		return gate, err
	}
	intent, err := rw.c.Acquire(ctx, rw.intent, rwOpts(opts, "write intent", false, false)...)
	if err != nil {
		return nil, err
	}
	defer rw.c.releaseAll(ctx, intent)
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
func (rw *RWLock) enterRead(ctx context.Context, wait bool, opts []AcquireOption) (*Lease, error) {
	if wait {
		return rw.enter(ctx, wait, opts)
	}
	c := rw.c
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
		if err == nil || !errors.Is(err, ErrNotAcquired) {
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
				holder, since, backoff = owner, time.Now(), c.o.MinBackoff
			}
			d := min(jitter(backoff), stuckAfter(c.o.MaxBackoff, trip)-time.Since(since))
			if d <= 0 {
				return nil, err // the reader stays in the gate
			}
			if c.sleep(ctx, d) != nil {
				return nil, c.ended(ctx, err)
			}
			backoff = min(2*backoff, c.o.MaxBackoff)
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
	var info Info
	var he *HeldError
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
// of the store, polling with the client's backoff while one does. With
// run (a waiting call's), each Inspect is bounded by the call's TTL, and
// a failure is retried until ctx ends or run's window of the store's
// failures does (see storeRun). Without run it returns a *HeldError
// naming the intent's holder (matching ErrNotAcquired) instead of
// waiting, and a failure at once.
func (rw *RWLock) awaitNoWriter(ctx context.Context, run *storeRun) error {
	c := rw.c
	backoff := c.o.MinBackoff
	for {
		start := c.now()
		info, err := rw.inspectIntent(ctx, run)
		switch {
		case err == nil && info.Owner == "":
			if run != nil {
				run.answered()
			}
			return nil
		case err == nil && run == nil:
			return &HeldError{Holder: info}
		case err != nil && (run == nil || definite(err)):
			return err
		case err != nil && ctx.Err() != nil:
			return c.ended(ctx, err)
		}
		last, d := err, jitter(backoff)
		if err == nil {
			run.answered()
			last = &HeldError{Holder: info}
			if info.Remaining > 0 && info.Remaining < d {
				d = info.Remaining + time.Millisecond
			}
		} else if run.failed(start, err); run.over(c.now()) {
			return c.gaveUp(ctx, &run.failing)
		}
		if c.sleep(ctx, run.wait(c.now(), d)) != nil {
			return c.ended(ctx, last)
		}
		backoff = min(2*backoff, c.o.MaxBackoff)
	}
}

// inspectIntent looks at the intent: with run, one request bounded as run
// says.
func (rw *RWLock) inspectIntent(ctx context.Context, run *storeRun) (Info, error) {
	if run == nil {
		return rw.c.Inspect(ctx, rw.intent)
	}
	rctx, cancel := run.request(rw.c, ctx)
	info, err := rw.c.b.Inspect(rctx, rw.intent)
	err = cutShort(rctx, err)
	cancel()
	return info, rw.c.wrap(ctx, "inspect", err)
}

func (rw *RWLock) read(ctx, parent context.Context, run *storeRun, opts []AcquireOption) (*RWGrant, error) {
	wait := run != nil
	if err := rw.awaitNoWriter(ctx, run); err != nil {
		return nil, err
	}
	gate, err := rw.enterRead(ctx, wait, rwOpts(opts, "read gate", false, false))
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
	slotOpts := rwOpts(opts, "read token="+strconv.FormatUint(uint64(token), 10), true, true)
	s := rw.readers
	l, err := s.tryAll(rctx, slotOpts)
	if err != nil && wait && (!definite(err) || errors.Is(err, ErrNotAcquired)) && rctx.Err() == nil {
		if rw.c.polled() {
			l, err = s.poll(rctx, slotOpts, err, run)
		} else {
			l, err = s.race(rctx, slotOpts)
		}
	}
	if err != nil {
		// Whether the gate ended before this call lets it go: the
		// release below ends it too, and that is no loss.
		lost := !stop()
		rw.c.releaseAll(ctx, gate)
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
		rw.c.releaseAll(ctx, l, gate)
		return nil, errGateLost
	}
	rw.c.releaseAll(ctx, gate)
	// The slot may have been lost while the gate was released (its
	// renewal told "not held"): never hand out a grant already lost.
	if !valid(l) {
		rw.c.releaseAll(ctx, l)
		return nil, errGateLost
	}
	return newRWGrant(rw, parent, false, token, []*Lease{l}), nil
}

func (rw *RWLock) write(ctx, parent context.Context, wait bool, opts []AcquireOption) (*RWGrant, error) {
	gate, err := rw.enterWrite(ctx, wait, opts)
	if err != nil {
		return nil, err
	}
	token := gate.Token()
	// Waiting for the slots ends when the gate is lost.
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(gate.Context(), func() { cancel(errGateLost) })
	defer stop()
	slotOpts := rwOpts(opts, "write token="+strconv.FormatUint(uint64(token), 10)+" gate="+gate.Owner(), false, true)
	n := len(rw.readers.slots)
	leases := make([]*Lease, n)
	errs := make([]error, n)
	take := func(i int, key string) {
		if wait {
			leases[i], errs[i] = rw.c.Acquire(wctx, key, slotOpts...)
		} else {
			leases[i], errs[i] = rw.c.TryAcquire(wctx, key, slotOpts...)
		}
		if errs[i] != nil && definite(errs[i]) && !errors.Is(errs[i], ErrNotAcquired) {
			cancel(errs[i]) // a bad key, a closed client: no other wait can succeed
		}
	}
	if !rw.c.polled() {
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
	all := append([]*Lease{gate}, leases...)
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
		rw.c.releaseAll(ctx, all...)
		if lost && ctx.Err() == nil {
			return nil, errGateLost
		}
		return nil, first
	}
	return newRWGrant(rw, parent, true, token, all), nil
}

// releaseAll releases every non-nil lease of ls at once, with a fresh
// context bounded by Options.ReleaseTimeout; a failure is retried in the
// background by the engine, and the record expires with its TTL anyway.
// They are parts of a grant that was never handed out (a try refused, a
// wait that ended, a gate lost), or the gate a reader passed: their
// minimum hold does not apply, so that a refusal does not close the lock
// to everyone for the window.
func (c *Client) releaseAll(ctx context.Context, ls ...*Lease) {
	c.releaseLeases(ctx, false, ls)
}

// releaseLeases releases every non-nil lease of ls at once, as releaseAll
// does; with hold, each keeps its record until its minimum hold ends.
// Its requests are clean-up requests: they end with Close's budget too,
// so that Close leaves none of them running.
func (c *Client) releaseLeases(ctx context.Context, hold bool, ls []*Lease) {
	rctx, cancel := c.cleanupCtx(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, l := range ls {
		switch {
		case l == nil:
		case hold:
			wg.Go(func() { _ = l.Release(rctx) })
		default:
			wg.Go(func() { _ = l.releaseUnheld(rctx) })
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
	token  Token
	leases []*Lease // a reader's slot; a writer's gate, then its slots
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	state leaseState
	err   error
}

func newRWGrant(rw *RWLock, parent context.Context, write bool, token Token, ls []*Lease) *RWGrant {
	g := &RWGrant{rw: rw, write: write, token: token, leases: ls, state: held}
	g.ctx, g.cancel = context.WithCancelCause(context.WithoutCancel(parent))
	// The minimum hold is the grant's: it counts from now for every
	// lease, not from when each arrived (a writer's gate may have come
	// long before its last slot).
	now := rw.c.now()
	for _, l := range ls {
		l.restartHold(now)
	}
	for _, l := range ls {
		l.setOnEnd(g.partEnded)
	}
	return g
}

// partEnded ends the grant when one of its leases ended while it was held
// (lost, or released by Client.Close), and releases the others. It runs
// under that lease's lock, as the lease ends: the grant's Done is closed
// before the lease's own.
func (g *RWGrant) partEnded(cause error) {
	g.mu.Lock()
	if g.state != held {
		g.mu.Unlock()
		return
	}
	var lostErr *LostError
	if errors.As(cause, &lostErr) {
		g.state, g.err = lost, lostErr
	} else {
		g.state = released
	}
	g.mu.Unlock()
	g.cancel(cause)
	c := g.rw.c
	// The grant was handed out: its other leases keep their minimum hold.
	go c.goBackground(func() { c.releaseLeases(context.Background(), true, g.leases) }) // not under the lease's lock
}

// Key returns the read-write lock's key.
func (g *RWGrant) Key() string { return g.rw.key }

// Shared reports whether the grant is a read grant.
func (g *RWGrant) Shared() bool { return !g.write }

// Token returns the grant's fencing token: the gate's token under which
// it entered (for a writer, its gate lease's current token, which only
// rotation moves, upwards). A fenced resource checks it by the rule of
// RWFence.
func (g *RWGrant) Token() Token {
	if g.write {
		return g.leases[0].Token()
	}
	return g.token
}

// Lease returns the grant's principal lease: a reader's slot, a writer's
// gate. Its Owner identifies the grant.
func (g *RWGrant) Lease() *Lease { return g.leases[0] }

// Leases returns every lease the grant holds: a reader's slot; a writer's
// gate, then its MaxReaders slots.
func (g *RWGrant) Leases() []*Lease { return append([]*Lease(nil), g.leases...) }

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
		return fmt.Errorf("%w: %w", ErrNotHeld, err)
	case released:
		g.mu.Unlock()
		if errors.Is(context.Cause(g.ctx), ErrClosed) {
			return ErrClosed
		}
		return ErrNotHeld
	}
	g.state = released
	g.mu.Unlock()
	g.cancel(ErrReleased)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	release := func(ls []*Lease) {
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
	Info
	// Write reports a writer.
	Write bool
	// Grant is the grant's fencing token (RWGrant.Token): the gate token
	// it entered under.
	Grant Token
	// Slots is the number of reader slots the holder has: 1 for a reader,
	// MaxReaders for a writer that holds the lock (fewer while it waits
	// for readers to drain), 0 for a reader passing the gate.
	Slots int
}

// Holders lists every holder of the lock, across every client of the
// store, in the order of their grant tokens: readers, a writer (with its
// gate and slots as one holder), and a reader passing the gate. It is one
// List of the store (key + RWSeparator as prefix). Records whose metadata
// a holder replaced with Lease.SetMetadata are reported as readers with
// no grant token.
func (rw *RWLock) Holders(ctx context.Context) ([]RWHolder, error) {
	prefix := rw.key + RWSeparator
	infos, err := rw.c.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var hs []RWHolder
	writers := map[string]int{} // gate owner → index in hs
	writer := func(gateOwner string, info Info, token Token) *RWHolder {
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
			w := writer(gateOwner, info, Token(tok))
			w.Slots++
		default:
			hs = append(hs, RWHolder{Info: info, Grant: Token(tok), Slots: 1})
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
