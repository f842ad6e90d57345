package etcd

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

// errLeaseGone reports that a lease no longer exists in etcd (it expired or
// was revoked): every entry attached to it is gone too.
var errLeaseGone = errors.New("etcd: lease expired or revoked")

// session is one etcd lease shared by every entry a Backend writes with
// the same TTL (in whole seconds). It has no goroutine: it is kept alive
// on demand, by the engine's renewals (Renew, RenewBatch), by acquisitions
// that find it stale, and by waiters while they wait.
//
// expiry is a lower bound of the moment etcd will expire the lease: the
// local (monotonic) time at which the last successful grant or keep-alive
// was sent, plus the TTL etcd answered. A grant's local validity is never
// allowed to go past it.
type session struct {
	b      *Backend
	ttlSec int64

	mu      sync.Mutex
	id      clientv3.LeaseID // 0: none yet, or the last one is gone
	granted time.Duration    // the TTL etcd granted
	expiry  time.Time        // lower bound of etcd's expiry of id
	call    *leaseCall       // grant or keep-alive in flight
}

type leaseCall struct {
	done chan struct{}
	err  error
}

// lease describes a session's lease as known locally.
type lease struct {
	id      clientv3.LeaseID
	granted time.Duration
	expiry  time.Time
}

// handle returns the Handle of a grant whose entry is name, on lease l:
// the lease id in hex, ':' and the name; the lease id alone if name is not
// one this version writes (see validName).
func (l lease) handle(name string) string {
	h := strconv.FormatInt(int64(l.id), 16)
	if !validName(name) {
		return h
	}
	return h + ":" + name
}

// ttlLeft is the time to live a grant sent at start can claim.
func (l lease) ttlLeft(start time.Time) time.Duration { return l.expiry.Sub(start) }

// parseHandle returns the lease a handle names. A handle of an earlier
// version is the lease id alone.
func parseHandle(h string) (clientv3.LeaseID, bool) {
	h, _, _ = strings.Cut(h, ":")
	n, err := strconv.ParseInt(h, 16, 64)
	if err != nil || n == 0 {
		return 0, false
	}
	return clientv3.LeaseID(n), true
}

// handleName returns the entry name a handle carries, if any.
func handleName(h string) (string, bool) {
	_, name, ok := strings.Cut(h, ":")
	return name, ok && validName(name)
}

// stale is how old (as a fraction of the granted TTL) a keep-alive may be
// before an acquisition or renewal sends a fresh one: 1/20, so a grant
// claims at least 95% of the lease TTL while a burst of operations costs
// one keep-alive per TTL/20.
const staleDiv = 20

// session returns the backend's session for a TTL, rounded up to whole
// seconds.
func (b *Backend) session(ttl time.Duration) *session {
	sec := int64((ttl + time.Second - 1) / time.Second)
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[sec]
	if !ok {
		s = &session{b: b, ttlSec: sec}
		b.sessions[sec] = s
	}
	return s
}

// sessionOf returns the session whose current lease is id, if any.
func (b *Backend) sessionOf(id clientv3.LeaseID) *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.sessions {
		s.mu.Lock()
		cur := s.id
		s.mu.Unlock()
		if cur == id {
			return s
		}
	}
	return nil
}

// fresh returns the session's lease once its last keep-alive is recent:
// sent less than granted/staleDiv ago. Concurrent callers share one grant
// or keep-alive request. want, if not zero, is the lease the caller needs:
// if the session has moved on to another lease, want is gone. With grant,
// a missing or vanished lease is replaced by a new one.
func (s *session) fresh(ctx context.Context, want clientv3.LeaseID, grant bool) (lease, error) {
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		if want != 0 && s.id != want {
			s.mu.Unlock()
			return lease{}, errLeaseGone
		}
		cur := lease{id: s.id, granted: s.granted, expiry: s.expiry}
		if s.id != 0 && time.Until(s.expiry) >= s.granted-s.granted/staleDiv {
			s.mu.Unlock()
			return cur, nil
		}
		if c := s.call; c != nil {
			s.mu.Unlock()
			select {
			case <-c.done:
			case <-ctx.Done():
				return lease{}, ctx.Err()
			}
			if c.err == nil {
				// Whatever it got is a valid lower bound, even if the
				// request was sent a little before ours.
				s.mu.Lock()
				cur = lease{id: s.id, granted: s.granted, expiry: s.expiry}
				s.mu.Unlock()
				if cur.id != 0 && (want == 0 || cur.id == want) && time.Until(cur.expiry) > 0 {
					return cur, nil
				}
			}
			if attempt >= 2 {
				if c.err != nil {
					return lease{}, c.err
				}
				return lease{}, errLeaseGone
			}
			continue
		}
		if s.id == 0 && !grant {
			s.mu.Unlock()
			return lease{}, errLeaseGone
		}
		if s.b.closed.Load() {
			// Nothing is granted or kept alive once the backend is
			// closed (Close revokes) or crashed (a dead process).
			s.mu.Unlock()
			return lease{}, driver.ErrClosed
		}
		c := &leaseCall{done: make(chan struct{})}
		s.call = c
		id := s.id
		s.mu.Unlock()

		sent := time.Now()
		var ttl int64
		var err error
		if id == 0 {
			var resp *clientv3.LeaseGrantResponse
			resp, err = s.b.cli.Grant(ctx, s.ttlSec)
			if err == nil {
				id, ttl = resp.ID, resp.TTL
			}
		} else {
			var resp *clientv3.LeaseKeepAliveResponse
			resp, err = s.b.cli.KeepAliveOnce(ctx, id)
			if err == nil {
				ttl = resp.TTL
			}
		}
		if h := s.b.testHookLeaseAnswered; h != nil {
			h()
		}
		s.mu.Lock()
		// Close ran meanwhile and revoked what it knew of: do not keep
		// or hand out a lease it did not know of. Checked under s.mu:
		// Close sets closed before it collects the sessions' ids, each
		// under its s.mu, so either it collects this id or this sees
		// closed. Checked before taking s.mu, a Close that ran between
		// the check and the lock missed the id (s.id was still the old
		// one) and the lease lived on, with the entry put on it.
		revoke := false
		if err == nil && s.b.closed.Load() {
			revoke = s.b.cleanClose.Load()
			err = driver.ErrClosed
		}
		switch {
		case err == nil:
			s.id, s.granted, s.expiry = id, time.Duration(ttl)*time.Second, sent.Add(time.Duration(ttl)*time.Second)
		case isLeaseNotFound(err):
			if s.id == id {
				s.id, s.expiry = 0, time.Time{}
			}
			err = errLeaseGone
		}
		s.call = nil
		c.err = err
		close(c.done)
		cur = lease{id: s.id, granted: s.granted, expiry: s.expiry}
		s.mu.Unlock()
		if revoke {
			s.b.revoke(id)
		}
		switch {
		case err == nil:
			s.b.sweep(ctx)
			return cur, nil
		case errors.Is(err, errLeaseGone) && grant && want == 0 && attempt < 2:
			continue // grant a new one
		default:
			return lease{}, err
		}
	}
}

// forget drops lease id from the session after etcd said it is gone.
func (s *session) forget(id clientv3.LeaseID) {
	s.mu.Lock()
	if s.id == id {
		s.id, s.expiry = 0, time.Time{}
	}
	s.mu.Unlock()
}

// keepLease refreshes the lease an entry is attached to, whoever granted
// it: through its session if it is one of this backend's, with a direct
// keep-alive otherwise (a grant made by another Backend of the same
// process).
func (b *Backend) keepLease(ctx context.Context, id clientv3.LeaseID) (lease, error) {
	if s := b.sessionOf(id); s != nil {
		return s.fresh(ctx, id, false)
	}
	if b.closed.Load() {
		return lease{}, driver.ErrClosed // as session.fresh
	}
	sent := time.Now()
	resp, err := b.cli.KeepAliveOnce(ctx, id)
	if err != nil {
		if isLeaseNotFound(err) {
			return lease{}, errLeaseGone
		}
		return lease{}, err
	}
	d := time.Duration(resp.TTL) * time.Second
	return lease{id: id, granted: d, expiry: sent.Add(d)}, nil
}
