package memory

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// ErrUnreachable is returned by every call of a Backend cut off from its
// store with SetUnreachable. The engine treats it as a transient failure.
var ErrUnreachable = errors.New("memory: store unreachable")

// Store is an in-process lock store shared by any number of Backends.
type Store struct {
	mu       sync.Mutex
	locks    map[string]*record
	counters map[string]driver.Token
	floor    driver.Token // RaiseFloor(""): every key's tokens stay above it
	watchers map[string]map[chan struct{}]struct{}
	losses   map[string]map[*lossWatch]struct{}
}

type record struct {
	owner   string
	token   driver.Token
	expires time.Time
	meta    []byte // a private copy: callers may reuse their slices
}

type lossWatch struct {
	owner string
	token driver.Token
	done  atomic.Bool // set once lost has been started or stop called
	fn    func(error)
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		locks:    make(map[string]*record),
		counters: make(map[string]driver.Token),
		watchers: make(map[string]map[chan struct{}]struct{}),
		losses:   make(map[string]map[*lossWatch]struct{}),
	}
}

var (
	namedMu sync.Mutex
	named   = map[string]*Store{}
)

// Named returns the process-wide store with the given name, creating it on
// first use. The URL mem://NAME opens a backend on Named(NAME).
func Named(name string) *Store {
	namedMu.Lock()
	defer namedMu.Unlock()
	s, ok := named[name]
	if !ok {
		s = NewStore()
		named[name] = s
	}
	return s
}

// New returns a Backend on a new, private Store: the common case, one
// client per store. NewStore is for several Backends (clients) on one
// store; Named is for a store reached by URL.
func New() *Backend { return NewStore().Backend() }

// Backend returns a new connection to the store. Closing it does not affect
// the store or its other Backends.
func (s *Store) Backend() *Backend { return &Backend{s: s} }

// Expire makes key's current record expire now, as if its holder had
// stopped renewing a full TTL ago. The holder is not told: like a real
// record store, it finds out when its next renewal is refused. Waiters are
// woken. It reports whether a live record was expired.
func (s *Store) Expire(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.live(key, time.Now())
	if !ok {
		return false
	}
	r.expires = time.Now()
	s.wakeLocked(key)
	return true
}

// TokenOf returns the highest token the store has issued for key.
func (s *Store) TokenOf(key string) driver.Token {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counters[key]
}

// nextLocked issues key's next token: above its counter and the global
// floor. Called with s.mu held.
func (s *Store) nextLocked(key string) driver.Token {
	tok := max(s.counters[key], s.floor) + 1
	s.counters[key] = tok
	return tok
}

// live returns key's record if it exists and has not expired. Called with
// s.mu held.
func (s *Store) live(key string, now time.Time) (*record, bool) {
	r, ok := s.locks[key]
	if !ok {
		return nil, false
	}
	if !now.Before(r.expires) {
		return r, false
	}
	return r, true
}

func (s *Store) wakeLocked(key string) {
	for ch := range s.watchers[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// lostLocked calls the loss watchers of key's grant (owner, token).
func (s *Store) lostLocked(key, owner string, token driver.Token) {
	for w := range s.losses[key] {
		if w.owner == owner && w.token == token {
			delete(s.losses[key], w)
			if w.done.CompareAndSwap(false, true) {
				go w.fn(driver.ErrNotHeld)
			}
		}
	}
}

// clone copies a metadata payload; nil and empty both become nil.
func clone(md []byte) []byte {
	if len(md) == 0 {
		return nil
	}
	return append([]byte(nil), md...)
}

func (s *Store) info(key string, r *record, now time.Time) driver.Info {
	return driver.Info{Key: key, Owner: r.owner, Token: r.token, Remaining: r.expires.Sub(now), Metadata: clone(r.meta)}
}

// Backend is one connection to a Store. It implements driver.Backend and
// every optional capability: Watcher, BatchRenewer, LossNotifier,
// ForceReleaser and Describer.
type Backend struct {
	s           *Store
	closed      atomic.Bool
	unreachable atomic.Bool
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.Watcher       = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.BatchAcquirer = (*Backend)(nil)
	_ driver.BatchReleaser = (*Backend)(nil)
	_ driver.LossNotifier  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
	_ driver.TokenFloorer  = (*Backend)(nil)
)

// Store returns the store this backend is connected to.
func (b *Backend) Store() *Store { return b.s }

// SetUnreachable cuts this backend off from its store (true) or reconnects
// it (false). While cut off every call with valid input fails with ErrUnreachable, so a test
// can watch a lease run out of local validity. Input is validated first:
// a bad key gets its typed error even while the backend is cut off.
func (b *Backend) SetUnreachable(v bool) { b.unreachable.Store(v) }

func (b *Backend) check(ctx context.Context) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.unreachable.Load() {
		return ErrUnreachable
	}
	return nil
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acquireLocked(req, time.Now())
}

// AcquireBatch implements driver.BatchAcquirer: every request in order,
// under one lock of the store.
func (b *Backend) AcquireBatch(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	out := make([]driver.AcquireResult, len(reqs))
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i, req := range reqs {
		if out[i].Err = driver.CheckAcquire(req); out[i].Err == nil {
			out[i].Grant, out[i].Err = s.acquireLocked(req, now)
		}
	}
	return out, nil
}

func (s *Store) acquireLocked(req driver.AcquireRequest, now time.Time) (driver.Grant, error) {
	if r, ok := s.live(req.Key, now); ok {
		if r.owner != req.Owner {
			return driver.Grant{}, &driver.HeldError{Holder: s.info(req.Key, r, now)}
		}
		r.expires = now.Add(req.TTL)
		r.meta = clone(req.Metadata)
		return driver.Grant{Key: req.Key, Owner: r.owner, Token: r.token}, nil
	} else if r != nil && req.LockDelay > 0 && now.Before(r.expires.Add(req.LockDelay)) {
		// An expired record is an unreleased end (Release and
		// ForceRelease delete theirs): the key stays refused for the
		// lock delay after it, by the store's clock.
		return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Token: r.token}, LockDelay: r.expires.Add(req.LockDelay).Sub(now)}
	}
	tok := s.nextLocked(req.Key)
	s.locks[req.Key] = &record{owner: req.Owner, token: tok, expires: now.Add(req.TTL), meta: clone(req.Metadata)}
	return driver.Grant{Key: req.Key, Owner: req.Owner, Token: tok}, nil
}

// Renew implements driver.Backend.
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewLocked(g, req, time.Now())
}

func (s *Store) renewLocked(g driver.Grant, req driver.RenewRequest, now time.Time) (driver.Grant, error) {
	r, ok := s.live(g.Key, now)
	if !ok || r.owner != g.Owner || r.token != g.Token {
		return driver.Grant{}, driver.ErrNotHeld
	}
	r.expires = now.Add(req.TTL)
	if req.SetMetadata {
		r.meta = clone(req.Metadata)
	}
	if req.Rotate {
		tok := s.nextLocked(g.Key)
		// Loss watchers follow the grant to its new token.
		for w := range s.losses[g.Key] {
			if w.owner == g.Owner && w.token == r.token {
				w.token = tok
			}
		}
		r.token = tok
	}
	g.Token = r.token
	return g, nil
}

// RenewBatch implements driver.BatchRenewer.
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	out := make([]driver.RenewResult, len(grants))
	for i, g := range grants {
		out[i].Grant, out[i].Err = s.renewLocked(g, req, now)
	}
	return out, nil
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releaseLocked(g, time.Now())
}

// ReleaseBatch implements driver.BatchReleaser: every grant in order,
// under one lock of the store.
func (b *Backend) ReleaseBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	errs := make([]error, len(grants))
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i, g := range grants {
		errs[i] = s.releaseLocked(g, now)
	}
	return errs, nil
}

func (s *Store) releaseLocked(g driver.Grant, now time.Time) error {
	r, ok := s.live(g.Key, now)
	if !ok || r.owner != g.Owner || r.token != g.Token {
		return driver.ErrNotHeld
	}
	delete(s.locks, g.Key)
	s.wakeLocked(g.Key)
	return nil
}

// ForceRelease implements driver.ForceReleaser: it removes key's record
// whoever holds it, tells the holder at once, and wakes waiters.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	r, ok := s.live(key, now)
	if !ok {
		return driver.Info{Key: key}, nil
	}
	info := s.info(key, r, now)
	delete(s.locks, key)
	s.lostLocked(key, r.owner, r.token)
	s.wakeLocked(key)
	return info, nil
}

// Inspect implements driver.Backend.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if r, ok := s.live(key, now); ok {
		return s.info(key, r, now), nil
	}
	return driver.Info{Key: key}, nil
}

// List implements driver.Backend. Keys come back sorted.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []driver.Info
	for k := range s.locks {
		if r, ok := s.live(k, now); ok && strings.HasPrefix(k, prefix) {
			out = append(out, s.info(k, r, now))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Watch implements driver.Watcher: the channel receives a value when key is
// released, force-released or expired with Store.Expire.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	ch := make(chan struct{}, 1)
	s := b.s
	s.mu.Lock()
	if s.watchers[key] == nil {
		s.watchers[key] = make(map[chan struct{}]struct{})
	}
	s.watchers[key][ch] = struct{}{}
	s.mu.Unlock()
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		delete(s.watchers[key], ch)
		if len(s.watchers[key]) == 0 {
			delete(s.watchers, key)
		}
		s.mu.Unlock()
		close(ch)
	})
	return ch, nil
}

// NotifyLoss implements driver.LossNotifier: lost is called when the grant
// is force-released. (Expiry is not pushed: the holder's next renewal finds
// it, as with a real record store.)
func (b *Backend) NotifyLoss(g driver.Grant, lost func(error)) (stop func()) {
	s := b.s
	w := &lossWatch{owner: g.Owner, token: g.Token, fn: lost}
	s.mu.Lock()
	if s.losses[g.Key] == nil {
		s.losses[g.Key] = make(map[*lossWatch]struct{})
	}
	s.losses[g.Key][w] = struct{}{}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.losses[g.Key], w)
		if len(s.losses[g.Key]) == 0 {
			delete(s.losses, g.Key)
		}
		s.mu.Unlock()
		w.done.Store(true) // after stop, lost is never started
	}
}

// HighWater implements driver.TokenFloorer. The store never forgets a
// counter, so Keys is complete and Global is its largest mark (or the
// global floor, if higher).
func (b *Backend) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if err := driver.ValidatePrefix(prefix); err != nil {
		return driver.HighWater{}, err
	}
	if err := b.check(ctx); err != nil {
		return driver.HighWater{}, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	hw := driver.HighWater{Keys: make(map[string]driver.Token), Global: s.floor}
	for k, t := range s.counters {
		hw.Global = max(hw.Global, t)
		if strings.HasPrefix(k, prefix) {
			hw.Keys[k] = t
		}
	}
	return hw, nil
}

// RaiseFloor implements driver.TokenFloorer, for one key or (key "") all.
func (b *Backend) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	if key != "" {
		if err := driver.ValidateKey(key); err != nil {
			return err
		}
	}
	if err := b.check(ctx); err != nil {
		return err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if key == "" {
		s.floor = max(s.floor, floor)
	} else if floor > s.counters[key] {
		s.counters[key] = floor
	}
	return nil
}

// Describe implements driver.Describer.
func (b *Backend) Describe() driver.Description {
	return driver.Description{
		Name:          "memory",
		Fencing:       "per-key counter in process memory; strictly increasing for the life of the Store",
		Clock:         "the process's monotonic clock",
		Liveness:      "TTL",
		Scope:         driver.ScopeKey,
		Failover:      "in-process: nothing survives the process",
		LossDetection: "pushed by the store (expiry, force-release), else " + driver.LossByRenewal,
	}
}

// Close implements driver.Backend. It closes this connection only.
func (b *Backend) Close() error {
	b.closed.Store(true)
	return nil
}
