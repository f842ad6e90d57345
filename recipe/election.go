package recipe

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// ErrNoLeader is returned by CurrentLeader when nobody holds the key.
var ErrNoLeader = errors.New("recipe: no leader")

// Leader is an election's leader as the store reports it. The Leader of a
// key that nobody holds has only Key set; Elected reports which it is.
type Leader struct {
	// Key is the election's key.
	Key string
	// Identity is the leader's identity exactly as its campaigner gave it
	// to Elect (stored as the lease's owner label, see WithLabel). A key
	// held by a plain Acquire reports that lease's label (Options.Owner
	// by default).
	Identity string
	// Value is what the leader published: Elect's value, or what it set
	// since with Lease.SetMetadata (etcd's Proclaim). Nil if none.
	Value []byte
	// Token is the leader's fencing token; zero if there is no leader.
	Token fencelock.Token
	// Owner is the store's owner string of the leader's lease (as
	// Lease.Owner, Inspect and List report it): unique per lease, so a
	// change of Owner is a new term even when Identity stays the same.
	Owner string
}

// Elected reports whether l describes a leader (false: nobody holds the
// key).
func (l Leader) Elected() bool { return l.Token != 0 }

func leaderOf(key string, info fencelock.Info) Leader {
	if !info.Locked() {
		return Leader{Key: key}
	}
	return Leader{Key: key, Identity: info.Label(), Value: info.Metadata, Token: info.Token, Owner: info.Owner}
}

// CurrentLeader returns key's current leader as c's store reports it (one
// Inspect of the key), or ErrNoLeader (with a Leader that has only Key
// set) when nobody holds the key.
func CurrentLeader(ctx context.Context, c *fencelock.Client, key string) (Leader, error) {
	if err := needClient(c); err != nil {
		return Leader{}, err
	}
	info, err := c.Inspect(ctx, key)
	if err != nil {
		return Leader{}, err
	}
	l := leaderOf(key, info)
	if !l.Elected() {
		return l, ErrNoLeader
	}
	return l, nil
}

// ElectOptions configures Elect. A nil *ElectOptions, and every zero
// field, means no hook and the Client's defaults.
type ElectOptions struct {
	// OnStartedLeading is called when this campaigner has become the
	// leader, before fn starts, on Elect's goroutine.
	OnStartedLeading func(l Leader)

	// OnStoppedLeading is called after a term ended: fn has returned and
	// the lease was released (err nil) or lost (err is the *LostError,
	// matching ErrLeaseLost), on Elect's goroutine. l.Value is the last
	// value the leader published.
	OnStoppedLeading func(l Leader, err error)

	// OnNewLeader is called each time the leader this campaigner observes
	// changes to another lease — another campaigner, this one, or the same
	// identity's next term — and when the key becomes free (a Leader with
	// only Key set; Elected is false). The first call reports the leader
	// found when Elect starts, if there is one. Calls come in order, one
	// at a time, from a goroutine of their own, so they may lag behind
	// OnStartedLeading and OnStoppedLeading. Elect observes the key as
	// Observe does, but without subscribing to the backend's notifications
	// (so it never takes a wake-up its own campaign waits for): a change is
	// seen within Options.MaxBackoff, or when the leader's record is due
	// to expire, whichever is sooner.
	OnNewLeader func(l Leader)

	// Acquire are the options of each term's Acquire (WithTTL, WithMinHold,
	// …). Elect adds WithLabel(identity) and WithMetadata(value) after
	// them, so those two have no effect here.
	Acquire []fencelock.AcquireOption
}

// Elect campaigns for leadership of key until ctx ends. identity names
// this campaigner; it is stored as the lease's owner label (WithLabel:
// 1 to 200 bytes of printable text) and Leader and Observe return it as
// given. value is what it publishes while it leads (at most
// driver.MaxMetadataLen bytes, stored as the lease's metadata), such as
// its address.
//
// Each term: Elect waits until it holds key (Acquire), calls fn with the
// lease and a context that is cancelled the moment the lease is lost or
// ctx ends, and when fn returns it releases the lease at once (Client.Do
// does the same for one term). fn publishes a new value with
// Lease.SetMetadata; the next term starts with the last value published.
// Then Elect campaigns again: after a loss, and after fn returned nil. So
// a leader that should lead until ctx ends blocks in fn until its context
// is done.
//
// Elect returns nil once ctx has ended: the campaigner resigned, and the
// lease, if it held one, was released (a release that failed is retried
// in the background, as after any term, and the record expires with its
// TTL in any case). What the store did meanwhile (a failure, a WithWait
// bound that passed) does not change that outcome. Otherwise it returns
// fn's error, if fn returned one (other than its context's) while it
// still led (the lease is released first); or an error that makes
// campaigning pointless: ErrClosed, ErrInvalidKey, an *InvalidOptionError
// for a bad identity, value or option, or the store's failure when an
// Acquire without a deadline gave up (see Client.Acquire). A term whose
// lease was lost does not end Elect, whatever fn returned: the loss is
// reported to OnStoppedLeading and Elect campaigns again.
//
// The lease's guarantees hold for fn's context: it is cancelled before
// any other campaigner can be granted the key, so the next leader's fn
// starts after this one's context was cancelled (Elect cannot make fn
// return; fn must stop acting on the resource when its context ends, and
// write with the lease's fencing token).
func Elect(ctx context.Context, c *fencelock.Client, key, identity string, value []byte, fn func(ctx context.Context, l *fencelock.Lease) error, opts *ElectOptions) error {
	if err := needClient(c); err != nil {
		return err
	}
	if fn == nil {
		return badOption("fn", "nil", "Elect needs the function to run while elected")
	}
	var o ElectOptions
	if opts != nil {
		o = *opts
	}
	if err := checkLabel("identity", identity); err != nil {
		return err
	}
	if err := driver.ValidateMetadata(value); err != nil {
		return err
	}
	value = bytes.Clone(value)
	if o.OnNewLeader != nil {
		octx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		ob := newObserver(c, key, false)
		if err := c.Go(func(closing context.Context) {
			defer close(done)
			ob.run(octx, closing, o.OnNewLeader)
		}); err != nil {
			close(done) // closing: the campaign's first Acquire says so
		}
		defer func() {
			stop()
			<-done
		}()
	}
	for {
		var (
			started bool
			fnErr   error
			term    Leader
		)
		err := c.Do(ctx, key, func(lctx context.Context, l *fencelock.Lease) error {
			started = true
			term = Leader{Key: key, Identity: identity, Value: value, Token: l.Token(), Owner: l.Owner()}
			if o.OnStartedLeading != nil {
				o.OnStartedLeading(term)
			}
			defer func() {
				// What the leader published last is what it
				// campaigns with next.
				value = l.Metadata()
				term.Value, term.Token = value, l.Token()
			}()
			// fn's context is a child of the lease's, so that a loss
			// cancels it synchronously, before the engine frees the
			// store's record for the next leader. (Do's lctx is
			// cancelled by a context.AfterFunc goroutine, which may
			// run after the next leader's callback has started.) The
			// end of ctx reaches it through lctx; Elect waits for fn
			// before releasing in that case anyway.
			fctx, cancel := context.WithCancelCause(l.Context())
			stop := context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) })
			defer func() {
				stop()
				cancel(nil)
			}()
			fnErr = fn(fctx, l)
			return fnErr
		}, append(o.Acquire[:len(o.Acquire):len(o.Acquire)], fencelock.WithLabel(identity), fencelock.WithMetadata(value))...)
		if !started {
			switch {
			case ctx.Err() != nil && !misuse(err):
				return nil // resigned while campaigning
			case errors.Is(err, fencelock.ErrNotAcquired):
				continue // a WithWait bound passed: campaign again
			}
			return err
		}
		lost := errors.Is(err, fencelock.ErrLeaseLost)
		if o.OnStoppedLeading != nil {
			var cause *fencelock.LostError
			if !lost || !errors.As(err, &cause) {
				o.OnStoppedLeading(term, nil)
			} else {
				o.OnStoppedLeading(term, cause)
			}
		}
		switch {
		case ctx.Err() != nil:
			if fnErr != nil && !lost && !errors.Is(fnErr, context.Canceled) && !errors.Is(fnErr, context.DeadlineExceeded) {
				return err // fn failed as it resigned
			}
			return nil // resigned
		case errors.Is(err, fencelock.ErrClosed):
			return fencelock.ErrClosed
		case lost:
			// Campaign again.
		case fnErr != nil:
			return err
		default:
			// fn returned nil: campaign again. A release that failed
			// is retried by the engine in the background, and the
			// record expires with its TTL in any case.
		}
	}
}

// checkLabel checks an owner label (the identity): 1 to 200 bytes of
// printable text, as fencelock.WithLabel requires.
func checkLabel(name, label string) error {
	if label == "" {
		return badOption(name, strconv.Quote(label), "must not be empty")
	}
	if len(label) > 200 {
		return badOption(name, strconv.Quote(label[:20]+"…"), "must be at most 200 bytes")
	}
	if !utf8.ValidString(label) {
		return badOption(name, strconv.Quote(label), "must be valid UTF-8")
	}
	for _, r := range label {
		if !unicode.IsPrint(r) {
			return badOption(name, strconv.Quote(label), "must be printable text")
		}
	}
	return nil
}

// misuse reports whether err is a caller's mistake that Elect reports
// even when its ctx has ended: a bad key or option.
func misuse(err error) bool {
	return errors.Is(err, fencelock.ErrInvalidKey) || errors.Is(err, fencelock.ErrInvalidOption) || errors.Is(err, fencelock.ErrUnsupported)
}

// Observe returns a channel that delivers key's leader each time it
// changes: first the leader found now (a Leader with only Key set if
// nobody holds the key), then every change Observe sees — a new leader, a
// new value it published (Lease.SetMetadata), a rotation of its token, and
// the key becoming free. The channel is closed when ctx ends or the Client
// is closed. Observe returns an error (and no channel) if the first read
// of the key fails, or ErrClosed if the Client is closing.
//
// What it delivers is a history the store went through, in order: the
// leaders' tokens increase, each Leader replaces the one before it, and a
// state the store has left (a stale read) is never delivered after a
// newer one. It is not necessarily every state: Observe reads the key
// (one Inspect) when it has reason to, and a leader that came and went
// between two reads is not seen, nor are states that passed while the
// receiver did not read the channel (it is unbuffered; Observe then
// delivers the state it reads next).
//
// When Observe reads: at once when the backend notifies that the key may
// have changed (driver.Watcher: PostgreSQL's LISTEN/NOTIFY on the
// release of a key someone waited for, Redis's pub/sub on release, inotify
// on every write of the file backend, the memory backend on release,
// etcd's and ZooKeeper's watches on every change of the key's queue and
// its holder); when the leader's record is due to expire
// by the store's report (Info.Remaining), so a crashed leader's end is
// seen as soon as the store has expired it; and otherwise at least every
// Options.MaxBackoff (default 1s) — the polling bound on backends without
// notifications (MongoDB), and for changes a backend does not notify (on
// PostgreSQL, Redis and memory: a new leader, a new value; etcd's and
// ZooKeeper's watches notify every change). After the key was seen free it
// reads sooner, from Options.MinBackoff doubling up to that bound, as a
// new leader usually follows at once. A failing store is read again with
// the same backoff; its failures are not delivered.
//
// On Redis a release wakes one subscriber per process, so an Observe
// sharing its Client with a waiting Acquire can take the wake-up that
// Acquire would have had (which then tries again at its own backoff); use
// a separate Client for observers where that delay matters.
func Observe(ctx context.Context, c *fencelock.Client, key string) (<-chan Leader, error) {
	if err := needClient(c); err != nil {
		return nil, err
	}
	ob := newObserver(c, key, true)
	// Subscribe before the first read, so that a change between the two
	// is not missed.
	ctx, stop := context.WithCancel(ctx)
	ob.subscribe(ctx)
	first, err := ob.readOnce(ctx)
	if err != nil {
		stop()
		return nil, err
	}
	ob.deliver(first)
	out := make(chan Leader)
	if err := c.Go(func(closing context.Context) {
		defer close(out)
		defer stop()
		send := func(l Leader) bool {
			select {
			case out <- l:
				return true
			case <-ctx.Done():
			case <-closing.Done():
			}
			return false
		}
		if send(first) {
			ob.run(ctx, closing, func(l Leader) { send(l) })
		}
	}); err != nil {
		stop()
		return nil, err
	}
	return out, nil
}

// observer reads a key's leader when it has reason to (see Observe) and
// decides which reads are changes to deliver.
type observer struct {
	c       *fencelock.Client
	o       fencelock.Options
	watcher driver.Watcher
	key     string
	watch   bool // subscribe to the backend's notifications
	// leases: report changes of lease only (Elect's OnNewLeader), not
	// new values or rotated tokens of the same lease.
	leases bool

	notify  <-chan struct{} // nil without a subscription
	resub   time.Time       // when to try subscribing again; zero: never
	cur     Leader          // the state last read
	curAt   time.Time       // when that read began
	curRem  time.Duration   // its Info.Remaining (0: unknown)
	failed  bool            // the last read failed
	last    Leader          // the state last delivered
	lastTok fencelock.Token // the highest leader token delivered
	sent    bool            // anything delivered yet
	backoff time.Duration   // the next wait while no leader is seen, or reads fail
}

func newObserver(c *fencelock.Client, key string, watch bool) *observer {
	w, ok := driver.Watches(c.Backend())
	o := c.Options()
	return &observer{c: c, o: o, watcher: w, key: key, watch: watch && ok, leases: !watch, backoff: o.MinBackoff}
}

// subscribe asks the backend for notifications about the key, if it can
// give them; they end with ctx. After a failure it tries again after
// Options.MaxBackoff.
func (o *observer) subscribe(ctx context.Context) {
	if !o.watch {
		return
	}
	o.notify, o.resub = nil, time.Time{}
	ch, err := o.watcher.Watch(ctx, o.key)
	if errors.Is(err, fencelock.ErrUnsupported) {
		o.watch = false // configured without notifications: poll
		return
	}
	if err != nil {
		o.resub = time.Now().Add(o.o.MaxBackoff)
		return
	}
	o.notify = ch
}

// readOnce reads the key's leader once and records it as the current
// state.
func (o *observer) readOnce(ctx context.Context) (Leader, error) {
	start := time.Now()
	// Each read is bounded as Client.Inspect's is (Options.TTL), so that
	// a store that stops answering cannot hold Observe's first read, or
	// its watch loop, without end.
	info, err := o.c.Inspect(ctx, o.key)
	if err != nil {
		o.failed = true
		return Leader{}, err
	}
	cur := leaderOf(o.key, info)
	o.cur, o.curAt, o.curRem, o.failed = cur, start, info.Remaining, false
	if cur.Elected() {
		o.backoff = o.o.MinBackoff
	}
	return cur, nil
}

// change reports whether the state read, cur, is a change to deliver
// after the last one delivered. A leader whose token is below one already
// delivered, or a lease already reported gone, is a stale read: never
// delivered.
func (o *observer) change(cur Leader) bool {
	if !o.sent {
		return cur.Elected() || !o.leases
	}
	if !cur.Elected() {
		return o.last.Elected()
	}
	if cur.Owner != o.last.Owner {
		return cur.Token > o.lastTok
	}
	// The same lease as the last delivered: a new value, or a rotated
	// token; never an older token (a read that raced the lease's
	// rotation and saw the state before it).
	return !o.leases && cur.Token >= o.lastTok && (cur.Token > o.lastTok || !bytes.Equal(cur.Value, o.last.Value))
}

// deliver records l as delivered.
func (o *observer) deliver(l Leader) {
	o.last, o.sent = l, true
	if l.Elected() {
		o.lastTok = max(o.lastTok, l.Token)
	}
}

// wait returns how long to wait before the next read.
func (o *observer) wait(now time.Time) time.Duration {
	bound := o.o.MaxBackoff
	if o.failed || !o.cur.Elected() {
		d := jitter(o.backoff)
		o.backoff = min(2*o.backoff, bound)
		return d
	}
	d := bound
	if o.curRem > 0 {
		// Just after the record is due to expire unless renewed.
		due := o.curAt.Add(o.curRem + 2*time.Millisecond).Sub(now)
		d = min(d, max(due, o.o.MinBackoff))
	}
	return d
}

// run reads the key until ctx ends or the client begins to close, and
// calls emit with each change. The observer of Observe has delivered its
// first state already; Elect's reads at once.
func (o *observer) run(ctx, closing context.Context, emit func(Leader)) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		if o.sent {
			if o.watch && o.notify == nil && !o.resub.IsZero() && !time.Now().Before(o.resub) {
				o.subscribe(ctx)
			}
			timer.Reset(o.wait(time.Now()))
			select {
			case <-ctx.Done():
				return
			case <-closing.Done():
				return
			case _, ok := <-o.notify:
				if !ok {
					// The subscription ended (the backend lost its
					// notification connection): poll, and subscribe
					// again later.
					o.notify, o.resub = nil, time.Now().Add(o.o.MaxBackoff)
				}
			case <-timer.C:
			}
			timer.Stop()
		}
		cur, err := o.readOnce(ctx)
		if err != nil {
			if ctx.Err() != nil || closing.Err() != nil || (definite(err) && !errors.Is(err, fencelock.ErrNotAcquired)) {
				return // over, or a key or client that cannot be read
			}
			if !o.sent {
				o.sent = true // Elect's observer: wait before the next read
			}
			continue // unknown: read again with backoff, deliver nothing
		}
		if !o.change(cur) {
			o.sent = true
			continue
		}
		o.deliver(cur)
		emit(cur)
	}
}
