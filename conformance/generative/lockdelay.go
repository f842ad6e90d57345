package generative

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// lockDelayProbe asks a program's store once whether it keeps lock
// delays: a backend that cannot refuses them with ErrUnsupported, and
// its programs then ask none.
type lockDelayProbe struct {
	once sync.Once
	ok   bool
}

// supported reports whether raw's store keeps lock delays, asking it the
// first time with an acquire and release of key (a nil probe says yes).
func (p *lockDelayProbe) supported(ctx context.Context, raw driver.Backend, key string, ttl time.Duration) bool {
	if p == nil {
		return true
	}
	p.once.Do(func() {
		g, err := raw.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "generative-lock-delay-probe", TTL: ttl, LockDelay: ttl})
		if err == nil {
			_ = raw.Release(ctx, g)
		}
		p.ok = !errors.Is(err, driver.ErrUnsupported)
	})
	return p.ok
}

// lockDelaySlack is how much earlier than the gap's lower bound a grant
// may be judged, for the store's clock against the harness's (one
// machine's in the tests that run the mode).
const lockDelaySlack = 50 * time.Millisecond

// crashing records that client is crashing (before closing records the
// instant).
func (r *recorder) crashing(client int) {
	r.mu.Lock()
	r.crashed[client] = true
	r.mu.Unlock()
}

// delayed records the lock delay the lease's call asked for.
func (r *recorder) delayed(rec *leaseRec, d time.Duration) {
	r.mu.Lock()
	rec.lockDelay = d
	r.mu.Unlock()
}

// refusedHoldMayLeaveRecord reports whether the release of l, which
// ended in "not held" while the lease itself was not lost, may have left
// its record in the store: the release went into the lease's minimum
// hold, and the lease asked for a lock delay. Released into its hold,
// the lease's record is not removed but renewed for the rest of the
// window (a Renew); a refused Renew ends the lease, but it does not
// promise that the record is gone, as a refused Release does. A
// composite store does keep one: migrate.Dual, whose one side refused
// and whose other side renewed a lease that asked for a delay, leaves
// the renewed record to expire so that its end starts the delay on that
// side too (instead of a clean release that frees the key at once there;
// see Dual.finish), and a release by owner with the lease's grant then
// finds it. The lease's own release did not confirm its record gone,
// so a stale call accepted afterwards is no StaleCallsRefused violation.
// (A refused hold renewal of a lease with no delay, and every refused
// Release, still confirm it: Dual removes the other side's record then.)
func (r *recorder) refusedHoldMayLeaveRecord(rec *leaseRec, l *fencelock.Lease) bool {
	r.mu.Lock()
	delay := rec.lockDelay
	r.mu.Unlock()
	return delay > 0 && errors.Is(context.Cause(l.Context()), fencelock.ErrHeldForMinimum)
}

// checkLockDelay checks LockDelayRespected: after a holder with a lock
// delay d crashed while it held its key, no other lease of the key is
// granted until d after the crash. The crash is a lower bound of the
// record's unreleased end: the holder believed it held then (so its
// record had not expired: NoTwoHolders), and it had not sent a release
// (it stopped believing only after the crash, and a dead client's calls
// never reach the store). Its record ends later — at the expiry its last
// renewal set, or when the store sees its session gone — and the gap
// counts from there, so the bound is conservative. Called with r.mu held.
//
// Not judged: a holder whose grant a stale call was sent with after the
// crash (the harness sends it straight to the store: a release frees the
// key at once, and so may a refused renewal through a dual backend, which
// then releases the other side's record), a key forced after the holder's grant (so does
// a forced release), a program whose store stalled (a stalled store's
// clock runs on while the harness's checks cannot date what it applied).
func (r *recorder) checkLockDelay(byKey map[string][]*leaseRec) []violation {
	if r.stalled() {
		return nil
	}
	var vs []violation
	for _, x := range r.leases {
		crashSeq, closed := r.closed[x.client]
		if x.lockDelay <= 0 || !r.crashed[x.client] || !closed || x.got > crashSeq || x.end != 0 && x.end < crashSeq {
			continue
		}
		if x.staleSent || x.forced != 0 || r.forcedAfter(x.key, x.got) || r.groupEndedEarly(x, crashSeq) {
			continue
		}
		gapEnd := r.closeAt[x.client].Add(x.lockDelay - lockDelaySlack)
		for _, y := range byKey[x.key] {
			if y == x || maxTok(y) <= maxTok(x) {
				continue // granted before x on the store (tokens increase in grant order)
			}
			if y.gotAt.Before(gapEnd) {
				vs = append(vs, violation{"LockDelayRespected", fmt.Sprintf("lease %d of %q (lock delay %v) was held when its client crashed at %d; lease %d (token %d) was granted %v after the crash, inside the delay",
					x.id, x.key, x.lockDelay, crashSeq, y.id, minTok(y), y.gotAt.Sub(r.closeAt[x.client]).Round(time.Millisecond))})
			}
		}
	}
	return vs
}

// groupEndedEarly reports whether x is a member of a multi-key grant
// another member of which ended by a loss or a force before seq: the
// grant then released x's record (a release, which frees the key at
// once) whenever x's worker recorded its end. Called with r.mu held.
func (r *recorder) groupEndedEarly(x *leaseRec, seq int64) bool {
	if x.group == 0 {
		return false
	}
	for _, l := range r.leases {
		if l.group == x.group && l != x && (l.forced != 0 && l.forced < seq || l.cause != nil && l.end != 0 && l.end < seq) {
			return true
		}
	}
	return false
}

// grouped records that recs are the members of one multi-key grant.
func (r *recorder) grouped(recs []*leaseRec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.groups++
	for _, l := range recs {
		l.group = r.groups
	}
}

// forcedAfter reports whether a forced release of key began after seq.
// Called with r.mu held.
func (r *recorder) forcedAfter(key string, seq int64) bool {
	for _, f := range r.forces {
		if f.key == key && f.after > seq {
			return true
		}
	}
	return false
}
