package recipe_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"go.uber.org/goleak"
)

// The recipes' tests use the same programmable memory store as the
// engine's (a copy of the root package's test helpers: a test package
// cannot import another's).

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newClient(t *testing.T, b driver.Backend, o *fencelock.Options) *fencelock.Client {
	t.Helper()
	c, err := fencelock.New(b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// plain hides the memory backend's optional capabilities.
type plain struct{ driver.Backend }

const boundSlack = time.Second

// refused is the error of a store with nothing listening on its port.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// silent makes a request hang until its context ends, as a store that
// stopped answering (SIGSTOPped, or behind a proxy that stopped
// forwarding) does.
func silent(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// refusing makes a request fail at once, as a store that refuses
// connections does.
func refusing(context.Context) error { return refused }

// slow makes a request answer after d (or fail when its context ends
// first).
func slow(d time.Duration) func(context.Context) error {
	return func(ctx context.Context) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// faulty is a memory backend (its optional capabilities hidden: waits
// poll) whose requests run a programmed fault first: by operation
// ("acquire", "renew", "release", "inspect", "list", "wait"), a function
// that may block or fail the request. lateAcquire, if set, runs after an
// Acquire has been applied, before its answer: a store that applied the
// request and whose reply is late or lost. letGo ends every fault's wait,
// so that a test whose call hung can end.
type faulty struct {
	driver.Backend
	mu          sync.Mutex
	faults      map[string]func(context.Context) error
	lateAcquire func(context.Context) error
	gone        context.Context // ended by letGo
	letGo       context.CancelFunc
}

func newFaulty(store *memory.Store) *faulty {
	f := &faulty{Backend: store.Backend(), faults: make(map[string]func(context.Context) error)}
	f.gone, f.letGo = context.WithCancel(context.Background())
	return f
}

// run runs fault on a context that ctx's end or letGo ends.
func (f *faulty) run(ctx context.Context, fault func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(f.gone, cancel)()
	return fault(ctx)
}

// set programs op's fault (nil: none).
func (f *faulty) set(op string, fault func(context.Context) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[op] = fault
}

// setAll programs the fault of every operation.
func (f *faulty) setAll(fault func(context.Context) error) {
	for _, op := range []string{"acquire", "renew", "release", "inspect", "list", "wait"} {
		f.set(op, fault)
	}
}

func (f *faulty) setLate(fault func(context.Context) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lateAcquire = fault
}

func (f *faulty) fault(ctx context.Context, op string) error {
	f.mu.Lock()
	fault := f.faults[op]
	f.mu.Unlock()
	if fault == nil {
		return nil
	}
	return f.run(ctx, fault)
}

func (f *faulty) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := f.fault(ctx, "acquire"); err != nil {
		return driver.Grant{}, err
	}
	g, err := f.Backend.Acquire(ctx, req)
	f.mu.Lock()
	late := f.lateAcquire
	f.mu.Unlock()
	if err == nil && late != nil {
		if err := f.run(ctx, late); err != nil {
			return driver.Grant{}, err
		}
	}
	return g, err
}

func (f *faulty) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := f.fault(ctx, "renew"); err != nil {
		return driver.Grant{}, err
	}
	return f.Backend.Renew(ctx, g, req)
}

func (f *faulty) Release(ctx context.Context, g driver.Grant) error {
	if err := f.fault(ctx, "release"); err != nil {
		return err
	}
	return f.Backend.Release(ctx, g)
}

func (f *faulty) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := f.fault(ctx, "inspect"); err != nil {
		return driver.Info{}, err
	}
	return f.Backend.Inspect(ctx, key)
}

func (f *faulty) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := f.fault(ctx, "list"); err != nil {
		return nil, err
	}
	return f.Backend.List(ctx, prefix)
}

// faultyQueue is faulty with a queue (a driver.Waiter, as etcd and
// ZooKeeper are): AcquireWait runs the "wait" fault, then takes the key
// as soon as it is free, until its context ends.
type faultyQueue struct{ *faulty }

func (q faultyQueue) AcquireWait(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := q.fault(ctx, "wait"); err != nil {
		return driver.Grant{}, err
	}
	for {
		g, err := q.faulty.Acquire(ctx, req)
		if !errors.Is(err, driver.ErrNotAcquired) {
			return g, err
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return driver.Grant{}, ctx.Err()
		}
	}
}

// boundOpts are the options of the bound tests: a TTL long enough that
// one TTL, two overrun budgets and the slack are told apart.
func boundOpts() *fencelock.Options {
	return &fencelock.Options{TTL: 15 * time.Second, ReleaseTimeout: 2 * time.Second}
}

// within runs call and reports how long it took. If it has not returned
// by bound plus boundSlack, b's hanging requests are let go, c is closed
// to end the call, and the test fails.
func within(t *testing.T, b *faulty, c *fencelock.Client, bound time.Duration, what string, call func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		call()
	}()
	timer := time.NewTimer(bound + boundSlack)
	defer timer.Stop()
	select {
	case <-done:
		return time.Since(start)
	case <-timer.C:
		took := time.Since(start)
		b.letGo()
		c.Close()
		<-done
		t.Fatalf("%s has not returned after %v; its bound is %v", what, took, bound)
		return 0
	}
}
