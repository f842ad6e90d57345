package generative

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance"
)

// boundViolations checks one call of an outage program that started
// one TTL into the outage, took took, with a deadline after dl (0:
// none), and returned err.
func boundViolations(op boundOp, dl, took time.Duration, err error, kind outageKind) []violation {
	h := conformance.Harness{TTL: time.Second, Slack: 750 * time.Millisecond}
	at := time.Unix(1000, 0)
	c := callRec{op: op, ttl: h.TTL, outageAt: at, start: at.Add(h.TTL), err: err}
	if dl > 0 {
		c.deadline = c.start.Add(dl)
	}
	c.end = c.start.Add(took)
	c.bound, c.nomEnd = callBound(c, h)
	return checkBounds([]callRec{c}, kind)
}

// A call that ends within its deadline plus ReleaseTimeout (2s for a 1s
// TTL) plus the slack (at least 1s) keeps its bound; one that ends later
// does not, with or without a deadline.
func TestCallEndsWithinBound(t *testing.T) {
	cause := fmt.Errorf("%w: %w", context.DeadlineExceeded, notAnswering{context.DeadlineExceeded})
	for _, c := range []struct {
		op       boundOp
		dl, took time.Duration
		want     bool
	}{
		{boundTryDeadline, 300 * time.Millisecond, 3200 * time.Millisecond, false},
		{boundTryDeadline, 300 * time.Millisecond, 3400 * time.Millisecond, true},
		{boundTry, 0, 3900 * time.Millisecond, false},
		{boundTry, 0, 4100 * time.Millisecond, true},
		// Acquire without a deadline: 2×TTL + ReleaseTimeout + slack.
		{boundAcquire, 0, 4900 * time.Millisecond, false},
		{boundAcquire, 0, 5100 * time.Millisecond, true},
		{boundRelease, 0, 2900 * time.Millisecond, false},
		{boundRelease, 0, 3100 * time.Millisecond, true},
		// Close: ReleaseTimeout + its grace (0.2s) + slack.
		{boundClose, 0, 3100 * time.Millisecond, false},
		{boundClose, 0, 3300 * time.Millisecond, true},
	} {
		vs := boundViolations(c.op, c.dl, c.took, cause, outageStall)
		if got := len(vs) > 0; got != c.want {
			t.Errorf("%s (deadline %v) taking %v: violations %v; want a violation %v", c.op, c.dl, c.took, vs, c.want)
		}
	}
}

// An acquire that failed while the store refused must say "connection
// refused" and match syscall.ECONNREFUSED; one that failed while it did
// not answer must carry the store's error, not ctx's alone.
func TestStoreCauseInError(t *testing.T) {
	ok := fmt.Errorf("fencelock: acquire: %w", refused())
	if vs := boundViolations(boundTry, 0, time.Millisecond, ok, outageRefuse); len(vs) != 0 {
		t.Errorf("a refusal wrapped with %%w: %v; want no violation", vs)
	}
	bare := fmt.Errorf("fencelock: acquire: %v", refused())
	if vs := boundViolations(boundTry, 0, time.Millisecond, bare, outageVanish); len(vs) != 1 {
		t.Errorf("a refusal flattened to text: %v; want StoreCauseInError", vs)
	}
	joined := errors.Join(context.DeadlineExceeded, notAnswering{context.DeadlineExceeded})
	if vs := boundViolations(boundAcquireDeadline, time.Second, time.Second, joined, outageStall); len(vs) != 0 {
		t.Errorf("ctx's error joined with the store's: %v; want no violation", vs)
	}
	if vs := boundViolations(boundAcquireDeadline, time.Second, time.Second, context.DeadlineExceeded, outageStall); len(vs) != 1 {
		t.Errorf("a bare context deadline exceeded: %v; want StoreCauseInError", vs)
	}
}

// TryRLockBesideReaders: a TryRLock refused while only readers were
// about is a violation; one refused while a writer's call overlapped it,
// or in a program with faults, is not.
func TestTryRLockBesideReaders(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }
	refusedTry := rwCall{client: 1, kind: rwTryRead, label: "try", start: at(100), ret: at(110), end: at(110), refused: true, err: fencelock.ErrNotAcquired}
	reader := rwCall{client: 0, kind: rwRead, label: "reader", start: at(90), ret: at(105), end: at(500), granted: true}
	writer := rwCall{client: 2, kind: rwWrite, label: "writer", start: at(50), ret: at(80), end: at(90), granted: true, minHold: 300 * time.Millisecond}
	run := func(clean bool, calls ...rwCall) []violation {
		r := &rwRun{clean: clean, tenth: 100 * time.Millisecond, calls: calls}
		return r.checkTryRLock()
	}
	if vs := run(true, refusedTry, reader); len(vs) != 1 {
		t.Errorf("refused beside a reader alone: %v; want TryRLockBesideReaders", vs)
	}
	if vs := run(true, refusedTry, reader, writer); len(vs) != 0 {
		t.Errorf("refused while a writer's grant (in its minimum hold) was about: %v; want none", vs)
	}
	if vs := run(false, refusedTry, reader); len(vs) != 0 {
		t.Errorf("refused in a program with faults: %v; want none", vs)
	}
}
