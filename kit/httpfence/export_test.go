package httpfence

import "net/http"

// NewMiddleware is Middleware with its test hooks: serialize false drops
// the per-resource lock across check and handler (the check-then-write
// defect the lock prevents); onWait, if set, is called when a request
// must wait for the lock.
func NewMiddleware(c Checker, resourceOf func(*http.Request) string, next http.Handler, serialize bool, onWait func(resource string)) http.Handler {
	m := &middleware{c: c, resourceOf: resourceOf, next: next, serialize: serialize}
	m.locks.onWait = onWait
	return m
}
