// Package gocronlock makes scheduled jobs of github.com/go-co-op/gocron/v2
// run once per cluster, on fencelock: a Locker (gocron.Locker) that takes
// a lease for each run of a job, and an Elector (gocron.Elector) that lets
// only the holder of one election key run jobs.
//
// It is a module of its own (github.com/fencelock/fencelock/kit/gocron),
// so that gocron is a dependency of its users only.
//
// # Locker: a lease per run
//
// gocron calls Locker.Lock(ctx, jobName) before each run of a job and
// Unlock after the run returns; a run whose Lock fails is skipped (gocron
// counts it as skipped and calls the job's AfterLockError listener). Lock
// is one TryAcquire of Prefix + jobName: it never waits, so of the
// instances whose schedules fire for the same tick, the first takes the
// run and the others skip it.
//
// The lease is renewed while the job runs, so its TTL does not have to
// cover the job: the TTL is how long the key stays taken after the
// process running it died. What a fast job needs is MinHold: an instance
// whose clock or scheduler runs a little behind the others fires the same
// tick a little later, after the first run has already finished and
// unlocked, and would run it again. With MinHold the store keeps the key
// until MinHold after the run started, however quickly the job ends, so
// the late instances of that tick find it taken. MinHold must exceed the
// spread between the instances' firing times for one tick (clock skew
// plus scheduling delay) and stay below the job's interval, or the next
// tick finds the key still taken and is skipped cluster-wide. The default,
// one second, suits jobs that run at most once a second.
//
// gocron does not stop a run whose lease is lost mid-run (the store was
// unreachable for a TTL, or an operator force-released the key). A job
// that must stop then, or that writes to a resource with fencing tokens,
// gets its run's lease with Locker.Lease(jobName) and uses its Context
// and Token.
//
// # Elector: one leader runs every job
//
// An Elector campaigns for an election key in the background for as long
// as it is open (recipe.Elect, campaigning again after every lost term and
// after a store failure) and IsLeader returns nil only while this
// instance's current term's lease is valid: not ended, and with validity
// left by the Client's clock (Lease.Remaining), which is checked at the
// call, so a process resumed from a pause longer than its TTL does not run
// a job on a lease whose loss the engine has not processed yet. A run
// already started when the lease is lost is not stopped by gocron: take
// the term's lease with Elector.Lease for its Context and Token.
package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/recipe"
	"github.com/go-co-op/gocron/v2"
)

// DefaultPrefix is the default prefix of a Locker's keys.
const DefaultPrefix = "gocron/"

// DefaultMinHold is the default LockerOptions.MinHold.
const DefaultMinHold = time.Second

// LockerOptions configures a Locker. A nil *LockerOptions, and every zero
// field, means the documented default.
type LockerOptions struct {
	// Prefix is prepended to a job's name to make its key. Default
	// DefaultPrefix.
	Prefix string

	// TTL is the TTL of each run's lease (fencelock.WithTTL). Default: the
	// Client's Options.TTL.
	TTL time.Duration

	// MinHold is each run's minimum hold (fencelock.WithMinHold): see the
	// package documentation. Default DefaultMinHold; a negative value means
	// none.
	MinHold time.Duration

	// LockTimeout bounds each Lock call when gocron's context has no
	// deadline (gocron's never has). Default: the Client's Options.TTL.
	LockTimeout time.Duration
}

// Locker is a gocron.Locker on a fencelock Client. It is safe for
// concurrent use.
type Locker struct {
	c    *fencelock.Client
	o    LockerOptions
	opts []fencelock.AcquireOption

	mu   sync.Mutex
	runs map[string]*fencelock.Lease
}

var (
	_ gocron.Locker  = (*Locker)(nil)
	_ gocron.Elector = (*Elector)(nil)
)

// NewLocker returns a Locker that takes its leases from c. Pass it to
// gocron.WithDistributedLocker (every job) or
// gocron.WithDistributedJobLocker (one job).
func NewLocker(c *fencelock.Client, o *LockerOptions) *Locker {
	l := &Locker{c: c, runs: map[string]*fencelock.Lease{}}
	if o != nil {
		l.o = *o
	}
	if l.o.Prefix == "" {
		l.o.Prefix = DefaultPrefix
	}
	switch {
	case l.o.MinHold == 0:
		l.o.MinHold = DefaultMinHold
	case l.o.MinHold < 0:
		l.o.MinHold = 0
	}
	if l.o.LockTimeout <= 0 {
		l.o.LockTimeout = c.Options().TTL
	}
	if l.o.TTL > 0 {
		l.opts = append(l.opts, fencelock.WithTTL(l.o.TTL))
	}
	l.opts = append(l.opts, fencelock.WithMinHold(l.o.MinHold))
	return l
}

// Lock takes the run of job key: one TryAcquire of Prefix + key. It
// returns an error (matching fencelock.ErrNotAcquired when another
// instance holds the key) when the run is not this instance's to make;
// gocron then skips it.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.o.LockTimeout)
		defer cancel()
	}
	lease, err := l.c.TryAcquire(ctx, l.o.Prefix+key, l.opts...)
	if err != nil {
		return nil, fmt.Errorf("gocronlock: run of job %q not taken: %w", key, err)
	}
	l.mu.Lock()
	l.runs[key] = lease
	l.mu.Unlock()
	return &lock{l: l, key: key, lease: lease}, nil
}

// Lease returns the lease of the run of job key in progress in this
// instance, or nil if there is none: a job calls it to stop when the
// lease ends (Lease.Context) and to fence its writes (Lease.Token).
func (l *Locker) Lease(key string) *fencelock.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[key]
}

type lock struct {
	l     *Locker
	key   string
	lease *fencelock.Lease
}

// Unlock releases the run's lease (the store keeps the key until the
// minimum hold ends). It is bounded by the Client's
// Options.ReleaseTimeout.
func (k *lock) Unlock(ctx context.Context) error {
	k.l.mu.Lock()
	if k.l.runs[k.key] == k.lease {
		delete(k.l.runs, k.key)
	}
	k.l.mu.Unlock()
	err := k.lease.Release(ctx)
	if errors.Is(err, fencelock.ErrNotHeld) && k.lease.Err() == nil {
		// Released already (Client.Close): nothing to report.
		return nil
	}
	return err
}

// ErrNotLeader is matched (errors.Is) by IsLeader's error when this
// instance does not lead.
var ErrNotLeader = errors.New("gocronlock: not the leader")

// ElectorOptions configures an Elector. A nil *ElectorOptions, and every
// zero field, means the documented default.
type ElectorOptions struct {
	// Identity names this instance in the election (recipe.Elect's
	// identity; recipe.CurrentLeader reports it). Default: the Client's
	// Options.Owner.
	Identity string

	// Value is what this instance publishes while it leads (its address,
	// say). Default none.
	Value []byte

	// Acquire are the options of each term's Acquire (fencelock.WithTTL,
	// …).
	Acquire []fencelock.AcquireOption

	// OnStartedLeading, if set, is called with each term's lease as the
	// term starts, once IsLeader reports it (to Watch it with a health
	// probe, say). It must return quickly.
	OnStartedLeading func(l *fencelock.Lease)

	// OnStoppedLeading, if set, is called after each term ended, with
	// nil for a resignation or the *fencelock.LostError of a loss.
	OnStoppedLeading func(err error)

	// RetryDelay is how long the Elector waits before campaigning again
	// after recipe.Elect returned an error (the store failed for a whole
	// TTL, say). Default: the Client's Options.MaxBackoff.
	RetryDelay time.Duration
}

// Elector is a gocron.Elector on a fencelock election. It is safe for
// concurrent use.
type Elector struct {
	c      *fencelock.Client
	key    string
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	term    *fencelock.Lease // the current term's lease, nil between terms
	lastErr error            // why the last term or campaign ended
}

// NewElector starts campaigning for key in the background and returns
// the Elector; pass it to gocron.WithDistributedElector. Close it when
// the scheduler stops, to resign.
func NewElector(c *fencelock.Client, key string, o *ElectorOptions) (*Elector, error) {
	var opt ElectorOptions
	if o != nil {
		opt = *o
	}
	if opt.Identity == "" {
		opt.Identity = c.Options().Owner
	}
	if opt.RetryDelay <= 0 {
		opt.RetryDelay = c.Options().MaxBackoff
	}
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Elector{c: c, key: key, cancel: cancel, done: make(chan struct{})}
	go e.campaign(ctx, opt)
	return e, nil
}

func (e *Elector) campaign(ctx context.Context, o ElectorOptions) {
	defer close(e.done)
	eo := &recipe.ElectOptions{
		Acquire: o.Acquire,
		OnStoppedLeading: func(_ recipe.Leader, err error) {
			e.mu.Lock()
			e.lastErr = err
			e.mu.Unlock()
			if o.OnStoppedLeading != nil {
				o.OnStoppedLeading(err)
			}
		},
	}
	for {
		err := recipe.Elect(ctx, e.c, e.key, o.Identity, o.Value, func(ctx context.Context, l *fencelock.Lease) error {
			e.mu.Lock()
			e.term, e.lastErr = l, nil
			e.mu.Unlock()
			if o.OnStartedLeading != nil {
				o.OnStartedLeading(l)
			}
			<-ctx.Done()
			e.mu.Lock()
			e.term = nil
			e.mu.Unlock()
			return nil
		}, eo)
		if ctx.Err() != nil {
			return
		}
		e.mu.Lock()
		e.lastErr = err
		e.mu.Unlock()
		if errors.Is(err, fencelock.ErrClosed) {
			return
		}
		t := time.NewTimer(o.RetryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// IsLeader returns nil while this instance's current term's lease is
// valid (not ended, and with validity left by the Client's clock), and
// an error matching ErrNotLeader otherwise, saying why. It never calls
// the store.
func (e *Elector) IsLeader(context.Context) error {
	e.mu.Lock()
	l, last := e.term, e.lastErr
	e.mu.Unlock()
	if l != nil {
		select {
		case <-l.Done():
		default:
			if l.Remaining() > 0 {
				return nil
			}
			return fmt.Errorf("%w of %q: the term's lease has no validity left (renewals failed, or the process was paused)", ErrNotLeader, e.key)
		}
		if err := l.Err(); err != nil {
			last = err
		}
	}
	if last != nil {
		return fmt.Errorf("%w of %q: campaigning; the last term or campaign ended with: %w", ErrNotLeader, e.key, last)
	}
	return fmt.Errorf("%w of %q: campaigning", ErrNotLeader, e.key)
}

// Lease returns the current term's lease while this instance leads, or
// nil: a job calls it to stop when leadership ends (Lease.Context) and to
// fence its writes (Lease.Token).
func (e *Elector) Lease() *fencelock.Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.term
}

// Close resigns: it stops campaigning, releases the lease if this
// instance leads, and returns once done, within the Client's
// Options.ReleaseTimeout (plus a second), or with an error saying the
// release goes on in the background.
func (e *Elector) Close() error {
	e.cancel()
	bound := e.c.Options().ReleaseTimeout + time.Second
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-e.done:
		return nil
	case <-t.C:
		return fmt.Errorf("gocronlock: Elector.Close: resigning from %q did not finish within %v; the release goes on in the background and the lease expires with its TTL in any case", e.key, bound)
	}
}
