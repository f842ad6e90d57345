package fencelock

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/fencelock/fencelock/driver"
)

// idleBackend is a Backend that is never called: a Client for a lane
// driven directly.
type idleBackend struct{}

func (idleBackend) Acquire(context.Context, driver.AcquireRequest) (driver.Grant, error) {
	return driver.Grant{}, driver.ErrUnsupported
}
func (idleBackend) Renew(context.Context, driver.Grant, driver.RenewRequest) (driver.Grant, error) {
	return driver.Grant{}, driver.ErrNotHeld
}
func (idleBackend) Release(context.Context, driver.Grant) error          { return driver.ErrNotHeld }
func (idleBackend) Inspect(context.Context, string) (driver.Info, error) { return driver.Info{}, nil }
func (idleBackend) List(context.Context, string) ([]driver.Info, error)  { return nil, nil }
func (idleBackend) Close() error                                         { return nil }

// A call whose member left its batch in flight retries with the same
// owner. The retry must not reach the store before the batch's answer
// has been dealt with, even when a place in flight is free: sent beside
// it, the store would grant the retry the same record (same owner, same
// token), and the release of the left member's late grant would then
// remove that record under the retry's live lease. The retry waits in
// the queue, and once the batch is back the late grant is left to it,
// not released.
func TestRetryOfLeftMemberWaitsForItsBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := New(idleBackend{}, &Options{NoCoalesce: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var (
			mu       sync.Mutex
			sentKeys []string // single requests in the order sent
			released []string // late grants released
		)
		gates := map[string]chan struct{}{"x": make(chan struct{}), "y": make(chan struct{}), "z": make(chan struct{})}
		batchGate := make(chan struct{})
		l := &lane[driver.AcquireRequest, driver.Grant]{
			c:   c,
			key: func(r driver.AcquireRequest) string { return r.Key },
			single: func(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
				mu.Lock()
				sentKeys = append(sentKeys, r.Key)
				g := gates[r.Key]
				mu.Unlock()
				if g != nil {
					<-g
				}
				return driver.Grant{Key: r.Key, Owner: r.Owner, Token: 1}, nil
			},
			batch: func(ctx context.Context, rs []driver.AcquireRequest) ([]driver.Grant, []error, error) {
				<-batchGate
				gs := make([]driver.Grant, len(rs))
				for i, r := range rs {
					gs[i] = driver.Grant{Key: r.Key, Owner: r.Owner, Token: 1}
				}
				return gs, make([]error, len(rs)), nil
			},
			late: func(r driver.AcquireRequest, g driver.Grant, err error) {
				mu.Lock()
				released = append(released, r.Key)
				mu.Unlock()
			},
			owner: func(r driver.AcquireRequest) string { return r.Owner },
		}
		req := func(key, owner string) driver.AcquireRequest {
			return driver.AcquireRequest{Key: key, Owner: owner}
		}
		type answer struct {
			key string
			err error
		}
		out := make(chan answer, 8)
		call := func(ctx context.Context, r driver.AcquireRequest) {
			go func() {
				_, err := l.do(ctx, r)
				out <- answer{r.Key, err}
			}()
		}
		// x and y take both places in flight; a and b queue.
		call(t.Context(), req("x", "ox"))
		call(t.Context(), req("y", "oy"))
		synctest.Wait()
		actx, cancel := context.WithCancel(t.Context())
		call(actx, req("a", "oa"))
		call(t.Context(), req("b", "ob"))
		synctest.Wait()
		// x returns: a and b go as one batch, held in flight.
		close(gates["x"])
		if a := <-out; a.key != "x" || a.err != nil {
			t.Fatalf("x: %+v", a)
		}
		synctest.Wait()
		// y returns: a place is free. a's caller gives up: it left.
		close(gates["y"])
		if a := <-out; a.key != "y" || a.err != nil {
			t.Fatalf("y: %+v", a)
		}
		cancel()
		if a := <-out; a.key != "a" || a.err == nil {
			t.Fatalf("a, left in flight: %+v; want its context's error", a)
		}
		// a's call retries with the same owner. Then z takes the free
		// place and returns: the lane's next turn must not send the
		// retry either.
		call(t.Context(), req("a", "oa"))
		synctest.Wait()
		call(t.Context(), req("z", "oz"))
		synctest.Wait()
		close(gates["z"])
		if a := <-out; a.key != "z" || a.err != nil {
			t.Fatalf("z: %+v", a)
		}
		synctest.Wait()
		mu.Lock()
		early := slices.Contains(sentKeys, "a")
		mu.Unlock()
		if early {
			t.Fatalf("the retry of a left member was sent (%v) while its batch was in flight", sentKeys)
		}
		close(batchGate)
		got := map[string]error{}
		for range 2 {
			a := <-out
			got[a.key] = a.err
		}
		if got["a"] != nil || got["b"] != nil {
			t.Fatalf("after the batch: %v", got)
		}
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(released) != 0 {
			t.Errorf("the left member's late grant was released (%v) though its retry came for it", released)
		}
		if len(sentKeys) != 4 || !slices.Equal(sentKeys[2:], []string{"z", "a"}) {
			t.Errorf("single requests %v; want x and y, then z, then a (the retry, after the batch)", sentKeys)
		}
	})
}
