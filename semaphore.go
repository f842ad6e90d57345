package fencelock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// MaxPermits is the largest number of permits a Semaphore may have. A
// waiting Semaphore.Acquire waits on every permit slot at once (one
// goroutine and one engine wait per slot), so the bound keeps a waiter's
// cost reasonable.
const MaxPermits = 256

// PermitSeparator is what a Semaphore puts between its key and a permit
// slot's number: the slot keys of Semaphore(key, n) are
// key + PermitSeparator + "0" … key + PermitSeparator + strconv.Itoa(n-1).
// Keys that contain it are reserved for semaphores: a plain lock on such a
// key occupies the semaphore's slot.
const PermitSeparator = "/.permit/"

// permitHeader starts the metadata of every permit: it records the
// semaphore's number of permits, so that a caller with another number is
// refused. The holder's own WithMetadata payload follows the newline.
const permitHeader = "fencelock-semaphore permits="

// ErrPermitsMismatch is matched by the *PermitsMismatchError a Semaphore
// returns when a permit of its key is held by a caller that uses another
// number of permits.
var ErrPermitsMismatch = errors.New("fencelock: semaphore permits mismatch")

// PermitsMismatchError reports that a permit of a semaphore's key is held
// under another number of permits. It matches ErrPermitsMismatch.
type PermitsMismatchError struct {
	// Key is the semaphore's key.
	Key string
	// Permits is the caller's number of permits.
	Permits int
	// Held is the number of permits the holder of Slot recorded.
	Held int
	// Slot is the slot key whose holder recorded Held.
	Slot string
}

// Error implements error.
func (e *PermitsMismatchError) Error() string {
	return fmt.Sprintf("fencelock: semaphore %s used with %d permits, but %s is held by a caller using %d",
		strconv.Quote(e.Key), e.Permits, strconv.Quote(e.Slot), e.Held)
}

// Is reports whether target is ErrPermitsMismatch.
func (e *PermitsMismatchError) Is(target error) bool { return target == ErrPermitsMismatch }

// Semaphore is a counting semaphore of N permits on one key, for every
// client of the store: at most N leases are held at once. Each permit is
// an ordinary Lease on a slot key (see PermitSeparator), so it has its own
// fencing token, renewal, local validity, loss signal and crash release,
// exactly as a lock has. Create one with Client.Semaphore; its methods are
// safe for concurrent use.
//
// # Fencing
//
// A permit's token is its slot's token: it strictly increases per slot key
// (across the holders of that slot), not across the semaphore. A fenced
// resource checks a permit's write by the rule of docs/fencing.md with the
// slot key (Lease.Key, not the semaphore's key) as the fence's key: it
// accepts a token greater than or equal to the highest it has seen for
// that slot key. A paused holder whose slot was taken over is then
// refused, while the other N−1 holders are not affected.
//
// # Number of permits
//
// Every permit records N in its metadata. Acquire and TryAcquire list
// the semaphore's holders before and after taking a permit and refuse
// (a *PermitsMismatchError, having released the permit) when a holder
// recorded another N. Two callers with different N can therefore both
// hold permits only between one's grant and its check (one List round
// trip); after that at least one of them is refused (possibly both). On
// stores whose List is not linearizable the window is as wide as List's
// staleness. A permit whose metadata a holder replaced with
// Lease.SetMetadata no longer records N and is not checked.
//
// # Implementation
//
// Generic: a Semaphore only uses the Client's Acquire, TryAcquire and
// List, so it works on every backend; no backend has a native one yet.
// A waiting Acquire waits on every slot at once with the engine's own
// waiting where the backend can queue or notify, and polls every slot
// with backoff where it can do neither; it is not FIFO across slots, even
// on queueing stores.
type Semaphore struct {
	c     *Client
	key   string
	n     int
	slots []string
}

// Semaphore returns the semaphore of n permits (1 to MaxPermits) on key.
// It stores nothing. It returns an *InvalidOptionError for n out of
// range, and an *InvalidKeyError (matching ErrInvalidKey) for a key that
// driver.ValidateKey refuses or whose longest slot key would be longer
// than driver.MaxKeyLen. A backend with stricter key rules refuses a slot
// key when it is first used.
func (c *Client) Semaphore(key string, n int) (*Semaphore, error) {
	if n < 1 || n > MaxPermits {
		return nil, badOption("Permits", n, "must be between 1 and %d", MaxPermits)
	}
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	s := &Semaphore{c: c, key: key, n: n, slots: make([]string, n)}
	for i := range s.slots {
		s.slots[i] = key + PermitSeparator + strconv.Itoa(i)
	}
	if last := s.slots[n-1]; len(last) > driver.MaxKeyLen {
		return nil, &InvalidKeyError{Key: key, Reason: fmt.Sprintf("its permit slot key %d bytes, longer than %d (a semaphore's key may be at most %d bytes with %d permits)",
			len(last), driver.MaxKeyLen, driver.MaxKeyLen-len(last)+len(key), n)}
	}
	return s, nil
}

// Key returns the semaphore's key.
func (s *Semaphore) Key() string { return s.key }

// Permits returns the semaphore's number of permits.
func (s *Semaphore) Permits() int { return s.n }

// SlotKey returns the key of permit slot i (0 ≤ i < Permits()): the key
// of the Lease holding that permit, and the key a fenced resource checks
// the permit's token against.
func (s *Semaphore) SlotKey(i int) string { return s.slots[i] }

// TryAcquire makes one attempt at each permit slot, in a random order,
// and returns the first permit it gets. When every slot is held it
// returns an error matching ErrNotAcquired; when a holder uses another
// number of permits, a *PermitsMismatchError. opts apply to the permit's
// lease as to Client.TryAcquire; WithMetadata's payload is stored after
// the semaphore's header (see Holders).
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...AcquireOption) (*Lease, error) {
	if _, err := s.c.resolveCall(opts); err != nil {
		return nil, err
	}
	opts = s.options(opts)
	if err := s.check(ctx, nil); err != nil {
		return nil, err
	}
	l, err := s.tryAll(ctx, opts)
	if err != nil {
		return nil, err
	}
	return s.verify(ctx, l, nil)
}

// Acquire takes a permit, waiting while all N are held, until it has one
// or ctx ends (or WithWait's bound passes: an error matching
// ErrNotAcquired). It first tries every slot once in a random order.
// Then, on a backend that can queue or notify, it waits on every slot at
// once, as Client.Acquire waits for a key, and keeps the first permit it
// gets: the waits on the other slots are cancelled, and a permit one of
// them got meanwhile is released before Acquire returns. On a backend that
// can do neither it tries every slot again after a capped, jittered
// backoff, never later than the soonest holder's record is due to
// expire. A wait that ends without a permit (ctx, WithWait, or
// Client.Close: ErrClosed) leaves nothing behind in the store. A holder that uses another number of permits makes
// Acquire return a *PermitsMismatchError (see Semaphore). opts apply to
// the permit's lease as to Client.Acquire.
func (s *Semaphore) Acquire(ctx context.Context, opts ...AcquireOption) (*Lease, error) {
	cfg, err := s.c.resolveCall(opts)
	if err != nil {
		return nil, err
	}
	parent := ctx
	if cfg.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, cfg.wait, errWaitBound)
		defer cancel()
	}
	opts = s.options(opts)
	bound, done, err := s.c.begin(ctx) // Close ends the wait, and waits for its clean-up
	if err != nil {
		return nil, err
	}
	defer done()
	l, err := s.acquire(bound, opts, newStoreRun(bound, cfg.ttl))
	return l, waitBoundErr(parent, ctx, cfg.wait, closedErr(parent, bound, err))
}

// storeRun counts the store's failures for a recipe's waiting call, as
// Client.Acquire counts them (see failing), for the requests the recipe
// makes and retries itself (a semaphore's List, a read-write lock's look
// at the intent, a round of tries): without a deadline on the call's
// context, it gives up once the store has failed for the call's TTL
// without an answer; with one, it retries until the deadline. Each such
// request is bounded by the call's TTL.
type storeRun struct {
	failing
	ttl time.Duration // the call's TTL
}

// newStoreRun returns the count of a waiting call on ctx whose TTL is ttl.
func newStoreRun(ctx context.Context, ttl time.Duration) *storeRun {
	r := &storeRun{ttl: ttl}
	if _, ok := ctx.Deadline(); !ok {
		r.limit = ttl
	}
	return r
}

// request returns the context of one request of the call: ctx bounded by
// the call's TTL and the end of the failure window.
func (r *storeRun) request(c *Client, ctx context.Context) (context.Context, context.CancelFunc) {
	return c.requestCtx(ctx, r.ttl, r.until())
}

func (s *Semaphore) acquire(ctx context.Context, opts []AcquireOption, run *storeRun) (*Lease, error) {
	if err := s.check(ctx, run); err != nil {
		return nil, err
	}
	l, err := s.tryAll(ctx, opts)
	if err != nil {
		if definite(err) && !errors.Is(err, ErrNotAcquired) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, s.c.ended(ctx, err)
		}
		if s.c.polled() {
			l, err = s.poll(ctx, opts, err, run)
		} else {
			l, err = s.race(ctx, opts)
		}
		if err != nil {
			return nil, err
		}
	}
	return s.verify(ctx, l, run)
}

// options returns opts followed by the semaphore's own: the permit header
// before the caller's metadata, and no per-lease wait bound (Acquire
// bounds the whole wait itself).
func (s *Semaphore) options(opts []AcquireOption) []AcquireOption {
	header := permitHeader + strconv.Itoa(s.n) + "\n"
	own := func(c *callConfig) {
		c.meta = append([]byte(header), c.meta...)
		c.wait, c.setWait = 0, false
	}
	return append(append([]AcquireOption(nil), opts...), own)
}

// tryAll tries every slot once, in a random order. It returns the first
// permit; else a definite error other than ErrNotAcquired, or ctx's
// error, at once; else the last transient failure if there was one (the
// slot's state is unknown); else an error matching ErrNotAcquired.
func (s *Semaphore) tryAll(ctx context.Context, opts []AcquireOption) (*Lease, error) {
	var transient error
	var held []error
	for _, i := range rand.Perm(s.n) {
		l, err := s.c.TryAcquire(ctx, s.slots[i], opts...)
		switch {
		case err == nil:
			return l, nil
		case errors.Is(err, ErrNotAcquired):
			held = append(held, err)
		case definite(err) || ctx.Err() != nil:
			return nil, err
		default:
			transient = err
		}
	}
	if transient != nil {
		return nil, transient
	}
	return nil, fmt.Errorf("%w: all %d permits of semaphore %s are held%w", ErrNotAcquired, s.n, strconv.Quote(s.key), heldBy(held))
}

// poll waits for a permit on a backend that can neither queue nor
// notify: tryAll again after a capped, jittered backoff, never longer than
// until the first holder's record is due to expire, until run's window of
// the store's failures ends (see storeRun). last is the first round's
// error, begun at the call's start. (Racing N polling
// Acquires there would cancel N−1 store requests in flight at every win;
// a store that applies a cancelled insert after the engine's clean-up has
// looked (FerretDB) keeps such a record until its TTL.)
func (s *Semaphore) poll(ctx context.Context, opts []AcquireOption, last error, run *storeRun) (*Lease, error) {
	if !definite(last) {
		run.failed(s.c.now(), last)
	}
	backoff := s.c.o.MinBackoff
	for {
		wait := jitter(backoff)
		if d := soonestExpiry(last); d > 0 && d < wait {
			wait = d + time.Millisecond
		}
		if err := s.c.sleep(ctx, run.wait(s.c.now(), wait)); err != nil {
			return nil, s.c.ended(ctx, last)
		}
		backoff = min(2*backoff, s.c.o.MaxBackoff)
		start := s.c.now()
		l, err := s.tryAll(ctx, opts)
		switch {
		case err == nil:
			return l, nil
		case definite(err) && !errors.Is(err, ErrNotAcquired):
			return nil, err
		case ctx.Err() != nil:
			return nil, s.c.ended(ctx, err)
		case errors.Is(err, ErrNotAcquired):
			run.answered()
		default:
			if run.failed(start, err); run.over(s.c.now()) {
				return nil, s.c.gaveUp(ctx, &run.failing)
			}
		}
		last = err
	}
}

// soonestExpiry returns the shortest Remaining among the holders that
// the *HeldErrors wrapped in err name (0 if none is known).
func soonestExpiry(err error) time.Duration {
	var soonest time.Duration
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *HeldError:
			if r := e.Holder.Remaining; r > 0 && (soonest == 0 || r < soonest) {
				soonest = r
			}
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := e.Unwrap(); e != nil {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return soonest
}

// heldBy carries the slots' *HeldErrors (for the time to their expiry)
// in an error whose text is empty.
func heldBy(errs []error) error { return silent{errors.Join(errs...)} }

// silent wraps an error without adding to the message.
type silent struct{ err error }

func (silent) Error() string   { return "" }
func (e silent) Unwrap() error { return e.err }

// race waits on every slot at once, with a shared cancellation, and
// returns the first permit. It returns only when every wait has ended;
// permits that losing waits got are released first.
func (s *Semaphore) race(ctx context.Context, opts []AcquireOption) (*Lease, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		l   *Lease
		err error
	}
	results := make(chan result, s.n)
	for _, i := range rand.Perm(s.n) {
		go func() {
			l, err := s.c.Acquire(rctx, s.slots[i], opts...)
			results <- result{l, err}
		}()
	}
	var (
		won   *Lease
		first error // the first failure that is not our own cancellation
	)
	for range s.n {
		r := <-results
		switch {
		case r.err == nil && won == nil:
			won = r.l
			cancel()
		case r.err == nil:
			s.release(ctx, r.l)
		case won != nil:
			// Cancelled by us; the engine left nothing behind.
		case first == nil:
			first = r.err
			if definite(r.err) {
				cancel() // a bad key, a closed client: no wait can succeed
			}
		}
	}
	if won != nil {
		return won, nil
	}
	return nil, first
}

// release releases a permit that Acquire does not hand out (a losing
// wait's, or one refused by the check of the number of permits), with a
// fresh context bounded by Options.ReleaseTimeout, and at once: the
// minimum hold belongs to the permit handed to the caller, and a permit
// nobody received must not keep its slot for the window.
func (s *Semaphore) release(ctx context.Context, l *Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.o.ReleaseTimeout)
	defer cancel()
	_ = l.releaseUnheld(rctx) // a failure is retried in the background by the engine
}

// releaseUnheld releases a lease that a recipe took as part of a grant
// and never handed out (a Semaphore's permit refused or not kept, an
// RWLock's slots and gate of a grant that failed): at once, whatever its
// minimum hold (WithMinHold, Options.MinHold), which applies only to what
// the caller received.
func (l *Lease) releaseUnheld(ctx context.Context) error {
	l.mu.Lock()
	l.unheld = true
	l.mu.Unlock()
	return l.Release(ctx)
}

// verify checks, after l was granted, that no holder uses another number
// of permits; if one does, or the check fails, it releases l. run is as
// check's.
func (s *Semaphore) verify(ctx context.Context, l *Lease, run *storeRun) (*Lease, error) {
	if err := s.check(ctx, run); err != nil {
		s.release(ctx, l)
		return nil, err
	}
	return l, nil
}

// check lists the semaphore's holders and returns a *PermitsMismatchError
// if one recorded another number of permits. With run (a waiting call's),
// each List is bounded by the call's TTL, and a transient failure is
// retried with backoff until ctx ends or run's window of the store's
// failures does (see storeRun); without, the first failure is returned.
func (s *Semaphore) check(ctx context.Context, run *storeRun) error {
	backoff := s.c.o.MinBackoff
	for {
		start := s.c.now()
		hs, err := s.list(ctx, run)
		if err == nil {
			if run != nil {
				run.answered()
			}
			for _, h := range hs {
				if h.Permits != 0 && h.Permits != s.n {
					return &PermitsMismatchError{Key: s.key, Permits: s.n, Held: h.Permits, Slot: h.Key}
				}
			}
			return nil
		}
		if run == nil || definite(err) || ctx.Err() != nil {
			if ctx.Err() != nil {
				return s.c.ended(ctx, err)
			}
			return err
		}
		if run.failed(start, err); run.over(s.c.now()) {
			return s.c.gaveUp(ctx, &run.failing)
		}
		if serr := s.c.sleep(ctx, run.wait(s.c.now(), jitter(backoff))); serr != nil {
			return s.c.ended(ctx, err)
		}
		backoff = min(2*backoff, s.c.o.MaxBackoff)
	}
}

// list is Holders for check: with run, one request bounded as run says.
func (s *Semaphore) list(ctx context.Context, run *storeRun) ([]Permit, error) {
	if run == nil {
		return s.Holders(ctx)
	}
	rctx, cancel := run.request(s.c, ctx)
	infos, err := s.c.b.List(rctx, s.key+PermitSeparator)
	err = cutShort(rctx, err)
	cancel()
	if err != nil {
		return nil, s.c.wrap(ctx, "list", err)
	}
	return s.permits(infos), nil
}

// Permit describes one held permit of a semaphore, as the store sees it.
type Permit struct {
	// Info is the slot's holder: Key is the slot key, Metadata the
	// holder's own WithMetadata payload (nil if none), without the
	// semaphore's header.
	Info
	// Slot is the slot's number. It may be Permits() or more when the
	// holder uses a larger number of permits.
	Slot int
	// Permits is the number of permits the holder recorded; 0 if the
	// slot's metadata records none (a plain lock on the slot key, or a
	// permit whose holder replaced its metadata).
	Permits int
}

// Holders lists every held permit of the semaphore's key, across every
// client of the store, sorted by slot: one List of the store (key +
// PermitSeparator as prefix). It includes slots beyond Permits() held by
// callers that use more permits.
func (s *Semaphore) Holders(ctx context.Context) ([]Permit, error) {
	infos, err := s.c.List(ctx, s.key+PermitSeparator)
	if err != nil {
		return nil, err
	}
	return s.permits(infos), nil
}

// permits turns a List of the semaphore's prefix into its permits, sorted
// by slot.
func (s *Semaphore) permits(infos []Info) []Permit {
	prefix := s.key + PermitSeparator
	var ps []Permit
	for _, info := range infos {
		rest, ok := strings.CutPrefix(info.Key, prefix)
		slot, isSlot := slotNumber(rest)
		if !ok || !isSlot {
			continue // another semaphore's slot, below this one's key
		}
		p := Permit{Info: info, Slot: slot}
		p.Permits, p.Info.Metadata = parsePermitMeta(info.Metadata)
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].Slot < ps[j].Slot })
	return ps
}

// slotNumber parses a slot's number: decimal digits without a leading
// zero (except "0"), as Semaphore writes them.
func slotNumber(s string) (int, bool) {
	if s == "" || len(s) > 4 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// parsePermitMeta splits a permit's metadata into the number of permits
// its header records (0 without a header) and the holder's own payload.
func parsePermitMeta(md []byte) (int, []byte) {
	rest, ok := strings.CutPrefix(string(md), permitHeader)
	if !ok {
		return 0, md
	}
	num, payload, ok := strings.Cut(rest, "\n")
	n, err := strconv.Atoi(num)
	if !ok || err != nil || n < 1 {
		return 0, md
	}
	if payload == "" {
		return n, nil
	}
	return n, []byte(payload)
}
