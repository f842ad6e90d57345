package fencelock

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/driver"
)

const (
	// MinTTL and MaxTTL bound Options.TTL.
	MinTTL = driver.MinTTL
	MaxTTL = driver.MaxTTL

	// The guarantees Options.Require may name (documented in package
	// driver, where they are listed once; see docs/deploying.md).
	DurableTokens    = driver.DurableTokens
	Failover         = driver.Failover
	ServerClock      = driver.ServerClock
	PushedLoss       = driver.PushedLoss
	FIFO             = driver.FIFO
	FencedSemaphores = driver.FencedSemaphores
)

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Options configures a Client. A nil *Options, and every zero field, means
// the documented default.
type Options struct {
	// TTL is how long the store keeps a lease alive without renewal, and
	// the basis of the holder's local validity. Default 15s; range
	// MinTTL..MaxTTL.
	TTL time.Duration

	// RenewInterval is the time between renewals of a lease. Default TTL/3.
	// It must satisfy TTL ≥ 2 × RenewInterval, so that a renewal can fail
	// once and be retried before the lease runs out.
	RenewInterval time.Duration

	// Margin is subtracted from TTL to get the holder's local validity
	// (start + TTL − Margin, with start taken before the request is sent).
	// It absorbs clock-rate drift between holder and store. Default TTL/10;
	// must satisfy Margin ≤ TTL − 3/2 × RenewInterval, so that after a
	// renewal fails at least half a RenewInterval of validity is left to
	// retry it.
	Margin time.Duration

	// RotateEvery, if positive, makes renewals issue a new, higher fencing
	// token at least this often, so downstream services see a live
	// holder's token advance. Default 0 (never). Must satisfy
	// RenewInterval ≤ RotateEvery and TTL ≥ 2 × RotateEvery.
	RotateEvery time.Duration

	// MinBackoff and MaxBackoff bound the capped exponential backoff (with
	// jitter) between attempts while Acquire waits for a key held by
	// someone else, when the backend cannot notify waiters or as a safety
	// net when it can. Defaults 5ms and 1s; 0 < MinBackoff ≤ MaxBackoff.
	// The wait is also cut short when the holder's record is due to expire.
	MinBackoff time.Duration
	MaxBackoff time.Duration

	// Owner is the default owner label of this client's leases (see
	// WithLabel, which sets it per call): the store records
	// Owner + "/" + a unique suffix per call, and Info.Label and
	// Lease.Label return Owner as given. Default "HOSTNAME:PID". At most
	// 200 bytes of printable text.
	Owner string

	// MinHold is the default minimum hold of this client's leases (see
	// WithMinHold, which sets it per call): a lease released sooner keeps
	// its key in the store until MinHold after it was acquired. Default 0
	// (Release frees the key at once); at most MaxTTL.
	MinHold time.Duration

	// LockDelay is the default lock delay of this client's acquires (see
	// WithLockDelay, which sets it per call): a key whose last holder's
	// lease ended without a release (expiry, crash, loss) is not granted
	// until LockDelay after that end, by the store's clock. Default 0
	// (none); at most MaxTTL. URL parameter lock_delay=.
	LockDelay time.Duration

	// ReleaseTimeout bounds the clean-up calls that run on a fresh context:
	// releases during Close, removal of a record left by an abandoned
	// acquire, best-effort release of a lost lease, a Release whose
	// context has no deadline. It is also an Acquire or TryAcquire call's
	// overrun budget: once the call's context has ended (or Close has
	// begun), the acquire attempt in flight and the clean-up after it
	// share this one budget, so the call returns by its context's
	// deadline plus ReleaseTimeout; clean-up unfinished then goes on in
	// the background, and Close waits for it. And it is Close's budget:
	// Close returns within ReleaseTimeout plus a tenth of it (at most
	// 0.5s), whatever the store does. Default 5s.
	ReleaseTimeout time.Duration

	// OnDanger, if set, is called when a lease enters its danger zone: its
	// local validity has less than one RenewInterval left because renewals
	// have been failing. It runs on its own goroutine and should return
	// quickly. The lease is still held; if no renewal succeeds it will be
	// lost when remaining reaches zero.
	OnDanger func(l *Lease, remaining time.Duration)

	// Logger receives the engine's log records, one per Event (a lost
	// lease at Error, a failed renewal at Warn, routine events at Debug;
	// see EventKind.Level). Default: silent.
	Logger *slog.Logger

	// Observer, if set, receives every lifecycle Event (for metrics and
	// traces; see observe/prometheus and observe/otel). Default: none.
	Observer Observer

	// Clock is the engine's source of the current time. Default: the
	// system clock. The engine only ever uses differences between its
	// readings, so a clock offset from true time by a constant (a client
	// whose wall clock is wrong) changes nothing; that is the point of
	// injecting one in tests. It must run at the rate of real time:
	// timers are real (or, inside a testing/synctest bubble, fake)
	// durations. For deterministic timing tests use testing/synctest
	// rather than a manual clock.
	Clock interface{ Now() time.Time }

	// Require names the guarantees the deployment needs of its store
	// (DurableTokens, Failover, ServerClock, PushedLoss, FIFO,
	// FencedSemaphores; the URL parameter require= takes the same names,
	// comma-separated, and Open requires the union of both). New and Open
	// measure each one on the live server (driver.CheckGuarantees) and refuse a
	// store that does not meet them all with a *driver.UnmetGuaranteeError
	// (ErrGuaranteeUnmet) naming each unmet one, what was observed and the
	// setting that would meet it. Default: nothing required. See
	// docs/deploying.md.
	Require []Guarantee

	// NoCoalesce turns off the coalescing of concurrent acquire attempts
	// and releases on different keys into one round trip (one statement,
	// one pipeline) on a backend that can batch them (driver.BatchAcquirer,
	// driver.BatchReleaser: PostgreSQL, Redis, memory). Coalescing adds no
	// wait: a request that finds none in flight goes at once, alone; those
	// that arrive while one is in flight go together when it returns, each
	// with its own answer (docs/internals.md, "Coalescing"). Default false
	// (coalescing on). URL parameter coalesce=off.
	NoCoalesce bool
}

// Validate reports the first option that is out of range, as an
// *InvalidOptionError naming the bound it violates. Zero fields are checked
// with their defaults filled in.
func (o *Options) Validate() error {
	_, err := o.resolve()
	return err
}

func badOption(name string, v any, format string, args ...any) error {
	return &InvalidOptionError{Option: name, Value: fmt.Sprint(v), Reason: fmt.Sprintf(format, args...)}
}

// resolve returns a copy with defaults filled in, or the first violation.
func (o *Options) resolve() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.TTL == 0 {
		r.TTL = 15 * time.Second
	}
	if r.TTL < MinTTL || r.TTL > MaxTTL {
		return r, badOption("TTL", r.TTL, "must be between %v and %v", MinTTL, MaxTTL)
	}
	if r.RenewInterval == 0 {
		r.RenewInterval = r.TTL / 3
	}
	if r.RenewInterval < 0 || 2*r.RenewInterval > r.TTL {
		return r, badOption("RenewInterval", r.RenewInterval, "must be positive and satisfy TTL (%v) ≥ 2 × RenewInterval", r.TTL)
	}
	if r.Margin == 0 {
		r.Margin = r.TTL / 10
	}
	if r.Margin < 0 || r.Margin > r.TTL-r.RenewInterval-r.RenewInterval/2 {
		return r, badOption("Margin", r.Margin, "must be non-negative and at most TTL − 3/2 × RenewInterval (%v), to leave half an interval for retrying a failed renewal", r.TTL-r.RenewInterval-r.RenewInterval/2)
	}
	if r.RotateEvery < 0 || (r.RotateEvery > 0 && (r.RotateEvery < r.RenewInterval || 2*r.RotateEvery > r.TTL)) {
		return r, badOption("RotateEvery", r.RotateEvery, "must be 0 or satisfy RenewInterval (%v) ≤ RotateEvery and TTL (%v) ≥ 2 × RotateEvery", r.RenewInterval, r.TTL)
	}
	if r.MinBackoff == 0 {
		r.MinBackoff = 5 * time.Millisecond
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = max(time.Second, r.MinBackoff)
	}
	if r.MinBackoff < 0 || r.MaxBackoff < r.MinBackoff {
		return r, badOption("MaxBackoff", r.MaxBackoff, "must satisfy 0 < MinBackoff (%v) ≤ MaxBackoff", r.MinBackoff)
	}
	if r.Owner == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "localhost"
		}
		r.Owner = host + ":" + strconv.Itoa(os.Getpid())
	}
	if err := checkLabel("Owner", r.Owner); err != nil {
		return r, err
	}
	if r.MinHold < 0 || r.MinHold > MaxTTL {
		return r, badOption("MinHold", r.MinHold, "must be between 0 and %v", MaxTTL)
	}
	if r.LockDelay < 0 || r.LockDelay > MaxTTL {
		return r, badOption("LockDelay", r.LockDelay, "must be between 0 and %v", MaxTTL)
	}
	if r.ReleaseTimeout == 0 {
		r.ReleaseTimeout = 5 * time.Second
	}
	if r.ReleaseTimeout < 0 {
		return r, badOption("ReleaseTimeout", r.ReleaseTimeout, "must be positive")
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	if r.Clock == nil {
		r.Clock = systemClock{}
	}
	if err := checkRequire(r.Require); err != nil {
		return r, err
	}
	return r, nil
}
