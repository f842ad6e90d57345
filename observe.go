package fencelock

import (
	"context"
	"log/slog"
	"time"
)

// EventKind names a lifecycle event of the engine.
type EventKind int

// The engine's events. Each has a stable name (String) used as the log
// message suffix and by the metrics adapters.
const (
	// EventAcquired: a lease was acquired. Wait is the time from the call
	// to the grant; Contended says whether the key was found held by
	// someone else at least once.
	EventAcquired EventKind = iota + 1
	// EventNotAcquired: TryAcquire found the key held (Err is the
	// *HeldError).
	EventNotAcquired
	// EventAcquireFailed: Acquire or TryAcquire gave up: its context ended
	// or the backend failed (Err). Wait is the time spent.
	EventAcquireFailed
	// EventAcquireRetry: an attempt inside a waiting Acquire failed
	// transiently (Err) and will be retried.
	EventAcquireRetry
	// EventRenewed: a renewal succeeded. Latency is its round trip.
	EventRenewed
	// EventRenewFailed: a renewal failed. Definite is true when the store
	// answered and the lease is lost next ("not yours", a token that went
	// back, or an answer that came after the lease's local validity had
	// ended); otherwise it is retried.
	EventRenewFailed
	// EventRotated: a renewal issued a new token (Token), replacing
	// Previous.
	EventRotated
	// EventDanger: renewals have been failing and less than one
	// RenewInterval of local validity is left (Remaining).
	EventDanger
	// EventLost: the lease ended without Release. Err is the *LostError;
	// Held is how long it had been held.
	EventLost
	// EventReleased: the lease was released. Held is how long it was held.
	EventReleased
	// EventReleaseFailed: the store could not be told of a release (Err);
	// the record expires with its TTL, or a retried Release removes it.
	EventReleaseFailed
	// EventCleanupFailed: removing what an abandoned acquire or a lost
	// lease may have left in the store failed (Err); it expires with its
	// TTL.
	EventCleanupFailed
	// EventFenceRejected: a Fence refused a write: Token is the refused
	// token, Previous the highest the resource had accepted; Key is the
	// resource.
	EventFenceRejected
	// EventWaiting: a blocking Acquire found the key held by someone else
	// and waits for it: once per call, at its first refusal (Err is the
	// refusal, usually a *HeldError naming the holder).
	EventWaiting
)

var eventNames = [...]string{
	EventAcquired:      "acquired",
	EventNotAcquired:   "not_acquired",
	EventAcquireFailed: "acquire_failed",
	EventAcquireRetry:  "acquire_retry",
	EventRenewed:       "renewed",
	EventRenewFailed:   "renew_failed",
	EventRotated:       "token_rotated",
	EventDanger:        "danger_zone",
	EventLost:          "lost",
	EventReleased:      "released",
	EventReleaseFailed: "release_failed",
	EventCleanupFailed: "cleanup_failed",
	EventFenceRejected: "fence_rejected",
	EventWaiting:       "waiting",
}

// String returns the event's stable snake_case name, e.g. "renew_failed".
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Level is the slog level the engine logs the event at: lost leases and
// fence rejections at Error; failures, retries and the danger zone at Warn;
// routine events at Debug.
func (k EventKind) Level() slog.Level {
	switch k {
	case EventLost, EventFenceRejected:
		return slog.LevelError
	case EventAcquireFailed, EventAcquireRetry, EventRenewFailed, EventDanger, EventReleaseFailed, EventCleanupFailed:
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// Level is the slog level the engine logs this event at: its kind's level,
// raised to Warn for a release that found the lease already gone from the
// store (work done under it may not have been exclusive).
func (e Event) Level() slog.Level {
	if e.Kind == EventReleased && e.Err != nil {
		return slog.LevelWarn
	}
	return e.Kind.Level()
}

// Event is one lifecycle event. Fields that do not apply to the Kind are
// zero.
type Event struct {
	Kind EventKind
	// Backend is the backend's name ("postgres", "memory", …).
	Backend string
	// Key is the lock key (for EventFenceRejected, the fenced resource).
	Key string
	// Owner is the lease's owner string.
	Owner string
	// Token is the lease's token (after the event).
	Token Token
	// Previous is the token before a rotation, or the highest accepted
	// token for a fence rejection.
	Previous Token
	// Wait is how long an acquire took or waited.
	Wait time.Duration
	// Contended reports an acquire (acquired or failed) that found the key
	// held at least once.
	Contended bool
	// Latency is a renewal's or release's round trip.
	Latency time.Duration
	// Held is how long a released or lost lease was held.
	Held time.Duration
	// Remaining is the local validity left at a danger-zone event.
	Remaining time.Duration
	// Definite marks a renewal the store answered that ends the lease
	// (not a transient failure).
	Definite bool
	// Err is the error or cause, if any.
	Err error
}

// Observer receives every lifecycle event of a Client (and of a Fence that
// has one), identically for every backend, so dashboards do not change when
// the backend does. Observe is called synchronously from the engine's
// goroutines, possibly concurrently: it must be safe for concurrent use and
// return quickly. The metrics adapters (observe/prometheus,
// observe/otel) implement it.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// listens reports whether ev would reach anyone: the Observer, or the
// Logger at ev's level.
func (c *Client) listens(ev Event) bool {
	return c.o.Observer != nil || c.o.Logger != nil && c.o.Logger.Enabled(context.Background(), ev.Level())
}

// emit delivers ev to the observer and the logger.
func (c *Client) emit(ev Event) {
	ev.Backend = c.name
	if c.o.Observer != nil {
		c.o.Observer.Observe(ev)
	}
	logEvent(c.o.Logger, ev)
}

func logEvent(lg *slog.Logger, ev Event) {
	if lg == nil {
		return
	}
	lvl := ev.Level()
	ctx := context.Background()
	if !lg.Enabled(ctx, lvl) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	attrs = append(attrs, slog.String("backend", ev.Backend), slog.String("key", ev.Key))
	if ev.Owner != "" {
		attrs = append(attrs, slog.String("owner", ev.Owner))
	}
	if ev.Token != 0 {
		attrs = append(attrs, slog.Uint64("token", uint64(ev.Token)))
	}
	if ev.Previous != 0 {
		attrs = append(attrs, slog.Uint64("previous", uint64(ev.Previous)))
	}
	if ev.Wait != 0 {
		attrs = append(attrs, slog.Duration("wait", ev.Wait))
	}
	if ev.Contended {
		attrs = append(attrs, slog.Bool("contended", true))
	}
	if ev.Latency != 0 {
		attrs = append(attrs, slog.Duration("latency", ev.Latency))
	}
	if ev.Held != 0 {
		attrs = append(attrs, slog.Duration("held", ev.Held))
	}
	if ev.Remaining != 0 {
		attrs = append(attrs, slog.Duration("remaining", ev.Remaining))
	}
	if ev.Definite {
		attrs = append(attrs, slog.Bool("definite", true))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.Any("err", ev.Err))
	}
	lg.LogAttrs(ctx, lvl, "fencelock: "+ev.Kind.String(), attrs...)
}
