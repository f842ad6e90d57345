package recipe_test

import (
	"context"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	"go.uber.org/goleak"
)

// The recipes' tests run on the memory backend, through the project's
// programmable fake (internal/fakebackend) where a test hides
// capabilities or makes the store fail.

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

// plain returns b with its optional capabilities hidden: the bare
// driver.Backend, whose waits poll.
func plain(b driver.Backend) driver.Backend { return fakebackend.New(b, fakebackend.Plain).Backend() }

// newFaulty returns a programmable fake of store with its optional
// capabilities hidden (waits poll): its requests run the faults a test
// sets (Set, SetAll), and LetGo ends every fault's wait.
func newFaulty(store *memory.Store) *fakebackend.Fake {
	return fakebackend.New(store.Backend(), fakebackend.Plain)
}

const boundSlack = fakebackend.BoundSlack

// refused is the error of a store with nothing listening on its port.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// silent makes a request hang until its context ends, as a store that
// stopped answering (SIGSTOPped, or behind a proxy that stopped
// forwarding) does.
var silent = fakebackend.Silent

// refusing makes a request fail at once, as a store that refuses
// connections does.
var refusing = fakebackend.Fail(refused)

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

// slowStore returns a fake of b showing caps whose store calls (Acquire,
// Release, Inspect) answer after delay, a store's round trip (or fail
// when their context ends first).
func slowStore(b driver.Backend, caps fakebackend.Caps, delay time.Duration) *fakebackend.Fake {
	f := fakebackend.New(b, caps)
	for _, op := range []fakebackend.Op{fakebackend.Acquire, fakebackend.Release, fakebackend.Inspect} {
		f.Set(op, slow(delay))
	}
	return f
}

// boundOpts are the options of the bound tests: a TTL long enough that
// one TTL, two overrun budgets and the slack are told apart.
func boundOpts() *fencelock.Options {
	return &fencelock.Options{TTL: 15 * time.Second, ReleaseTimeout: 2 * time.Second}
}

// within is fakebackend.Within for a client under test.
func within(t *testing.T, b *fakebackend.Fake, c *fencelock.Client, bound time.Duration, what string, call func()) time.Duration {
	t.Helper()
	return fakebackend.Within(t, b, c, bound, what, call)
}
