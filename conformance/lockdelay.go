package conformance

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// The cases of the lock delay (driver.AcquireRequest.LockDelay,
// fencelock.WithLockDelay): after an unreleased end the key stays refused
// for the delay; after a release it is free at once.

const lockDelayRule = "a lock delay (AcquireRequest.LockDelay, WithLockDelay) keeps a key refused for the delay after its holder's record ended without a release, by the store's clock, and a release frees it at once; a backend that cannot keep one refuses it with an *UnsupportedError (ErrUnsupported) naming itself and what to use instead, storing nothing (subtests, each with its own rule)."

func testLockDelay(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	b := s.backend(t)
	key := s.key(t, "probe")
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-" + randHex(), TTL: s.h.TTL, LockDelay: s.h.TTL})
	if errors.Is(err, driver.ErrUnsupported) {
		var ue *driver.UnsupportedError
		if !errors.As(err, &ue) || ue.Backend == "" || ue.Feature != "LockDelay" || ue.Instead == "" {
			t.Fatalf("Acquire with a LockDelay = %v (%T); want an *driver.UnsupportedError naming the backend, Feature \"LockDelay\" and what to use instead", err, err)
		}
		if info, err := b.Inspect(ctx, key); err != nil || info.Locked() {
			t.Fatalf("after a refused LockDelay, Inspect(%q) = %+v, %v; want the key free: nothing stored", key, info, err)
		}
		c := s.client(t)
		if l, err := c.TryAcquire(ctx, key, fencelock.WithLockDelay(s.h.TTL)); !errors.Is(err, fencelock.ErrUnsupported) {
			if l != nil {
				mustRelease(t, l)
			}
			t.Fatalf("Client.TryAcquire with WithLockDelay = %v; want ErrUnsupported: a backend must not ignore a lock delay silently", err)
		}
		t.Skipf("lock delay not supported by this backend, refused with a typed error: %v", err)
	}
	if err != nil {
		t.Fatalf("Acquire with a LockDelay: %v", err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatalf("Release: %v", err)
	}
	runCases(t, s, lockDelayCases)
}

var lockDelayCases = []testCase{
	{"NegativeRefused", "a negative LockDelay is refused with an *InvalidOptionError before anything is stored.", testLockDelayNegative},
	{"UnreleasedEndKeepsKeyForDelay", "after a holder's record (acquired and renewed with a LockDelay) ends without a release, the key is refused for the delay after the renewed record's end, with a *HeldError whose LockDelay is the rest of it, and a waiting Acquire with WithLockDelay gets the key when the delay ends (within slack, or a TTL where the store keeps the gap conservatively), not before.", testLockDelayUnreleased},
	{"ReleaseFreesAtOnce", "a released key (and a force-released one) is free at once for an acquire with a lock delay: the delay follows only an unreleased end.", testLockDelayRelease},
	{"NoDelayAskedNoDelay", "an acquire without a lock delay gets a crashed holder's key when its record expires, whatever delay the crashed holder used.", testLockDelayNotAsked},
}

func testLockDelayNegative(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	b := s.backend(t)
	key := s.key(t, "negative")
	_, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-" + randHex(), TTL: s.h.TTL, LockDelay: -time.Second})
	var oe *driver.InvalidOptionError
	if !errors.As(err, &oe) || oe.Option != "LockDelay" {
		t.Fatalf("Acquire with LockDelay -1s = %v; want an *InvalidOptionError for LockDelay", err)
	}
	if info, err := b.Inspect(ctx, key); err != nil || info.Locked() {
		t.Fatalf("Inspect(%q) = %+v, %v; want the key free: nothing stored", key, info, err)
	}
}

// lockDelayOf returns the delay the lock-delay cases ask for: twice the
// slack, so that when the key is surely expired (the granted TTL plus
// slack after the last renewal) the delay still has a slack to run.
func (s *suite) lockDelayOf() time.Duration { return 2 * s.h.Slack }

func testLockDelayUnreleased(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	dead := s.backend(t)
	ttl := s.h.TTL
	delay := s.lockDelayOf()
	var (
		key      string
		g, g2    driver.Grant
		renewed  time.Time
		attempts = 3
	)
	for attempt := 1; ; attempt++ {
		key = s.key(t, fmt.Sprintf("unreleased-%d", attempt))
		sent := time.Now()
		var err error
		g, err = dead.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-" + randHex(), TTL: ttl, LockDelay: delay})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		// Renew halfway through the record's TTL, counted from before
		// the Acquire was sent (the store's TTL began before its reply).
		select {
		case <-time.After(time.Until(sent.Add(grantedTTL(g, ttl) / 2))):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		// The delay counts from the end of the record as renewed.
		renewed = time.Now()
		g2, err = dead.Renew(ctx, g, driver.RenewRequest{TTL: ttl})
		if err == nil {
			break
		}
		if took := time.Since(sent); errors.Is(err, driver.ErrNotHeld) && took >= grantedTTL(g, ttl) && attempt < attempts {
			// Inconclusive: the Acquire and the Renew took the whole
			// TTL between them (a starved machine), so the record may
			// rightly have expired. Try again on a key of its own.
			t.Logf("Renew = %v %v after the Acquire was sent (granted TTL %v): too slow to tell; trying again", err, took, grantedTTL(g, ttl))
			continue
		}
		t.Fatalf("Renew %v after the Acquire was sent (granted TTL %v): %v", time.Since(sent), grantedTTL(g, ttl), err)
	}
	s.crash(dead)
	granted := grantedTTL(g2, grantedTTL(g, ttl))
	// The record has surely expired (granted TTL plus slack after the
	// renewal) and the delay surely has not (it ends delay after the
	// record, at least granted + delay after the renewal was sent).
	select {
	case <-time.After(s.expiryBound(g2, ttl)):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	other := s.backend(t)
	_, err := other.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-" + randHex(), TTL: ttl, LockDelay: delay})
	if err == nil {
		t.Fatalf("key granted %v after its holder's last renewal (granted TTL %v, lock delay %v): the lock delay was not kept", time.Since(renewed), granted, delay)
	}
	var held *driver.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Acquire in the lock delay = %v; want a *driver.HeldError", err)
	}
	// A store may keep the gap conservatively past the delay (etcd: its
	// leases count whole seconds), but not by more than a TTL.
	if held.LockDelay <= 0 || held.LockDelay > delay+granted {
		t.Errorf("Acquire in the lock delay: HeldError.LockDelay = %v; want the rest of the delay, in (0, %v]: %v", held.LockDelay, delay+granted, err)
	}
	c := s.client(t)
	earliest := renewed.Add(granted + delay - ttl/20)
	// Within slack of the delay's end, or a TTL later on a store that
	// keeps the gap conservatively (as the HeldError check allows).
	bound := time.Until(renewed.Add(s.expiryBound(g2, ttl) + delay + max(s.h.Slack, granted)))
	l, err := c.Acquire(ctx, key, fencelock.WithLockDelay(delay), fencelock.WithWait(bound))
	at := time.Now()
	if err != nil {
		t.Fatalf("waiting Acquire with WithLockDelay(%v) = %v, %v after the last renewal: the key was not granted when the delay ended", delay, err, at.Sub(renewed))
	}
	if at.Before(earliest) {
		t.Errorf("key granted %v after the holder's last renewal (granted TTL %v + lock delay %v): before the delay ended", at.Sub(renewed), granted, delay)
	}
	if l.Token() <= g2.Token {
		t.Errorf("token after the lock delay %d not above the crashed holder's %d", l.Token(), g2.Token)
	}
	t.Logf("key granted %v after the crashed holder's last renewal (granted TTL %v, lock delay %v)", at.Sub(renewed), granted, delay)
	mustRelease(t, l)
}

func testLockDelayRelease(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	delay := s.lockDelayOf()
	c1, c2 := s.client(t), s.client(t)
	key := s.key(t, "release")
	for i := range 2 {
		l, err := c1.Acquire(ctx, key, fencelock.WithLockDelay(delay))
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		mustRelease(t, l)
		// TryAcquire: one attempt, so "at once" is the store's answer.
		l2, err := c2.TryAcquire(ctx, key, fencelock.WithLockDelay(delay))
		if err != nil {
			t.Fatalf("round %d: TryAcquire with WithLockDelay(%v) right after a release = %v; want the key free at once", i, delay, err)
		}
		mustRelease(t, l2)
	}
	b := s.backend(t)
	f, ok := b.(driver.ForceReleaser)
	if !ok {
		return
	}
	key = s.key(t, "force")
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-" + randHex(), TTL: s.h.TTL, LockDelay: delay})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := f.ForceRelease(ctx, key); err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	g2, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-" + randHex(), TTL: s.h.TTL, LockDelay: delay})
	if err != nil {
		t.Fatalf("Acquire with LockDelay right after ForceRelease = %v; want the key free at once", err)
	}
	if g2.Token <= g.Token {
		t.Errorf("token %d after ForceRelease not above %d", g2.Token, g.Token)
	}
	if err := b.Release(ctx, g2); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func testLockDelayNotAsked(t *testing.T, s *suite) {
	ctx := s.ctx(t)
	key := s.key(t, "notasked")
	dead := s.backend(t)
	sent := time.Now()
	g, err := dead.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-" + randHex(), TTL: s.h.TTL, LockDelay: s.lockDelayOf()})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	s.crash(dead)
	c := s.client(t)
	l, at := s.waitFree(t, ctx, c, key, sent.Add(s.expiryBound(g, s.h.TTL)))
	t.Logf("key granted without a lock delay %v after the crashed holder's acquire (TTL %v)", at.Sub(sent), s.h.TTL)
	mustRelease(t, l)
}
