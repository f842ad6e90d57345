package mongo

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"
)

// Failing fast on a store that does not answer.
//
// The driver selects a server for every command and, while none can take
// it, waits (up to serverSelectionTimeout, 30s by default, or the
// context's deadline): a refused connection would otherwise look like a
// slow server. On a client it opened (Open), the backend watches the
// driver's heartbeats: once the deployment has no server that takes
// writes and its last heartbeat failed (the connection was refused, the
// hello timed out), every command waiting for a server ends at once with
// an *UnreachableError carrying that failure, and new calls fail the same
// way without waiting, while a background ping keeps the driver checking
// (every 500ms, its minimum) so that the first call after the server is
// back goes through. On a caller-owned client (New) the caller's driver
// settings apply; the errors still carry the failure the driver saw.

// ErrUnreachable matches the error of a call that could not reach the
// deployment: the driver's last heartbeat failed and no server takes
// writes. The error (an *UnreachableError) also matches the failure
// itself, e.g. syscall.ECONNREFUSED. It is transient: the engine retries.
var ErrUnreachable = errors.New("mongo: the server does not answer")

// UnreachableError is the error ErrUnreachable matches.
type UnreachableError struct {
	// Cause is the driver's last heartbeat failure.
	Cause error
}

// Error names the failure.
func (e *UnreachableError) Error() string {
	return "mongo: no server answers (the driver's last check failed: " + e.Cause.Error() + "); check that the server runs and that the URL's hosts and ports are right"
}

// Unwrap returns ErrUnreachable and the cause.
func (e *UnreachableError) Unwrap() []error { return []error{ErrUnreachable, e.Cause} }

// reach follows the deployment's state from the driver's heartbeats.
type reach struct {
	mu       sync.Mutex
	writable bool  // the topology has a server that takes writes
	failure  error // the last heartbeat failure since the last success
	waiting  map[*int]context.CancelCauseFunc
	probing  bool // a background ping runs
}

// monitor returns the driver event hooks that feed r.
func (r *reach) monitor() *event.ServerMonitor {
	return &event.ServerMonitor{
		TopologyDescriptionChanged: func(e *event.TopologyDescriptionChangedEvent) {
			w := false
			for _, s := range e.NewDescription.Servers {
				switch s.Kind {
				case "Standalone", "RSPrimary", "Mongos", "LoadBalancer":
					w = true
				}
			}
			r.mu.Lock()
			r.writable = w
			r.mu.Unlock()
			r.settle()
		},
		ServerHeartbeatSucceeded: func(*event.ServerHeartbeatSucceededEvent) {
			r.mu.Lock()
			r.failure = nil
			r.mu.Unlock()
		},
		ServerHeartbeatFailed: func(e *event.ServerHeartbeatFailedEvent) {
			if e.Failure == nil {
				return
			}
			r.mu.Lock()
			r.failure = e.Failure
			r.mu.Unlock()
			r.settle()
		},
	}
}

// downLocked returns the error of a call now, or nil if it may go on.
func (r *reach) downLocked() error {
	if r.writable || r.failure == nil {
		return nil
	}
	return &UnreachableError{Cause: r.failure}
}

// settle ends the calls waiting for a server if the deployment is down.
func (r *reach) settle() {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.downLocked()
	if err == nil {
		return
	}
	for k, cancel := range r.waiting {
		cancel(err)
		delete(r.waiting, k)
	}
}

// begin returns the context a call's commands run on: ctx, ended with an
// *UnreachableError when the deployment goes down; and the function to
// call with the call's error when it returns, which gives the error its
// cause. A call on a deployment already down fails at once (down is true)
// and starts a background ping, so the driver keeps checking.
func (b *Backend) begin(ctx context.Context) (context.Context, func(error) error) {
	r := b.reach
	if r == nil {
		return ctx, withCause
	}
	cctx, cancel := context.WithCancelCause(ctx)
	key := new(int)
	r.mu.Lock()
	if err := r.downLocked(); err != nil {
		r.mu.Unlock()
		b.pingInBackground()
		cancel(err)
		return cctx, func(error) error { return err }
	}
	if r.waiting == nil {
		r.waiting = make(map[*int]context.CancelCauseFunc)
	}
	r.waiting[key] = cancel
	r.mu.Unlock()
	return cctx, func(err error) error {
		r.mu.Lock()
		delete(r.waiting, key)
		r.mu.Unlock()
		cause := context.Cause(cctx)
		cancel(nil)
		var ue *UnreachableError
		if err != nil && errors.As(cause, &ue) && ctx.Err() == nil {
			return ue
		}
		return withCause(err)
	}
}

// probeTimeout bounds the background ping of a deployment that is down.
const probeTimeout = 5 * time.Second

// pingInBackground pings the deployment in the background (one ping at a time), so
// that the driver's server selection keeps asking its monitor to check.
func (b *Backend) pingInBackground() {
	r := b.reach
	r.mu.Lock()
	if r.probing {
		r.mu.Unlock()
		return
	}
	r.probing = true
	r.mu.Unlock()
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if b.closed.Load() {
		r.mu.Lock()
		r.probing = false
		r.mu.Unlock()
		return
	}
	b.bg.Add(1)
	go func() {
		defer b.bg.Done()
		ctx, cancel := context.WithTimeout(b.life, probeTimeout)
		defer cancel()
		_ = b.client.Ping(ctx, nil)
		r.mu.Lock()
		r.probing = false
		r.mu.Unlock()
	}()
}

// withCause adds to a server-selection error the failures the driver
// recorded for its servers (a refused connection, a timeout), so that
// errors.Is finds them: the driver's error wraps only the context's
// error or its own timeout.
func withCause(err error) error {
	var sse topology.ServerSelectionError
	if err == nil || !errors.As(err, &sse) {
		return err
	}
	var causes []error
	for _, s := range sse.Desc.Servers {
		if s.LastError != nil {
			causes = append(causes, s.LastError)
		}
	}
	if len(causes) == 0 {
		return err
	}
	return &causedError{err: err, causes: causes}
}

// causedError is a driver error and the failures behind it.
type causedError struct {
	err    error
	causes []error
}

func (e *causedError) Error() string { return e.err.Error() }

func (e *causedError) Unwrap() []error { return append([]error{e.err}, e.causes...) }
