package fencelock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// oneKeyStore: one key's record; an Acquire by its holder's owner returns
// the record it holds (the driver contract's retry rule).
type oneKeyStore struct {
	mu          sync.Mutex
	owner       string
	token, next driver.Token
	failRelease int
}

func (s *oneKeyStore) Acquire(_ context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owner != "" && s.owner != r.Owner {
		return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: r.Key, Owner: s.owner, Token: s.token}}
	}
	if s.owner == "" {
		s.next++
		s.owner, s.token = r.Owner, s.next
	}
	return driver.Grant{Key: r.Key, Owner: s.owner, Token: s.token}, nil
}
func (s *oneKeyStore) Renew(_ context.Context, g driver.Grant, _ driver.RenewRequest) (driver.Grant, error) {
	return g, nil
}
func (s *oneKeyStore) Release(_ context.Context, g driver.Grant) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failRelease > 0 {
		s.failRelease--
		return errors.New("injected: reply lost")
	}
	if g.Owner != s.owner || g.Token != s.token {
		return driver.ErrNotHeld
	}
	s.owner = ""
	return nil
}
func (s *oneKeyStore) Inspect(_ context.Context, key string) (driver.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return driver.Info{Key: key, Owner: s.owner, Token: s.token}, nil
}
func (s *oneKeyStore) List(context.Context, string) ([]driver.Info, error) { return nil, nil }
func (s *oneKeyStore) Close() error                                        { return nil }

// The grant of a member that left its batch in flight is given back
// (lateAcquired); if that release fails, nothing removes the record by
// owner later: the member's call retries under the same owner and adopts
// the record, and its lease must keep it.
func TestFailedLateReleaseNeverRemovesTheRetrysRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &oneKeyStore{}
		c, err := New(store, &Options{NoCoalesce: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		gates := map[string]chan struct{}{"x": make(chan struct{}), "y": make(chan struct{})}
		batchGate := make(chan struct{})
		l := &lane[driver.AcquireRequest, driver.Grant]{
			c:   c,
			key: func(r driver.AcquireRequest) string { return r.Key },
			single: func(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
				if g := gates[r.Key]; g != nil {
					<-g
					return driver.Grant{Key: r.Key, Owner: r.Owner, Token: 1}, nil
				}
				return store.Acquire(ctx, r)
			},
			batch: func(ctx context.Context, rs []driver.AcquireRequest) ([]driver.Grant, []error, error) {
				<-batchGate
				gs, errs := make([]driver.Grant, len(rs)), make([]error, len(rs))
				for i, r := range rs {
					if r.Key == "a" {
						gs[i], errs[i] = store.Acquire(ctx, r)
					} else {
						gs[i] = driver.Grant{Key: r.Key, Owner: r.Owner, Token: 1}
					}
				}
				return gs, errs, nil
			},
			late:  c.lateAcquired,
			owner: func(r driver.AcquireRequest) string { return r.Owner },
		}
		out := make(chan error, 8)
		call := func(ctx context.Context, key, owner string) {
			go func() { _, err := l.do(ctx, driver.AcquireRequest{Key: key, Owner: owner}); out <- err }()
		}
		call(t.Context(), "x", "ox")
		call(t.Context(), "y", "oy")
		synctest.Wait()
		actx, cancel := context.WithCancel(t.Context())
		call(actx, "a", "oa")
		call(t.Context(), "b", "ob")
		synctest.Wait()
		close(gates["x"])
		<-out
		synctest.Wait()
		close(gates["y"])
		<-out
		cancel() // a leaves its batch in flight: an unknown outcome
		if err := <-out; err == nil {
			t.Fatal("a: want its context's error")
		}
		store.mu.Lock()
		store.failRelease = 1 // the late grant's release fails once
		store.mu.Unlock()
		close(batchGate) // a's grant comes back late: released (fails), b answered
		<-out
		synctest.Wait()
		// a's call retries with the same owner (acquirePolling keeps it
		// after an ambiguous attempt) and adopts the record.
		g, err := l.do(t.Context(), driver.AcquireRequest{Key: "a", Owner: "oa"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // the retry's lease is valid for far longer
		synctest.Wait()
		info, _ := store.Inspect(t.Context(), "a")
		if info.Owner != "oa" || info.Token != g.Token {
			t.Fatalf("the retry's record (%+v) was removed while its lease holds: store %+v", g, info)
		}
	})
}
