package fakebackend

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// BoundSlack is the slack Within allows a call beyond its bound.
const BoundSlack = time.Second

// Within runs call and reports how long it took. If it has not returned
// by bound plus BoundSlack, f's hanging requests are let go, c (the
// client under test) is closed to end the call, and the test fails.
func Within(t testing.TB, f *Fake, c interface{ Close() error }, bound time.Duration, what string, call func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		call()
	}()
	timer := time.NewTimer(bound + BoundSlack)
	defer timer.Stop()
	select {
	case <-done:
		return time.Since(start)
	case <-timer.C:
		took := time.Since(start)
		f.LetGo()
		_ = c.Close()
		<-done
		t.Fatalf("%s has not returned after %v; its bound is %v", what, took, bound)
		return 0
	}
}

// LateAcquires makes f's Acquire requests, from the nth on, arrive only
// when gate opens, and be applied then whether or not their sender still
// waits for the reply: a request delayed in flight, which a server
// executes after its client gave up on it. A request whose sender gave up
// is applied by land (a backend of the same store that Close does not
// close). The returned channel is closed when the nth request is on its
// way.
func (f *Fake) LateAcquires(n int, gate <-chan struct{}, land driver.Backend) (sent <-chan struct{}) {
	var calls atomic.Int32
	s := make(chan struct{})
	f.OnAcquire(func(ctx context.Context, r driver.AcquireRequest, next AcquireFunc) (driver.Grant, error) {
		switch k := calls.Add(1); {
		case k < int32(n):
			return next(ctx, r)
		case k == int32(n):
			close(s)
		}
		select {
		case <-gate:
			return next(context.WithoutCancel(ctx), r)
		case <-ctx.Done():
			go func() {
				<-gate
				_, _ = land.Acquire(context.Background(), r)
			}()
			return driver.Grant{}, ctx.Err()
		}
	})
	return s
}
