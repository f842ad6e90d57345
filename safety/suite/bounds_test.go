package suite

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/safety/report"
)

// TestNamesCause: a bare context error and ErrNotAcquired hide the store's
// cause; a refused dial, a reset or a driver's timeout name it.
func TestNamesCause(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, false},
		{fmt.Errorf("fencelock: acquire \"k\": %w", context.DeadlineExceeded), false},
		{fmt.Errorf("fencelock: acquire \"k\": %w", fencelock.ErrNotAcquired), false},
		{errGrantedUnreachable, false},
		{nil, false},
		{fmt.Errorf("acquire: %w", errors.Join(context.DeadlineExceeded, syscall.ECONNREFUSED)), true},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), true},
		{errors.New("read tcp 127.0.0.1:5: i/o timeout"), true},
		{errors.New("unexpected EOF"), true},
		{errors.New("fencelock: redis: acquire: no answer from the store within the request's bound (the call's TTL, 1s)"), true},
		{errors.New("fencelock: not acquired within the wait bound (2s)"), false},
		// WithWait's bound passed on a failing store: ErrNotAcquired
		// with the store's failure beside it names the cause.
		{errors.Join(fmt.Errorf("%w within the wait bound (2s)", fencelock.ErrNotAcquired),
			&fencelock.BackendError{Backend: "redis", Op: "acquire", Err: errors.New("dial tcp 127.0.0.1:1: connect: connection refused")}), true},
	} {
		if got := namesCause(c.err); got != c.want {
			t.Errorf("namesCause(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestJudgeBounds: a call later than its bound plus slack fails B1, a
// failed call without the store's cause fails B2, and a Close is judged
// by its time only.
func TestJudgeBounds(t *testing.T) {
	ok := report.CallBound{Fault: boundPaused, Call: "TryAcquire", Elapsed: 3500 * time.Millisecond, Bound: 3 * time.Second, Slack: time.Second, Err: "i/o timeout", Cause: true}
	late := ok
	late.Elapsed = 4100 * time.Millisecond
	mute := ok
	mute.Err, mute.Cause = "context deadline exceeded", false
	closed := report.CallBound{Fault: boundVanished, Call: "Close (slowest of 6: Release)", Elapsed: time.Second, Bound: 2 * time.Second, Slack: time.Second}
	for _, c := range []struct {
		calls  []report.CallBound
		failed []string
	}{
		{[]report.CallBound{ok, closed}, nil},
		{[]report.CallBound{ok, late}, []string{"B1"}},
		{[]report.CallBound{mute}, []string{"B2"}},
		{[]report.CallBound{late, mute}, []string{"B1", "B2"}},
	} {
		res := judgeBounds(c.calls)
		if got := res.Failed(); fmt.Sprint(got) != fmt.Sprint(c.failed) {
			t.Errorf("judgeBounds(%+v) failed %v, want %v", c.calls, got, c.failed)
		}
	}
}
