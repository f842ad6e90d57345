package generative

import (
	"context"
	"fmt"
	"time"

	"github.com/fencelock/fencelock"
)

// look records what lease rec's holder sees when it looks at l:
// Remaining(), and whether Done is closed. It reports whether the lease
// is over as far as the holder can tell (Remaining() is 0).
//
// ValidityNeverComesBack: once a holder saw Remaining() at 0 (or Done
// closed), it never again sees Remaining() > 0. Conservative: the look
// that found 0 is dated after it returned, the one that found more
// before it began, so a violation is two looks in that order.
func (r *runner) look(l *fencelock.Lease, rec *leaseRec) bool {
	before := r.rec.tick()
	done := isDone(l) // Done first: closed means the lease was no longer held
	rem := l.Remaining()
	after := r.rec.tick()
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	switch {
	case rem > 0 && done && !rec.cameBack:
		rec.cameBack = true
		r.rec.directLocked(after, "ValidityNeverComesBack", "lease %d (%q, token %d) had Done closed, yet Remaining() = %v", rec.id, rec.key, l.Token(), rem)
	case rem > 0 && rec.zeroAt != 0 && rec.zeroAt < before && !rec.cameBack:
		rec.cameBack = true
		r.rec.directLocked(after, "ValidityNeverComesBack", "lease %d (%q, token %d)'s holder saw Remaining() = 0 at %d, then Remaining() = %v at %d", rec.id, rec.key, l.Token(), rec.zeroAt, rem, before)
	case rem == 0 && rec.zeroAt == 0:
		rec.zeroAt = after
		r.rec.notes = append(r.rec.notes, fmt.Sprintf("%5d lease %d's holder sees Remaining() = 0 (Done closed: %v)", after, rec.id, done))
	}
	return rem == 0
}

// holdFor holds l for d, or until it ends, looking at its Remaining() at
// the program's pace (every twentieth of a TTL) as a careful holder
// does. Once it finds none left, it stops holding, as such a holder
// would, and waits for the lease to end (awaitEnd).
func (r *runner) holdFor(ctx context.Context, l *fencelock.Lease, rec *leaseRec, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	pace := time.NewTicker(r.tenth / 2)
	defer pace.Stop()
	for {
		select {
		case <-t.C:
			return
		case <-l.Done():
			return
		case <-ctx.Done():
			return
		case <-pace.C:
			if r.look(l, rec) {
				r.awaitEnd(ctx, l, rec)
				return
			}
		}
	}
}

// awaitEnd waits, looking at Remaining() at the program's pace, for the
// Done of a lease whose holder saw Remaining() at 0: it closes within
// twice the lease's TTL plus the harness's slack (ValidityNeverComesBack).
// The engine's timer that ends the lease was armed before that look, for
// at most the lease's TTL, and no renewal may move it once the lease's
// validity has ended; the bound doubles that for a loaded machine, and
// costs nothing while Done closes in time.
func (r *runner) awaitEnd(ctx context.Context, l *fencelock.Lease, rec *leaseRec) {
	bound := 2*l.TTL() + r.h.Slack
	t := time.NewTimer(bound)
	defer t.Stop()
	pace := time.NewTicker(r.tenth / 2)
	defer pace.Stop()
	for {
		select {
		case <-l.Done():
			return
		case <-ctx.Done():
			return
		case <-pace.C:
			r.look(l, rec)
		case <-t.C:
			if !isDone(l) {
				r.rec.violate("ValidityNeverComesBack", "lease %d (%q, token %d)'s holder saw Remaining() = 0; %v later its Done was still open (Remaining() = %v, Err() = %v)", rec.id, rec.key, l.Token(), bound, l.Remaining(), l.Err())
			}
			return
		}
	}
}

// directLocked records a violation seen at seq s while the program ran.
// Called with r.mu held.
func (r *recorder) directLocked(s int64, property, format string, args ...any) {
	v := violation{property, fmt.Sprintf(format, args...)}
	r.notes = append(r.notes, fmt.Sprintf("%5d violation: %s", s, v))
	r.direct = append(r.direct, v)
}
