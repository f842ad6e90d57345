package recipe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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

// rwSlots is what a reader slot's key starts with, after the lock's
// records' prefix (see Keys).
const rwSlots = "r/"

// DefaultMaxReaders is the number of read grants an RWLock lets hold at
// once unless WithMaxReaders sets another: far more than a lock's readers
// usually are, so that in practice the store's capacity is the bound.
const DefaultMaxReaders = 1 << 16

// rwHeader starts the metadata of every record of a read-write lock; the
// holder's own WithMetadata payload follows the first newline.
const rwHeader = "fencelock-rwlock "

// RWOption configures an RWLock (NewRWLock).
type RWOption func(*rwConfig)

type rwConfig struct{ maxReaders int }

// WithMaxReaders bounds the number of read grants of the lock held at
// once, by this client's RLock calls: a reader that finds n read grants
// held waits (TryRLock refuses) until one leaves. Default
// DefaultMaxReaders; n must be at least 1. Clients of one key may use
// different bounds: each bounds its own readers' entry, and writers wait
// for every reader whatever bound it entered under.
func WithMaxReaders(n int) RWOption { return func(c *rwConfig) { c.maxReaders = n } }

// RWLock is a read-write lock on one key, for every client of the store:
// any number of readers at once (up to WithMaxReaders' bound, by default
// DefaultMaxReaders), or one writer; beside the readers, at most one
// upgradeable reader, which may become the writer without letting another
// writer in. Every grant is fenced. Create one with NewRWLock; its methods
// are safe for concurrent use.
//
// # Design
//
// Four kinds of record, each an ordinary Lease (see Keys): a gate that
// serialises entry, reader slots, a waiting writer's intent, and the
// upgrade record. A reader takes the gate, lists the reader slots held,
// takes the lowest free one, checks that its gate lease is still valid by
// its own clock, and releases the gate; its grant is the slot's lease. A
// writer takes the gate and keeps it; holding it, it lists the reader
// slots and waits until none is held (each reader inside leaves, or its
// lease ends). Its grant is the gate. A reader's slot was taken while it
// held the gate, before the writer took the gate, so the writer's List,
// made after its own acquire of the gate, sees it; and no reader enters
// while the writer holds the gate. So no reader holds a grant while a
// writer does, no two writers do, and a writer waiting for readers to
// drain holds the gate: readers that come after it queue behind it, and a
// stream of readers cannot starve it.
//
// Readers pass the gate too, briefly. Where every wait polls, readers
// passing the gate one after another can keep it busy at every poll of a
// waiting writer; where the store notifies, a woken writer still races
// the readers woken with it. So a writer that finds the gate held takes
// the intent first, and keeps it until it has the gate; every reader
// looks at the intent before it enters (one Inspect) and waits while a
// writer holds it. Only the readers that looked before the intent was
// taken can still pass the gate, so it falls free and the writer takes
// it. This holds whatever backend each client uses (a fleet halfway
// through a migration shares the records). Writers are preferred: a
// stream of writers can keep readers waiting.
//
// An upgradeable reader (UpgradeableRLock) takes the upgrade record
// before it enters as a reader, and keeps it with its slot. Every writer
// takes the upgrade record before the gate (and gives it up once it holds
// the gate), so while an upgradeable reader holds it no writer enters,
// and none holds the gate. RWGrant.Upgrade then takes the gate (with the
// intent, as a writer does), waits for every other reader to leave, and
// gives its slot up: the grant is now the gate and the upgrade record. No
// writer got in between its read and its write.
//
// # Fencing
//
// A grant's token (RWGrant.Token) is the gate's token under which it
// entered: for a reader, the gate token it held when it took its slot;
// for a writer (and an upgraded reader), its gate lease's current token
// (which only rotation moves, upwards). Gate tokens strictly increase,
// and a writer keeps the gate for its whole grant, so a writer's token is
// strictly greater than every grant's that entered before it, and every
// grant that enters after it carries a greater token still. A fenced
// resource therefore accepts a read whose token is at least the highest
// writer's token it has seen, and a write whose token is greater than
// every token it has seen (or equal to the highest, from the same
// writer): RWFence implements that rule, and docs/primitives.md states it
// for a database.
//
// # Implementation
//
// Generic: an RWLock only uses the Client's public API (Acquire,
// TryAcquire, Inspect, List and the recipe seam, Client.Begin), so it
// works on every backend; no backend has a native one yet. Its costs: a
// read looks at the intent, takes two leases, lists the readers and
// releases one lease (four round trips more than a lock, and a List that
// grows with the readers inside); a write takes and renews the gate, and
// lists the readers until none is left (waiting on one of them at a time
// with the engine's own waiting), and takes the upgrade record and, while
// it waits for the gate, the intent for a moment.
type RWLock struct {
	c          *fencelock.Client
	key        string
	gate       string
	intent     string // a writer's intent while it waits for the gate
	upgrade    string // the upgradeable reader's, or a writer's on its way to the gate
	slots      string // what every reader slot's key starts with
	maxReaders int
}

// NewRWLock returns the read-write lock on key, for c's store. It stores
// nothing. It returns an *fencelock.InvalidOptionError for a
// WithMaxReaders below 1, and an *fencelock.InvalidKeyError (matching
// fencelock.ErrInvalidKey) for a key that driver.ValidateKey refuses or
// whose longest record key would be longer than driver.MaxKeyLen. A
// backend with stricter key rules refuses a record's key when it is
// first used.
func NewRWLock(c *fencelock.Client, key string, opts ...RWOption) (*RWLock, error) {
	if err := needClient(c); err != nil {
		return nil, err
	}
	cfg := rwConfig{maxReaders: DefaultMaxReaders}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.maxReaders < 1 {
		return nil, badOption("MaxReaders", cfg.maxReaders, "must be at least 1")
	}
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	_, records := Keys(key, 0)
	rw := &RWLock{c: c, key: key, gate: records[0], intent: records[1], upgrade: records[2],
		slots: key + rwSeparator + rwSlots, maxReaders: cfg.maxReaders}
	longest := max(len(rw.gate), len(rw.slotKey(cfg.maxReaders-1)))
	if longest > driver.MaxKeyLen {
		return nil, &fencelock.InvalidKeyError{Key: key, Reason: fmt.Sprintf("its read-write lock's record keys are up to %d bytes, longer than %d (a read-write lock's key may be at most %d bytes with %d readers)",
			longest, driver.MaxKeyLen, driver.MaxKeyLen-longest+len(key), cfg.maxReaders)}
	}
	return rw, nil
}

// slotKey returns the key of reader slot i.
func (rw *RWLock) slotKey(i int) string { return rw.slots + strconv.Itoa(i) }

// slotIndex returns the number of the reader slot whose key is key: any
// number, so that a writer waits for readers that entered under a larger
// WithMaxReaders too.
func (rw *RWLock) slotIndex(key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, rw.slots)
	if !ok || rest == "" || len(rest) > 18 || len(rest) > 1 && rest[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0 && rest[0] != '+' && rest[0] != '-'
}

// Key returns the read-write lock's key.
func (rw *RWLock) Key() string { return rw.key }

// MaxReaders returns the lock's bound on read grants held at once (see
// WithMaxReaders).
func (rw *RWLock) MaxReaders() int { return rw.maxReaders }

// rwTestHookEntered, if set, runs after a reader got the gate and before
// it takes a slot (tests pause a reader there).
var rwTestHookEntered func(gate *fencelock.Lease)

// RLock takes a read grant, waiting while a writer holds or waits for the
// lock (see Design) (or while MaxReaders readers hold it), until it has
// one or ctx ends (or WithWait's bound passes: an error matching
// ErrNotAcquired). A wait that ends without a grant leaves nothing behind
// in the store. opts apply to the slot's lease as to Client.Acquire
// (WithMetadata's payload after the lock's header, see Holders), and
// WithTTL and WithLabel to the gate's lease too.
func (rw *RWLock) RLock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, rwRead, true, opts)
}

// TryRLock makes one attempt at a read grant: it returns an error
// matching ErrNotAcquired at once when a writer holds the gate (or waits
// for readers to drain), a writer waits for the gate (a *HeldError
// naming its intent), or MaxReaders readers hold the lock. Other readers
// do not make it fail: it tries the gate again while readers pass it,
// and gives up only when one reader stays in the gate for
// Options.MaxBackoff, or for as long as a few of the store's round trips
// if that is longer (its process paused or dead: it holds the gate until
// its lease ends), or after tryReadPasses other readers passed the gate
// before it. It leaves nothing behind when it fails.
func (rw *RWLock) TryRLock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, rwRead, false, opts)
}

// UpgradeableRLock takes an upgradeable read grant: a read grant that
// RWGrant.Upgrade can turn into the write grant without letting another
// writer in between. At most one upgradeable read grant of the lock is
// held at once, beside any number of ordinary readers; while it is held,
// writers wait. It waits as RLock does, and first for the upgradeable
// reader before it (and for a writer on its way to the gate). opts apply
// as to RLock, and to the upgrade record's lease too.
func (rw *RWLock) UpgradeableRLock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, rwUpgradeable, true, opts)
}

// TryUpgradeableRLock makes one attempt at an upgradeable read grant, as
// TryRLock does; it also returns an error matching ErrNotAcquired at once
// when another upgradeable reader holds the lock.
func (rw *RWLock) TryUpgradeableRLock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, rwUpgradeable, false, opts)
}

// Lock takes the write grant, waiting for an upgradeable reader to leave,
// for the gate, and then for every reader inside to leave, until it has
// it or ctx ends (or WithWait's bound passes: an error matching
// ErrNotAcquired). While it waits for readers it holds the gate, so no
// new reader enters. A wait that ends without the grant leaves nothing
// behind in the store. opts apply to the gate's lease as to
// Client.Acquire.
func (rw *RWLock) Lock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, rwWrite, true, opts)
}

// TryLock makes one attempt at the write grant: it returns an error
// matching ErrNotAcquired at once when the gate or the upgrade record is
// held, or any reader holds the lock. It leaves nothing behind when it
// fails.
func (rw *RWLock) TryLock(ctx context.Context, opts ...fencelock.AcquireOption) (*RWGrant, error) {
	return rw.lock(ctx, rwWrite, false, opts)
}

// rwKind is the kind of grant a call of an RWLock takes.
type rwKind int

const (
	rwRead rwKind = iota
	rwUpgradeable
	rwWrite
)

func (rw *RWLock) lock(ctx context.Context, kind rwKind, wait bool, opts []fencelock.AcquireOption) (*RWGrant, error) {
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
		if kind == rwWrite {
			g, err = rw.write(bound, ctx, k, wait)
		} else {
			g, err = rw.read(bound, ctx, k, run, kind == rwUpgradeable)
		}
		if errors.Is(err, errReadersFull) && wait && bound.Err() == nil {
			// Every reader slot this lock may use is held: wait for
			// one to leave, outside the gate.
			if perr := k.Pause(bound, err); perr != nil {
				err = perr
				break
			}
			continue
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
	if g != nil {
		g.opts = leaseOptions(k, k.Metadata(), true)
	}
	return g, k.End(err)
}

// errGateLost reports that a grant's gate lease (or a reader's slot
// lease) ended, by its holder's clock, before the grant was complete; the
// grant's leases were released, and a waiting call enters again.
var errGateLost = fmt.Errorf("%w: a lease of the read-write lock ended before the grant was complete", fencelock.ErrNotAcquired)

// errReadersFull reports that MaxReaders readers hold the lock.
var errReadersFull = fmt.Errorf("%w: every reader slot of the read-write lock is held (see WithMaxReaders)", fencelock.ErrNotAcquired)

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

// takeUpgrade takes the upgrade record for call k, waiting for it with
// wait: for an upgradeable reader (kept with its slot), or a writer on its
// way to the gate (released once it holds the gate).
func (rw *RWLock) takeUpgrade(ctx context.Context, k *fencelock.Call, wait, keep bool) (*fencelock.Lease, error) {
	opts := rwOpts(k, "upgrade", false, keep)
	if wait {
		return rw.c.Acquire(ctx, rw.upgrade, opts...)
	}
	return rw.c.TryAcquire(ctx, rw.upgrade, opts...)
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
// to pass grows with the store's round trips, so the
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

// readerPassTrips is how many of the try's own round trips a reader may
// take to pass the gate: its look at the intent, the gate, the List of
// the slots, a few tries at a slot (another reader's slot its List
// missed), the gate's release — and a margin, because the try measures
// refused attempts, which commit nothing, while the reader's grants and
// release each commit (a durable store syncs each to disk: on MariaDB a
// reader took longer than ten of the try's round trips under load).
const readerPassTrips = 50

// stuckAfter is how long a reader may stay in the gate before a TryRLock
// takes it for stuck: maxBackoff (Options.MaxBackoff), or the time a
// reader needs to pass the gate, at trip per round trip (the longest a
// request of the try took), if that is longer. A slow store makes a
// reader that makes progress take longer than MaxBackoff.
func stuckAfter(maxBackoff, trip time.Duration) time.Duration {
	return max(maxBackoff, readerPassTrips*trip)
}

// tryReadPasses is how many other readers a TryRLock lets pass the gate
// before it, at most, while it tries for the gate (see enterRead).
const tryReadPasses = 32

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

// listReaders lists the reader slots held, as one request of call k,
// without the slot key skip.
func (rw *RWLock) listReaders(k *fencelock.Call, skip string) ([]fencelock.Info, error) {
	rctx, cancel := k.Request()
	defer cancel()
	infos, err := rw.c.List(rctx, rw.slots)
	if err != nil {
		return nil, err
	}
	readers := infos[:0]
	for _, info := range infos {
		if _, ok := rw.slotIndex(info.Key); ok && info.Key != skip {
			readers = append(readers, info)
		}
	}
	return readers, nil
}

// takeSlot takes the lowest reader slot free, for a reader of call k that
// holds the gate: it lists the slots held, then tries the lowest free
// one, and the next if that was taken after all (a reader whose gate
// ended before it took its slot: it gives it back at once). It returns
// errReadersFull when MaxReaders slots are held.
func (rw *RWLock) takeSlot(ctx context.Context, k *fencelock.Call, opts []fencelock.AcquireOption) (*fencelock.Lease, error) {
	readers, err := rw.listReaders(k, "")
	if err != nil {
		return nil, err
	}
	taken := make(map[int]bool, len(readers))
	for _, info := range readers {
		i, _ := rw.slotIndex(info.Key)
		taken[i] = true
	}
	next := 0
	for range readerPassTrips - 5 {
		for taken[next] {
			next++
		}
		if next >= rw.maxReaders {
			return nil, errReadersFull
		}
		l, err := rw.c.TryAcquire(ctx, rw.slotKey(next), opts...)
		if err == nil || !errors.Is(err, fencelock.ErrNotAcquired) {
			return l, err
		}
		taken[next] = true
	}
	return nil, errReadersFull
}

// drain waits, for a writer (or an upgrading reader, whose own slot is
// skip) of call k that holds the gate, until no reader slot but skip is
// held: it lists the slots, and waits for one held to be free, with the
// engine's own waiting (an Acquire of that slot, released at once), until
// the list is empty. Without wait it returns a *HeldError naming a reader
// instead of waiting. ctx ends when the gate is lost.
func (rw *RWLock) drain(ctx context.Context, k *fencelock.Call, wait bool, skip string) error {
	opts := rwOpts(k, "drain", false, false)
	for {
		start := time.Now()
		readers, err := rw.listReaders(k, skip)
		switch {
		case err != nil && !wait:
			return err
		case err != nil:
			if oerr := k.Outcome(start, err); oerr != nil {
				return oerr
			}
			if perr := k.Pause(ctx, err); perr != nil {
				return perr
			}
			continue
		case len(readers) == 0:
			if wait {
				k.Outcome(start, nil)
			}
			return nil
		case !wait:
			return &fencelock.HeldError{Holder: readers[0]}
		}
		if h := rwTestHookDrain; h != nil {
			h(readers)
		}
		start = time.Now()
		l, err := rw.c.Acquire(ctx, readers[0].Key, opts...)
		if err == nil {
			releaseAll(ctx, l)
			continue
		}
		if ctx.Err() != nil {
			return err
		}
		if oerr := k.Outcome(start, err); oerr != nil {
			return oerr
		}
	}
}

// rwTestHookDrain, if set, runs before a writer waits for a reader it
// found holding a slot.
var rwTestHookDrain func(readers []fencelock.Info)

// read takes a read grant (an upgradeable one with upgradeable) for call
// k on ctx (k's context), whose values the grant carries from parent; run
// is k if it waits, else nil.
func (rw *RWLock) read(ctx, parent context.Context, k, run *fencelock.Call, upgradeable bool) (*RWGrant, error) {
	wait := run != nil
	var up *fencelock.Lease
	if upgradeable {
		var err error
		if up, err = rw.takeUpgrade(ctx, k, wait, true); err != nil {
			return nil, err
		}
	}
	g, err := rw.readIn(ctx, parent, k, run, up)
	if err != nil {
		releaseAll(ctx, up)
	}
	return g, err
}

func (rw *RWLock) readIn(ctx, parent context.Context, k, run *fencelock.Call, up *fencelock.Lease) (*RWGrant, error) {
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
	// Taking a slot ends when the gate (or the upgrade record) is lost.
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(gate.Context(), func() { cancel(errGateLost) })
	defer stop()
	header := "read token=" + strconv.FormatUint(uint64(token), 10)
	if up != nil {
		header += " upgradeable"
		defer context.AfterFunc(up.Context(), func() { cancel(errGateLost) })()
	}
	l, err := rw.takeSlot(rctx, k, rwOpts(k, header, true, true))
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
	if !valid(l) || up != nil && !valid(up) {
		releaseAll(ctx, l)
		return nil, errGateLost
	}
	ls := []*fencelock.Lease{l}
	if up != nil {
		ls = append(ls, up)
	}
	g := newRWGrant(rw, parent, false, token, ls)
	g.upgradeable = up != nil
	return g, nil
}

// write takes the write grant for call k on ctx (k's context), whose
// values the grant carries from parent.
func (rw *RWLock) write(ctx, parent context.Context, k *fencelock.Call, wait bool) (*RWGrant, error) {
	// The upgrade record first: an upgradeable reader keeps writers out
	// until it leaves, and an upgrade never waits for a writer's gate.
	up, err := rw.takeUpgrade(ctx, k, wait, false)
	if err != nil {
		return nil, err
	}
	gate, err := rw.enterWrite(ctx, k, wait)
	releaseAll(ctx, up) // holding the gate keeps every upgradeable reader out
	if err != nil {
		return nil, err
	}
	if err := rw.drained(ctx, k, wait, gate, ""); err != nil {
		return nil, err
	}
	return newRWGrant(rw, parent, true, gate.Token(), []*fencelock.Lease{gate}), nil
}

// drained waits, for call k holding gate, until every reader but the one
// holding the slot skip (an upgrading reader's own) has left; on failure
// it releases gate, and returns errGateLost if the gate ended first.
func (rw *RWLock) drained(ctx context.Context, k *fencelock.Call, wait bool, gate *fencelock.Lease, skip string) error {
	// Waiting for readers ends when the gate is lost.
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(gate.Context(), func() { cancel(errGateLost) })
	defer stop()
	err := rw.drain(wctx, k, wait, skip)
	if err == nil && !valid(gate) {
		err = errGateLost
	}
	if err != nil {
		// Whether the gate ended before this call lets it go: the
		// release below ends it too, and that is no loss.
		lost := !stop() || errors.Is(err, errGateLost)
		releaseAll(ctx, gate)
		if lost && ctx.Err() == nil {
			return errGateLost
		}
		return err
	}
	return nil
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

// RWGrant is a read or write grant of an RWLock: a reader's slot lease
// (and, for an upgradeable reader, the upgrade record's), or a writer's
// gate lease (and, for an upgraded reader, the upgrade record's), held
// together. The grant is lost when any of them is lost; its leases are
// then released at once. Its methods are safe for concurrent use.
type RWGrant struct {
	leaseGroup // the principal lease first
	rw         *RWLock
	opts       []fencelock.AcquireOption // the call's, for Upgrade

	// Under leaseGroup.mu:
	write       bool
	upgradeable bool
	token       fencelock.Token
}

func newRWGrant(rw *RWLock, parent context.Context, write bool, token fencelock.Token, ls []*fencelock.Lease) *RWGrant {
	g := &RWGrant{rw: rw, write: write, token: token}
	g.start(rw.c, parent, ls)
	return g
}

// Key returns the read-write lock's key.
func (g *RWGrant) Key() string { return g.rw.key }

// Shared reports whether the grant is a read grant (an upgradeable one
// until Upgrade returned nil).
func (g *RWGrant) Shared() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.write
}

// Upgradeable reports whether the grant is an upgradeable read grant
// (UpgradeableRLock), upgraded or not.
func (g *RWGrant) Upgradeable() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.upgradeable
}

// Token returns the grant's fencing token: the gate's token under which
// it entered (for a writer, and an upgraded reader, its gate lease's
// current token, which only rotation moves, upwards). A fenced resource
// checks it by the rule of RWFence.
func (g *RWGrant) Token() fencelock.Token {
	g.mu.Lock()
	write, gate, token := g.write, g.leases[0], g.token
	g.mu.Unlock()
	if write {
		return gate.Token() // not under g.mu: see leaseGroup
	}
	return token
}

// Lease returns the grant's principal lease: a reader's slot, a writer's
// gate. Its Owner identifies the grant (an upgraded grant's is its gate's,
// no longer its slot's).
func (g *RWGrant) Lease() *fencelock.Lease {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leases[0]
}

// Leases returns every lease the grant holds: the principal lease (see
// Lease), then the upgrade record's for an upgradeable reader.
func (g *RWGrant) Leases() []*fencelock.Lease { return g.leaseList() }

// Owner returns the owner string of the grant's principal lease.
func (g *RWGrant) Owner() string { return g.Lease().Owner() }

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
func (g *RWGrant) Err() error { return g.lostErr() }

// Remaining returns how long the grant stays valid by the holder's own
// clock if no further renewal succeeds: the least of its leases'. Zero
// once it has ended.
func (g *RWGrant) Remaining() time.Duration { return g.remaining() }

// Release ends the grant and releases every lease it holds. It returns
// an error matching ErrNotHeld if the grant was already released or lost
// (ErrClosed if Client.Close released it), or if the store no longer had
// one of its records; the errors of its leases' releases otherwise,
// joined. If ctx has already ended, Release still asks the store, as
// Lease.Release does.
func (g *RWGrant) Release(ctx context.Context) error { return g.release(ctx) }

// ErrNotUpgradeable is returned by RWGrant.Upgrade for a grant that was
// not taken with UpgradeableRLock or TryUpgradeableRLock.
var ErrNotUpgradeable = errors.New("recipe: the read grant is not upgradeable: take it with RWLock.UpgradeableRLock")

// Upgrade turns an upgradeable read grant into the write grant of its
// lock, without releasing it: it takes the gate (waiting for a reader
// passing it, and keeping readers that come later out, as Lock does),
// then waits for every other reader to leave, until it has the write
// grant or ctx ends (or the WithWait bound of the call that took the
// grant passes: an error matching ErrNotAcquired). No writer enters
// meanwhile: the grant holds the upgrade record, which every writer
// takes before the gate. On success the grant is a write grant
// (Shared reports false) whose token, its gate lease's, is above every
// earlier grant's, a writer's or a reader's; its slot is given up. On
// failure the grant stays the upgradeable read grant it was, and nothing
// else is left in the store. Upgrade of a write grant returns nil; of a
// grant that has ended, an error matching ErrNotHeld; of a plain read
// grant, ErrNotUpgradeable.
func (g *RWGrant) Upgrade(ctx context.Context) error { return g.upgrade(ctx, true) }

// TryUpgrade makes one attempt at Upgrade: it returns an error matching
// ErrNotAcquired at once when another reader holds the lock (or passes
// its gate).
func (g *RWGrant) TryUpgrade(ctx context.Context) error { return g.upgrade(ctx, false) }

func (g *RWGrant) upgrade(ctx context.Context, wait bool) (err error) {
	g.mu.Lock()
	switch {
	case g.state != held:
		err := g.notHeldErr()
		g.mu.Unlock()
		return err
	case g.write:
		g.mu.Unlock()
		return nil
	case !g.upgradeable:
		g.mu.Unlock()
		return ErrNotUpgradeable
	}
	slot, up := g.leases[0], g.leases[1]
	g.mu.Unlock()
	rw := g.rw
	begin := rw.c.BeginTry
	if wait {
		begin = rw.c.Begin
	}
	k, err := begin(ctx, g.opts...)
	if err != nil {
		return err
	}
	defer func() { err = k.End(err) }()
	// The upgrade ends when the grant does.
	uctx, cancel := context.WithCancelCause(k.Context())
	defer cancel(nil)
	defer context.AfterFunc(g.ctx, func() { cancel(context.Cause(g.ctx)) })()
	var gate *fencelock.Lease
	for {
		gate, err = rw.enterWrite(uctx, k, wait)
		if err == nil {
			err = rw.drained(uctx, k, wait, gate, slot.Key())
		}
		if !errors.Is(err, errGateLost) || !wait || uctx.Err() != nil {
			break
		}
	}
	if err != nil {
		if g.ctx.Err() != nil {
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.notHeldErr()
		}
		if errors.Is(err, errGateLost) && uctx.Err() != nil {
			err = uctx.Err()
		}
		return err
	}
	gate.RestartMinHold(rw.c.Options().Clock.Now())
	// The slot is no longer the grant's: its end does not end the grant.
	token := gate.Token() // not under g.mu: see leaseGroup
	if err := g.replaceLeases([]*fencelock.Lease{gate, up}, func() { g.write, g.token = true, token }); err != nil {
		releaseAll(ctx, gate)
		return err
	}
	releaseAll(ctx, slot)
	return nil
}

// RWHolder is one holder of a read-write lock, as the store sees it.
type RWHolder struct {
	// Info is the holder's principal record: a reader's slot, a writer's
	// gate. Info.Key and Info.Token are that record's key and store
	// token; Metadata is the holder's own WithMetadata payload (nil if
	// none), without the lock's header.
	fencelock.Info
	// Write reports a writer.
	Write bool
	// Grant is the grant's fencing token (RWGrant.Token): the gate token
	// it entered under.
	Grant fencelock.Token
	// Slots is the number of reader slots the holder has: 1 for a reader,
	// 0 for a writer and for a reader passing the gate.
	Slots int
	// Upgradeable reports an upgradeable reader (UpgradeableRLock).
	Upgradeable bool
}

// Holders lists every holder of the lock, across every client of the
// store, in the order of their grant tokens: readers (an upgradeable one
// marked), a writer (its gate), and a reader passing the gate. It is one
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
	for _, info := range infos {
		rest, ok := strings.CutPrefix(info.Key, prefix)
		if !ok {
			continue
		}
		header, payload := parseRWMeta(info.Metadata)
		info.Metadata = payload
		fields := strings.Fields(header)
		kind := ""
		if len(fields) > 0 {
			kind = fields[0]
		}
		switch {
		case rest == "gate":
			hs = append(hs, RWHolder{Info: info, Write: kind == "write", Grant: info.Token})
		case !strings.HasPrefix(rest, rwSlots) || kind == "drain":
			// The intent, the upgrade record, a writer waiting on a
			// slot, or not a record of this lock (a lock below its key).
		default:
			var tok uint64
			for _, f := range fields {
				if v, ok := strings.CutPrefix(f, "token="); ok {
					tok, _ = strconv.ParseUint(v, 10, 64)
				}
			}
			hs = append(hs, RWHolder{Info: info, Grant: fencelock.Token(tok), Slots: 1, Upgradeable: slices.Contains(fields, "upgradeable")})
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
