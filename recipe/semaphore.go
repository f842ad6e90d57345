package recipe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// MaxPermits is the largest number of permits a Semaphore may have. A
// waiting Semaphore.Acquire waits on every permit slot at once (one
// goroutine and one engine wait per slot), so the bound keeps a waiter's
// cost reasonable.
const MaxPermits = 256

// permitSeparator is what a Semaphore puts between its key and a permit
// slot's number (see Keys).
const permitSeparator = "/.permit/"

// permitHeader starts the metadata of every permit: it records the
// semaphore's number of permits, so that a caller with another number is
// refused. The holder's own WithMetadata payload follows the newline.
const permitHeader = "fencelock-semaphore permits="

// ErrPermitsMismatch is matched by the *PermitsMismatchError a Semaphore
// returns when a permit of its key is held by a caller that uses another
// number of permits.
var ErrPermitsMismatch = errors.New("recipe: semaphore permits mismatch")

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
	return fmt.Sprintf("recipe: semaphore %s used with %d permits, but %s is held by a caller using %d",
		strconv.Quote(e.Key), e.Permits, strconv.Quote(e.Slot), e.Held)
}

// Is reports whether target is ErrPermitsMismatch.
func (e *PermitsMismatchError) Is(target error) bool { return target == ErrPermitsMismatch }

// Semaphore is a counting semaphore of N permits on one key, for every
// client of the store: at most N leases are held at once. Each permit is
// an ordinary fencelock.Lease on a slot key (Lease.Key; see Keys), so it has its
// own fencing token, renewal, local validity, loss signal and crash
// release, exactly as a lock has. Create one with NewSemaphore; its
// methods are safe for concurrent use.
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
// Generic: a Semaphore only uses the Client's public API (Acquire,
// TryAcquire, List and the recipe seam, Client.Begin), so it works on
// every backend; no backend has a native one yet. A waiting Acquire waits
// on every slot at once with the engine's own waiting where the backend
// can queue or notify, and polls every slot with backoff (Call.Pause)
// where it can do neither; it is not FIFO across slots, even on queueing
// stores.
type Semaphore struct {
	c     *fencelock.Client
	key   string
	n     int
	slots []string
}

// NewSemaphore returns the semaphore of n permits (1 to MaxPermits) on
// key, for c's store. It stores nothing. It returns an
// *fencelock.InvalidOptionError for n out of range, and an
// *fencelock.InvalidKeyError (matching fencelock.ErrInvalidKey) for a key
// that driver.ValidateKey refuses or whose longest slot key would be
// longer than driver.MaxKeyLen. A backend with stricter key rules refuses
// a slot key when it is first used.
func NewSemaphore(c *fencelock.Client, key string, n int) (*Semaphore, error) {
	if err := needClient(c); err != nil {
		return nil, err
	}
	if n < 1 || n > MaxPermits {
		return nil, badOption("Permits", n, "must be between 1 and %d", MaxPermits)
	}
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	_, slots := Keys(key, n)
	s := &Semaphore{c: c, key: key, n: n, slots: slots}
	if last := s.slots[n-1]; len(last) > driver.MaxKeyLen {
		return nil, &fencelock.InvalidKeyError{Key: key, Reason: fmt.Sprintf("its permit slot key %d bytes, longer than %d (a semaphore's key may be at most %d bytes with %d permits)",
			len(last), driver.MaxKeyLen, driver.MaxKeyLen-len(last)+len(key), n)}
	}
	return s, nil
}

// badOption returns the *fencelock.InvalidOptionError of an option out
// of range.
func badOption(name string, v any, format string, args ...any) error {
	return &fencelock.InvalidOptionError{Option: name, Value: fmt.Sprint(v), Reason: fmt.Sprintf(format, args...)}
}

// Key returns the semaphore's key.
func (s *Semaphore) Key() string { return s.key }

// Permits returns the semaphore's number of permits.
func (s *Semaphore) Permits() int { return s.n }

// TryAcquire makes one attempt at each permit slot, in a random order,
// and returns the first permit it gets. When every slot is held it
// returns an error matching fencelock.ErrNotAcquired; when a holder uses
// another number of permits, a *PermitsMismatchError; when the permit's
// lease ended before the check of the holders after its grant did (a
// List slower than the lease's validity), an error matching
// fencelock.ErrLeaseLost. opts apply to the permit's lease as to
// Client.TryAcquire; WithMetadata's payload is stored after the
// semaphore's header (see Holders).
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...fencelock.AcquireOption) (*fencelock.Lease, error) {
	k, err := s.c.BeginTry(ctx, opts...)
	if err != nil {
		return nil, err
	}
	l, err := s.try(k.Context(), s.options(k))
	return l, k.End(err)
}

func (s *Semaphore) try(ctx context.Context, opts []fencelock.AcquireOption) (*fencelock.Lease, error) {
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
// Client.Close: ErrClosed) leaves nothing behind in the store. A holder
// that uses another number of permits makes Acquire return a
// *PermitsMismatchError (see Semaphore). A permit whose lease ended while
// the holders were checked after its grant (the store failing for longer
// than the lease's validity) is not returned: Acquire takes another.
// opts apply to the permit's lease as to Client.Acquire.
func (s *Semaphore) Acquire(ctx context.Context, opts ...fencelock.AcquireOption) (*fencelock.Lease, error) {
	k, err := s.c.Begin(ctx, opts...) // Close ends the wait, and waits for its clean-up
	if err != nil {
		return nil, err
	}
	l, err := s.acquire(k, s.options(k))
	return l, k.End(err)
}

func (s *Semaphore) acquire(k *fencelock.Call, opts []fencelock.AcquireOption) (*fencelock.Lease, error) {
	ctx := k.Context()
	if err := s.check(ctx, k); err != nil {
		return nil, err
	}
	for {
		start := time.Now()
		l, err := s.tryAll(ctx, opts)
		if err != nil {
			if err := k.Outcome(start, err); err != nil {
				return nil, err
			}
			if polled(s.c) {
				l, err = s.poll(ctx, k, opts, err)
			} else {
				l, err = s.race(ctx, opts)
			}
			if err != nil {
				return nil, err
			}
		}
		l, err = s.verify(ctx, l, k)
		if !errors.Is(err, errPermitEnded) {
			return l, err
		}
		// The permit ended while its check was retried through the
		// store's failures: take another, within the same call.
	}
}

// polled reports whether every wait on c's backend polls: it can neither
// queue waiters (driver.Waiter) nor notify them (driver.Watches).
func polled(c *fencelock.Client) bool {
	_, queues := c.Backend().(driver.Waiter)
	_, notifies := driver.Watches(c.Backend())
	return !queues && !notifies
}

// options returns the options of a permit's lease: call k's, with the
// permit header before the caller's metadata, and no per-lease wait
// bound (Acquire bounds the whole wait itself).
func (s *Semaphore) options(k *fencelock.Call) []fencelock.AcquireOption {
	header := permitHeader + strconv.Itoa(s.n) + "\n"
	return leaseOptions(k, append([]byte(header), k.Metadata()...), true)
}

// leaseOptions returns the options of a lease that a recipe's call k
// takes: k's TTL and label, meta as its metadata, k's minimum hold with
// hold (else none), and no wait bound.
func leaseOptions(k *fencelock.Call, meta []byte, hold bool) []fencelock.AcquireOption {
	minHold := time.Duration(0)
	if hold {
		minHold = k.MinHold()
	}
	return []fencelock.AcquireOption{fencelock.WithTTL(k.TTL()), fencelock.WithLabel(k.Label()),
		fencelock.WithMinHold(minHold), fencelock.WithMetadata(meta), fencelock.WithLockDelay(k.LockDelay())}
}

// tryAll tries every slot once, in a random order. It returns the first
// permit; else a definite error other than ErrNotAcquired, or ctx's
// error, at once; else the last transient failure if there was one (the
// slot's state is unknown); else an error matching ErrNotAcquired.
func (s *Semaphore) tryAll(ctx context.Context, opts []fencelock.AcquireOption) (*fencelock.Lease, error) {
	var transient error
	var held []error
	for _, i := range rand.Perm(s.n) {
		l, err := s.c.TryAcquire(ctx, s.slots[i], opts...)
		switch {
		case err == nil:
			return l, nil
		case errors.Is(err, fencelock.ErrNotAcquired):
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
	return nil, fmt.Errorf("%w: all %d permits of semaphore %s are held%w", fencelock.ErrNotAcquired, s.n, strconv.Quote(s.key), heldBy(held))
}

// definite reports whether err is an answer rather than a failure of the
// store: a refusal, a bad key or option, an unsupported call, a closed
// client.
func definite(err error) bool {
	return errors.Is(err, fencelock.ErrNotAcquired) || errors.Is(err, fencelock.ErrNotHeld) ||
		errors.Is(err, fencelock.ErrInvalidKey) || errors.Is(err, fencelock.ErrInvalidOption) ||
		errors.Is(err, fencelock.ErrUnsupported) || errors.Is(err, fencelock.ErrClosed)
}

// poll waits for a permit on a backend that can neither queue nor
// notify, on ctx (k's context, or one derived from it): tryAll again
// after call k's pause (Call.Pause: a capped,
// jittered backoff, never longer than until the first holder's record is
// due to expire), until k's window of the store's failures ends (see
// Call.Outcome). last is the first round's error, begun at the call's
// start. (Racing N polling Acquires there would cancel N−1 store requests
// in flight at every win; a store that applies a cancelled insert after
// the engine's clean-up has looked (FerretDB) keeps such a record until
// its TTL.)
func (s *Semaphore) poll(ctx context.Context, k *fencelock.Call, opts []fencelock.AcquireOption, last error) (*fencelock.Lease, error) {
	for {
		if err := k.Pause(ctx, last); err != nil {
			return nil, err
		}
		start := time.Now()
		l, err := s.tryAll(ctx, opts)
		if err == nil {
			return l, nil
		}
		if err := k.Outcome(start, err); err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err() // ended by the recipe (a read-write lock's gate lost)
		}
		last = err
	}
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
func (s *Semaphore) race(ctx context.Context, opts []fencelock.AcquireOption) (*fencelock.Lease, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		l   *fencelock.Lease
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
		won   *fencelock.Lease
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
// fresh context bounded by Options.ReleaseTimeout, and at once
// (Lease.ReleaseNow): the minimum hold belongs to the permit handed to
// the caller, and a permit nobody received must not keep its slot for
// the window.
func (s *Semaphore) release(ctx context.Context, l *fencelock.Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.Options().ReleaseTimeout)
	defer cancel()
	_ = l.ReleaseNow(rctx) // a failure is retried in the background by the engine
}

// errPermitEnded marks verify's error for a permit whose lease ended
// before its check did.
var errPermitEnded = errors.New("the permit's lease ended while the semaphore's holders were checked")

// verify checks, after l was granted, that no holder uses another number
// of permits; if one does, or the check fails, it releases l. k is as
// check's. A lease that ended meanwhile is never handed out: with k the
// check retries List through the store's failures, for longer than a
// lease's validity if the store is down long enough, and the permit's
// slot may have been granted again since (its token is then below the
// new holder's). verify returns an error matching errPermitEnded and
// the lease's cause (fencelock.ErrLeaseLost) then.
func (s *Semaphore) verify(ctx context.Context, l *fencelock.Lease, k *fencelock.Call) (*fencelock.Lease, error) {
	if err := s.check(ctx, k); err != nil {
		s.release(ctx, l)
		return nil, err
	}
	select {
	case <-l.Done():
		s.release(ctx, l)
		return nil, fmt.Errorf("recipe: semaphore %s: permit on %s (token %d): %w: %w", strconv.Quote(s.key), strconv.Quote(l.Key()), l.Token(), errPermitEnded, l.Err())
	default:
	}
	return l, nil
}

// check lists the semaphore's holders and returns a *PermitsMismatchError
// if one recorded another number of permits. With k (a waiting call),
// each List is one of k's requests (Call.Request), and a transient
// failure is retried after k's pause until ctx ends or k's window of the
// store's failures does (see Call.Outcome); without, the first failure is
// returned.
func (s *Semaphore) check(ctx context.Context, k *fencelock.Call) error {
	for {
		start := time.Now()
		hs, err := s.list(ctx, k)
		if err == nil {
			if k != nil {
				k.Outcome(start, nil)
			}
			for _, h := range hs {
				if h.Permits != 0 && h.Permits != s.n {
					return &PermitsMismatchError{Key: s.key, Permits: s.n, Held: h.Permits, Slot: h.Key}
				}
			}
			return nil
		}
		if k == nil {
			return err
		}
		if err := k.Outcome(start, err); err != nil {
			return err
		}
		if err := k.Pause(ctx, err); err != nil {
			return err
		}
	}
}

// list is Holders for check: with k, one request of k's.
func (s *Semaphore) list(ctx context.Context, k *fencelock.Call) ([]Permit, error) {
	if k == nil {
		return s.Holders(ctx)
	}
	rctx, cancel := k.Request()
	defer cancel()
	infos, err := s.c.List(rctx, s.key+permitSeparator)
	if err != nil {
		return nil, err
	}
	return s.permits(infos), nil
}

// Permit describes one held permit of a semaphore, as the store sees it.
type Permit struct {
	// Info is the slot's holder: Key is the slot key, Metadata the
	// holder's own WithMetadata payload (nil if none), without the
	// semaphore's header.
	fencelock.Info
	// Slot is the slot's number. It may be Permits() or more when the
	// holder uses a larger number of permits.
	Slot int
	// Permits is the number of permits the holder recorded; 0 if the
	// slot's metadata records none (a plain lock on the slot key, or a
	// permit whose holder replaced its metadata).
	Permits int
}

// Holders lists every held permit of the semaphore's key, across every
// client of the store, sorted by slot: one List of the store (the slot
// keys' common prefix, see Keys). It includes slots beyond Permits() held
// by callers that use more permits.
func (s *Semaphore) Holders(ctx context.Context) ([]Permit, error) {
	infos, err := s.c.List(ctx, s.key+permitSeparator)
	if err != nil {
		return nil, err
	}
	return s.permits(infos), nil
}

// permits turns a List of the semaphore's prefix into its permits, sorted
// by slot.
func (s *Semaphore) permits(infos []fencelock.Info) []Permit {
	prefix := s.key + permitSeparator
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
