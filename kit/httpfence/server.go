package httpfence

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/fencelock/fencelock"
)

// Checker applies the fencing rule to a write of resource carrying token
// from holder, and records an accepted one: nil if accepted, an error
// matching fencelock.ErrStaleToken if refused, any other error if it could
// not tell. *fencelock.Fence is a Checker; so can a kit over a store be.
type Checker interface {
	Check(resource string, token fencelock.Token, holder string) error
}

// ContextChecker is a Checker that can also take the request's context,
// as a kit's checker over a store can (kit/postgres's Checker): Middleware
// calls CheckContext, with the request's context, instead of Check when
// its Checker has it, so that a check is abandoned when its client goes
// away.
type ContextChecker interface {
	Checker
	CheckContext(ctx context.Context, resource string, token fencelock.Token, holder string) error
}

// check asks c, with ctx if it takes one.
func check(ctx context.Context, c Checker, resource string, token fencelock.Token, holder string) error {
	if cc, ok := c.(ContextChecker); ok {
		return cc.CheckContext(ctx, resource, token, holder)
	}
	return c.Check(resource, token, holder)
}

// Middleware returns a handler that fences the requests resourceOf names a
// resource for, and hands the rest to next as they are (resourceOf
// returns "" for a request that writes nothing fenced, a GET say).
//
// A fenced request must carry exactly one Fencing-Token header, a decimal
// integer (0 to 2^64-1), and one non-empty Fencing-Holder header, or it is
// answered 400 Bad Request. Then, holding the resource's lock (see the
// package documentation), Middleware asks c to check it (with the request's
// context, if c is a ContextChecker): refused, it is
// answered 409 Conflict with the error's text, HeaderHighest and
// HeaderResource (Refusal reads them); if c fails otherwise, 503 Service
// Unavailable (nothing is written; the error's text is not sent, as it
// may describe the store); accepted, next serves it before the lock is
// released. A request whose context ends while it waits for the lock is
// answered 503 without being checked.
func Middleware(c Checker, resourceOf func(*http.Request) string, next http.Handler) http.Handler {
	return &middleware{c: c, resourceOf: resourceOf, next: next, serialize: true}
}

type middleware struct {
	c          Checker
	resourceOf func(*http.Request) string
	next       http.Handler
	serialize  bool // hold the resource's lock across check and next
	locks      keyed
}

// keyed is a lock per resource; a resource's entry lives while someone
// holds or waits for it.
type keyed struct {
	mu     sync.Mutex
	m      map[string]*keyLock
	onWait func(key string) // tests: called when lock must wait
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	res := m.resourceOf(r)
	if res == "" {
		m.next.ServeHTTP(w, r)
		return
	}
	token, holder, msg := fencing(r)
	if msg != "" {
		http.Error(w, msg, http.StatusBadRequest)
		return
	}
	if m.serialize {
		unlock, err := m.locks.lock(r, res)
		if err != nil {
			http.Error(w, "httpfence: gave up waiting for an earlier fenced request to the same resource: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer unlock()
	}
	if err := check(r.Context(), m.c, res, token, holder); err != nil {
		if !errors.Is(err, fencelock.ErrStaleToken) {
			http.Error(w, "httpfence: the fencing check failed, so nothing was written; retry later", http.StatusServiceUnavailable)
			return
		}
		var se *fencelock.StaleTokenError
		if errors.As(err, &se) {
			w.Header().Set(HeaderHighest, strconv.FormatUint(uint64(se.Highest), 10))
		} else {
			w.Header().Set(HeaderHighest, "")
		}
		w.Header().Set(HeaderResource, res)
		w.Header().Set(HeaderToken, strconv.FormatUint(uint64(token), 10))
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	m.next.ServeHTTP(w, r)
}

// fencing reads the request's token and holder; msg says what is wrong
// with them, if anything.
func fencing(r *http.Request) (token fencelock.Token, holder, msg string) {
	toks, holders := r.Header.Values(HeaderToken), r.Header.Values(HeaderHolder)
	switch {
	case len(toks) == 0:
		return 0, "", "httpfence: missing " + HeaderToken + " header: send the lease's token with the write (httpfence.Transport adds it)"
	case len(toks) > 1:
		return 0, "", fmt.Sprintf("httpfence: %d %s headers; send exactly one", len(toks), HeaderToken)
	case len(holders) == 0 || holders[0] == "":
		return 0, "", "httpfence: missing " + HeaderHolder + " header: send the lease's Owner with the write (httpfence.Transport adds it)"
	case len(holders) > 1:
		return 0, "", fmt.Sprintf("httpfence: %d %s headers; send exactly one", len(holders), HeaderHolder)
	}
	t, err := strconv.ParseUint(toks[0], 10, 64)
	if err != nil {
		return 0, "", "httpfence: malformed " + HeaderToken + " header: want a decimal integer from 0 to 18446744073709551615, as strconv.FormatUint writes the lease's Token"
	}
	return fencelock.Token(t), holders[0], ""
}

type keyLock struct {
	ch   chan struct{} // holds one token while locked
	refs int
}

// lock locks key, waiting no longer than r's context.
func (k *keyed) lock(r *http.Request, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	unlock = func() { <-l.ch; release() }
	select {
	case l.ch <- struct{}{}:
		return unlock, nil
	default:
	}
	if k.onWait != nil {
		k.onWait(key)
	}
	select {
	case l.ch <- struct{}{}:
		return unlock, nil
	case <-r.Context().Done():
		release()
		return nil, r.Context().Err()
	}
}
