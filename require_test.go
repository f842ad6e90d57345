package fencelock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
)

// requireClosed counts Closes of backends opened through require-test://.
var requireClosed atomic.Int64

func init() {
	fencelock.Register("require-test", func(ctx context.Context, u *url.URL) (fencelock.Backend, error) {
		// A memory backend (a Guarantor) whose Close is counted.
		mb := memory.New()
		f := fakebackend.New(mb, fakebackend.CapsOf(mb))
		f.OnClose(func(next func() error) error {
			requireClosed.Add(1)
			return next()
		})
		return f.Backend(), nil
	})
}

const requireSecret = "Sup3rS3cret"

// TestOpenRefusesUnmetGuaranteesNamingEachAndClosesBackend checks that
// Open and OpenBackend refuse a store that does not meet what require=
// names, with an *UnmetGuaranteeError (ErrGuaranteeUnmet) that lists each
// unmet guarantee with what was observed and how to meet it, leaves out
// the met ones, closes the backend and shows no secret of the URL.
func TestOpenRefusesUnmetGuaranteesNamingEachAndClosesBackend(t *testing.T) {
	ctx := context.Background()
	raw := "require-test://app:" + requireSecret + "@h/x?require=durable-tokens,server-clock,failover"
	for name, open := range map[string]func() error{
		"Open": func() error {
			c, err := fencelock.Open(ctx, raw, nil)
			if err == nil {
				c.Close()
			}
			return err
		},
		"OpenBackend": func() error {
			b, _, err := fencelock.OpenBackend(ctx, raw)
			if err == nil {
				b.Close()
			}
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			before := requireClosed.Load()
			err := open()
			if !errors.Is(err, fencelock.ErrGuaranteeUnmet) {
				t.Fatalf("err = %v; want ErrGuaranteeUnmet", err)
			}
			var ue *driver.UnmetGuaranteeError
			if !errors.As(err, &ue) {
				t.Fatalf("err = %T; want *UnmetGuaranteeError", err)
			}
			var got []fencelock.Guarantee
			for _, r := range ue.Unmet {
				got = append(got, r.Guarantee)
				if r.Met || r.Observed == "" || r.Fix == "" {
					t.Errorf("unmet %s: %+v; want Met false with Observed and Fix", r.Guarantee, r)
				}
			}
			if len(got) != 2 || got[0] != fencelock.DurableTokens || got[1] != fencelock.Failover {
				t.Errorf("unmet = %v; want [durable-tokens failover] (server-clock is met by the memory store)", got)
			}
			msg := err.Error()
			for _, want := range []string{"durable-tokens: memory backend", "failover: memory backend", "use a store outside the process"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not say %q", msg, want)
				}
			}
			if strings.Contains(msg, requireSecret) {
				t.Errorf("error shows the URL's password: %q", msg)
			}
			if n := requireClosed.Load() - before; n != 1 {
				t.Errorf("backend closed %d times after the refused open; want 1", n)
			}
		})
	}
}

// TestOpenAcceptsMetGuarantees checks that a store meeting every required
// guarantee opens, and that Options.Require and require= are both
// required (their union).
func TestOpenAcceptsMetGuarantees(t *testing.T) {
	ctx := context.Background()
	c, err := fencelock.Open(ctx, "mem://require-met?require=server-clock,pushed-loss,fenced-semaphores", nil)
	if err != nil {
		t.Fatalf("Open with guarantees the memory store meets: %v", err)
	}
	c.Close()
	_, err = fencelock.Open(ctx, "mem://require-met?require=server-clock", &fencelock.Options{Require: []fencelock.Guarantee{fencelock.FIFO}})
	var ue *driver.UnmetGuaranteeError
	if !errors.As(err, &ue) || len(ue.Unmet) != 1 || ue.Unmet[0].Guarantee != fencelock.FIFO {
		t.Fatalf("Open with require=server-clock and Options.Require fifo: %v; want only fifo unmet", err)
	}
}

// TestRequireUnknownGuaranteeSaysDidYouMean checks that a misspelt
// guarantee, in the URL or in Options.Require, is an *InvalidOptionError
// naming the one meant.
func TestRequireUnknownGuaranteeSaysDidYouMean(t *testing.T) {
	ctx := context.Background()
	_, err := fencelock.Open(ctx, "mem://x?require=durabel-tokens", nil)
	if !errors.Is(err, fencelock.ErrInvalidOption) || !strings.Contains(err.Error(), "did you mean durable-tokens?") {
		t.Errorf("require=durabel-tokens: %v; want ErrInvalidOption saying did you mean durable-tokens?", err)
	}
	err = (&fencelock.Options{Require: []fencelock.Guarantee{"failovr"}}).Validate()
	if !errors.Is(err, fencelock.ErrInvalidOption) || !strings.Contains(err.Error(), "did you mean failover?") {
		t.Errorf("Options.Require failovr: %v; want ErrInvalidOption saying did you mean failover?", err)
	}
}

// TestNewRequireJudgesUnmeasuredGuaranteesByCapability checks New on a
// backend that measures nothing: fifo and pushed-loss follow its
// interfaces, durable-tokens is unknown and so not met.
func TestNewRequireJudgesUnmeasuredGuaranteesByCapability(t *testing.T) {
	f := fakebackend.New(memory.New(), fakebackend.Waiter)
	c, err := fencelock.New(f.Backend(), &fencelock.Options{Require: []fencelock.Guarantee{fencelock.FIFO}})
	if err != nil {
		t.Fatalf("fifo on a driver.Waiter: %v", err)
	}
	c.Close()
	plain := fakebackend.New(memory.New(), fakebackend.Plain).Backend()
	_, err = fencelock.New(plain, &fencelock.Options{Require: []fencelock.Guarantee{fencelock.DurableTokens, fencelock.PushedLoss, fencelock.FIFO}})
	var ue *driver.UnmetGuaranteeError
	if !errors.As(err, &ue) || len(ue.Unmet) != 3 {
		t.Fatalf("New on a plain backend: %v; want durable-tokens, pushed-loss and fifo unmet", err)
	}
	if !strings.Contains(ue.Unmet[0].Observed, "unknown") {
		t.Errorf("durable-tokens on a backend that measures nothing: %q; want it called unknown", ue.Unmet[0].Observed)
	}
	plain.Close()
}
