package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// The cases of per-call options (fencelock.WithTTL, WithMinHold,
// WithMetadata, WithLabel): the engine's part of them, checked through the
// store, on every backend.

// testOptions runs optionCases, each as a subtest (the whole group is one
// entry of cases).
func testOptions(t *testing.T, s *suite) {
	runCases(t, s, optionCases)
}

var optionCases = []testCase{
	{"PerCallTTLHonoured", "a TTL given per call (WithTTL) is the one the store applies: two leases of one Client with different TTLs are each renewed with their own (batch renewals included), and when their holder dies each key is freed within its own granted TTL plus slack, not the Client's default TTL.", testPerCallTTL},
	{"MinHoldKeepsKeyForWindow", "a lease released before its minimum hold (WithMinHold) has passed keeps the key held, by its own record, until the window ends, and frees it then (within slack), not a TTL later; Release returns nil and the lease's context cause matches ErrHeldForMinimum.", testMinHold},
	{"MetadataThroughClient", "metadata given with WithMetadata, and replaced with Lease.SetMetadata, is what Client.Inspect and Client.List report, with the holder's label (WithLabel) in Info.Label; a SetMetadata after the lease was lost fails with ErrLeaseLost and changes nothing stored.", testMetadataThroughClient},
}

// errCrashed is what a crashable backend answers once its process has
// "died": a transient failure, as a network partition would look.
var errCrashed = errors.New("conformance: the holder's process has crashed")

// crashable wraps a backend so that a Client on it can die as its process
// would: after crash, every call fails without reaching the store (no
// renewal, no release), and the harness's Crash stops the session of a
// session store. It remembers the last grant of each key.
type crashable struct {
	driver.Backend
	s       *suite
	crashed atomic.Bool
	mu      sync.Mutex
	grants  map[string]driver.Grant
}

// crashableBatch is a crashable whose store renews in batches: the Client
// must see the capability to use it.
type crashableBatch struct{ *crashable }

func (s *suite) crashable(t *testing.T) (driver.Backend, *crashable) {
	t.Helper()
	b, err := s.h.Open(t.Context())
	if err != nil {
		t.Fatalf("Harness.Open: %v", err)
	}
	cb := &crashable{Backend: b, s: s, grants: make(map[string]driver.Grant)}
	if _, ok := b.(driver.BatchRenewer); ok {
		return crashableBatch{cb}, cb
	}
	return cb, cb
}

func (c *crashable) crash() {
	c.crashed.Store(true)
	c.s.crash(c.Backend)
}

func (c *crashable) note(g driver.Grant) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grants[g.Key] = g
}

func (c *crashable) last(key string) driver.Grant {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.grants[key]
}

func (c *crashable) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if c.crashed.Load() {
		return driver.Grant{}, errCrashed
	}
	g, err := c.Backend.Acquire(ctx, req)
	if err == nil {
		if g.Key == "" {
			g.Key = req.Key
		}
		c.note(g)
	}
	return g, err
}

func (c *crashable) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if c.crashed.Load() {
		return driver.Grant{}, errCrashed
	}
	ng, err := c.Backend.Renew(ctx, g, req)
	if err == nil {
		if ng.Key == "" {
			ng.Key = g.Key
		}
		c.note(ng)
	}
	return ng, err
}

func (c *crashable) Release(ctx context.Context, g driver.Grant) error {
	if c.crashed.Load() {
		return errCrashed
	}
	return c.Backend.Release(ctx, g)
}

func (c crashableBatch) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if c.crashed.Load() {
		return nil, errCrashed
	}
	res, err := c.Backend.(driver.BatchRenewer).RenewBatch(ctx, grants, req)
	if err == nil {
		for i, r := range res {
			if r.Err == nil && i < len(grants) {
				g := r.Grant
				if g.Key == "" {
					g.Key = grants[i].Key
				}
				c.note(g)
			}
		}
	}
	return res, err
}

// crashableClient returns a Client on a crashable backend. Its Close,
// after a crash, fails to release (as a dead process does): the error is
// ignored.
func (s *suite) crashableClient(t *testing.T, o *fencelock.Options) (*fencelock.Client, *crashable) {
	t.Helper()
	b, cb := s.crashable(t)
	c, err := fencelock.New(b, o)
	if err != nil {
		b.Close()
		t.Fatalf("fencelock.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, cb
}

func testPerCallTTL(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	short, long := s.key(t, "short"), s.key(t, "long")
	o := s.options()
	o.TTL = 4 * s.h.TTL // the Client's default: the long lease's
	c, cb := s.crashableClient(t, o)
	other := s.client(t)
	ls, err := c.Acquire(ctx, short, fencelock.WithTTL(s.h.TTL))
	if err != nil {
		t.Fatal(err)
	}
	ll, err := c.Acquire(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != s.h.TTL || ll.TTL() != o.TTL {
		t.Fatalf("Lease.TTL() = %v and %v; want %v (per call) and %v (Client default)", ls.TTL(), ll.TTL(), s.h.TTL, o.TTL)
	}
	// Both live through several renewals of the short lease (several
	// batches, on a BatchRenewer), each with its own TTL.
	select {
	case <-time.After(2 * s.h.TTL):
	case <-ls.Done():
		t.Fatalf("short lease ended while renewed: %v", ls.Err())
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	for _, l := range []*fencelock.Lease{ls, ll} {
		if l.Err() != nil {
			t.Fatalf("lease %q ended while renewed: %v", l.Key(), l.Err())
		}
		if _, err := other.TryAcquire(ctx, l.Key()); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatalf("TryAcquire(%q) of a renewed lease = %v; want ErrNotAcquired", l.Key(), err)
		}
	}
	gs, gl := cb.last(short), cb.last(long)
	crashed := time.Now()
	cb.crash()
	// What the store says of the long key from the crash on, for the
	// failure message below only (no assertion rests on it).
	probe := watchHolder(ctx, other, long, crashed)
	defer probe.stop()
	// The short key's record was last renewed before the crash, with the
	// short TTL: it is gone within that TTL (as granted) plus slack.
	shortBound := s.expiryBound(gs, s.h.TTL)
	l, at := s.waitFree(t, ctx, other, short, crashed.Add(shortBound))
	t.Logf("short key (TTL %v, granted %v) freed %v after its holder crashed; bound %v", s.h.TTL, grantedTTL(gs, s.h.TTL), at.Sub(crashed), shortBound)
	mustRelease(t, l)
	// The long key's record, renewed with the long TTL at most one of its
	// renewal intervals (TTL/3) before the crash, outlives that bound
	// where the store grants the TTLs asked (a session store, ZooKeeper,
	// grants its session's for every lease).
	longTTL, shortTTL := grantedTTL(gl, o.TTL), grantedTTL(gs, s.h.TTL)
	if longTTL-longTTL/3 > shortBound+s.h.Slack && longTTL > shortTTL {
		if time.Since(crashed) < longTTL-longTTL/3 {
			if l, err := other.TryAcquire(ctx, long); err == nil {
				t.Errorf("long key (TTL %v) acquired (token %d) %v after its holder crashed: the store applied a shorter TTL than the lease's (the crashed holder's last grant: owner %q, token %d, TTL %v; %s)", o.TTL, l.Token(), time.Since(crashed), gl.Owner, gl.Token, gl.TTL, probe.stop())
				mustRelease(t, l)
			} else if !errors.Is(err, fencelock.ErrNotAcquired) {
				t.Fatal(err)
			} else {
				t.Logf("long key still held %v after the crash (%s)", time.Since(crashed), probe.stop())
			}
		}
	} else {
		t.Logf("store grants %v for a %v TTL and %v for %v: the long lease's survival is not checked", longTTL, o.TTL, shortTTL, s.h.TTL)
	}
}

func testMinHold(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "minhold")
	c, other := s.client(t), s.client(t)
	window := 3 * s.h.TTL
	begin := time.Now()
	l, err := c.Acquire(ctx, key, fencelock.WithMinHold(window))
	if err != nil {
		t.Fatal(err)
	}
	acquired := time.Now()
	owner := l.Owner()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release inside the minimum hold = %v; want nil", err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("lease not ended by Release")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, fencelock.ErrHeldForMinimum) || !errors.Is(cause, fencelock.ErrReleased) {
		t.Errorf("context cause after Release inside the minimum hold = %v; want ErrHeldForMinimum and ErrReleased", cause)
	}
	// Held until the window ends (counted from before the Acquire call,
	// which is no later than the engine's start), by the released lease's
	// record. A short guard before the end absorbs the store's expiry
	// granularity (Redis: milliseconds).
	guard := min(20*time.Millisecond, s.h.TTL/20)
	checks := 0
	for time.Since(begin) < window-guard {
		info, err := other.Inspect(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(begin) >= window-guard {
			break
		}
		if info.Owner != owner {
			t.Fatalf("%v into a %v minimum hold, Inspect = %+v; want the released lease's record (owner %q)", time.Since(begin), window, info, owner)
		}
		if l2, err := other.TryAcquire(ctx, key); err == nil {
			if time.Since(begin) < window-guard {
				t.Fatalf("key acquired (token %d) %v into a %v minimum hold", l2.Token(), time.Since(begin), window)
			}
			mustRelease(t, l2)
			break
		} else if !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatal(err)
		}
		checks++
		select {
		case <-time.After(min(s.h.TTL/4, max(time.Millisecond, time.Until(begin.Add(window-guard))))):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if checks < 4 {
		t.Errorf("only %d checks inside the window: the store was too slow to test", checks)
	}
	// Free once the window has ended: no later than its end plus slack
	// (not its end plus another TTL).
	l2, at := s.waitFree(t, ctx, other, key, acquired.Add(window+s.h.Slack))
	t.Logf("key free %v after Acquire returned, with a %v minimum hold (bound %v)", at.Sub(acquired), window, window+s.h.Slack)
	mustRelease(t, l2)
	// Released after its window, a lease frees the key at once.
	l3, err := c.Acquire(ctx, key, fencelock.WithMinHold(s.h.TTL/2))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-time.After(s.h.TTL/2 + 10*time.Millisecond):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	mustRelease(t, l3)
	if errors.Is(context.Cause(l3.Context()), fencelock.ErrHeldForMinimum) {
		t.Errorf("released after its minimum hold, yet the cause is %v", context.Cause(l3.Context()))
	}
	if info, err := other.Inspect(ctx, key); err != nil || info.Locked() {
		t.Errorf("Inspect after a Release past the minimum hold = %+v, %v; want the key free at once", info, err)
	}
}

// brief quotes at most the first 32 bytes of a payload, with its length.
func brief(b []byte) string {
	if len(b) <= 32 {
		return strconv.Quote(string(b))
	}
	return fmt.Sprintf("%q… (%d bytes)", b[:32], len(b))
}

func testMetadataThroughClient(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "meta")
	c, other := s.client(t), s.client(t)
	first := []byte("addr=10.0.0.1:8080")
	l, err := c.Acquire(ctx, key, fencelock.WithMetadata(first), fencelock.WithLabel("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	check := func(want []byte) {
		t.Helper()
		info, err := other.Inspect(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(info.Metadata, want) || info.Label() != "node-1" || info.Owner != l.Owner() {
			t.Errorf("Client.Inspect = metadata %s, label %q, owner %q; want %s, node-1, %q", brief(info.Metadata), info.Label(), info.Owner, brief(want), l.Owner())
		}
		infos, err := other.List(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || !bytes.Equal(infos[0].Metadata, want) || infos[0].Label() != "node-1" {
			var got []string
			for _, i := range infos {
				got = append(got, fmt.Sprintf("%s: owner %q, metadata %s", i.Key, i.Owner, brief(i.Metadata)))
			}
			t.Errorf("Client.List = %q; want one entry with metadata %s and label node-1", got, brief(want))
		}
	}
	check(first)
	second := bytes.Repeat([]byte{0, 0xff, 'x'}, driver.MaxMetadataLen/3)
	if err := l.SetMetadata(ctx, second); err != nil {
		t.Fatalf("SetMetadata: %v", err)
	}
	if !bytes.Equal(l.Metadata(), second) {
		t.Errorf("Lease.Metadata() after SetMetadata differs from what was set")
	}
	check(second)
	// Renewals keep it.
	select {
	case <-time.After(s.h.TTL):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	check(second)
	// Lost (its holder cut off from the store until local validity ran
	// out): SetMetadata fails, and what the store has is not changed.
	d, cb := s.crashableClient(t, s.options())
	dk := s.key(t, "lost")
	dl, err := d.Acquire(ctx, dk, fencelock.WithMetadata(first))
	if err != nil {
		t.Fatal(err)
	}
	cb.crash()
	select {
	case <-dl.Done():
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := dl.SetMetadata(ctx, []byte("late")); !errors.Is(err, fencelock.ErrLeaseLost) || !errors.Is(err, fencelock.ErrNotHeld) {
		t.Errorf("SetMetadata after the lease was lost = %v; want ErrLeaseLost and ErrNotHeld", err)
	}
	if info, err := other.Inspect(ctx, dk); err != nil || (info.Locked() && !bytes.Equal(info.Metadata, first)) {
		t.Errorf("Inspect after a lost lease's SetMetadata = %+v, %v; want the metadata unchanged (or the key free)", info, err)
	}
	// Taken by another holder: the former holder's SetMetadata fails and
	// the new holder's metadata stays.
	if f, ok := s.backend(t).(driver.ForceReleaser); ok {
		if _, err := f.ForceRelease(ctx, key); err != nil {
			t.Fatal(err)
		}
		l2, err := other.Acquire(ctx, key, fencelock.WithMetadata([]byte("theirs")))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.SetMetadata(ctx, []byte("mine")); !errors.Is(err, fencelock.ErrNotHeld) {
			t.Errorf("SetMetadata by a holder whose key was taken = %v; want ErrNotHeld", err)
		}
		if info, err := c.Inspect(ctx, key); err != nil || string(info.Metadata) != "theirs" || info.Owner != l2.Owner() {
			t.Errorf("Inspect = %+v, %v; want the new holder's metadata", info, err)
		}
		mustRelease(t, l2)
	} else {
		mustRelease(t, l)
		t.Log("capability ForceReleaser not implemented: the taken-holder part not run")
	}
}

// holderProbe inspects a key from a moment on until it is found free, and
// reports what it saw: the holder the store named first (with the time to
// live the store gave it) and when the key was first seen free. It serves
// failure messages: when a record vanished early, whether it was on a
// short clock from the start or went away later.
type holderProbe struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	first driver.Info // the first answer naming a holder
	at    time.Duration
	free  time.Duration // when first seen free; 0 if not yet
	err   error
	polls int
}

// watchHolder starts a holderProbe of key with c, timed from since. It
// asks every 20ms: a probe, not a synchronization.
func watchHolder(ctx context.Context, c *fencelock.Client, key string, since time.Time) *holderProbe {
	ctx, cancel := context.WithCancel(ctx)
	p := &holderProbe{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			info, err := c.Inspect(ctx, key)
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.polls++
			switch {
			case err != nil:
				p.err = err
			case info.Owner == "":
				p.free = time.Since(since)
			case p.first.Owner == "":
				p.first, p.at = info, time.Since(since)
			}
			stop := p.free != 0
			p.mu.Unlock()
			if stop {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return p
}

// stop ends the probe, waits for its goroutine, and describes what it saw.
func (p *holderProbe) stop() string {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	msg := fmt.Sprintf("%d inspections from the crash on", p.polls)
	if p.first.Owner != "" {
		msg += fmt.Sprintf("; +%v: held by %q, token %d, remaining %v by the store", p.at.Round(time.Millisecond), p.first.Owner, p.first.Token, p.first.Remaining)
	}
	if p.free != 0 {
		msg += fmt.Sprintf("; first seen free +%v", p.free.Round(time.Millisecond))
	}
	if p.err != nil {
		msg += fmt.Sprintf("; last error %v", p.err)
	}
	return msg
}
