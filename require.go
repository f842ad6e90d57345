package fencelock

import (
	"context"
	"errors"
	"strings"

	"github.com/fencelock/fencelock/driver"
)

// Guarantee names a property a deployment may require of its store
// (Options.Require, the URL parameter require=): see the constants below
// and docs/deploying.md.
type Guarantee = driver.Guarantee

// The guarantees Options.Require may name (documented in package driver,
// where they are listed once).
const (
	DurableTokens    = driver.DurableTokens
	Failover         = driver.Failover
	ServerClock      = driver.ServerClock
	PushedLoss       = driver.PushedLoss
	FIFO             = driver.FIFO
	FencedSemaphores = driver.FencedSemaphores
)

// ErrGuaranteeUnmet is matched (errors.Is) by every *UnmetGuaranteeError:
// the store does not meet a guarantee the deployment requires.
var ErrGuaranteeUnmet = errors.New("fencelock: required guarantee not met")

// GuaranteeResult is the verdict on one guarantee: what the backend
// measured about the live server.
type GuaranteeResult struct {
	// Guarantee is the guarantee judged.
	Guarantee Guarantee `json:"guarantee"`
	// Met reports whether it holds as deployed; unknown is not met.
	Met bool `json:"met"`
	// Observed is the configuration the verdict rests on.
	Observed string `json:"observed"`
	// Fix is the setting that would meet it; empty when Met.
	Fix string `json:"fix,omitempty"`
}

// UnmetGuaranteeError reports that a store does not meet one or more
// guarantees of Options.Require. It matches ErrGuaranteeUnmet. Open and
// OpenBackend close the backend before returning it.
type UnmetGuaranteeError struct {
	// Backend is the backend's name (Description.Name).
	Backend string
	// Unmet lists each unmet guarantee, in the order required, with what
	// was observed and the setting that would meet it.
	Unmet []GuaranteeResult
}

// Error implements error: one clause per unmet guarantee, "name: observed;
// fix".
func (e *UnmetGuaranteeError) Error() string {
	var b strings.Builder
	b.WriteString("fencelock: the ")
	b.WriteString(e.Backend)
	b.WriteString(" backend does not meet the required guarantees: ")
	for i, r := range e.Unmet {
		if i > 0 {
			b.WriteString(" | ")
		}
		b.WriteString(string(r.Guarantee))
		b.WriteString(": ")
		b.WriteString(r.Observed)
		if r.Fix != "" {
			b.WriteString("; ")
			b.WriteString(r.Fix)
		}
	}
	return b.String()
}

// Is reports whether target is ErrGuaranteeUnmet.
func (e *UnmetGuaranteeError) Is(target error) bool { return target == ErrGuaranteeUnmet }

// CheckGuarantees measures each guarantee of require on b's live server
// (driver.Guarantor, then what b's interfaces show) and returns one
// result per guarantee, in order. The error is an *InvalidOptionError for
// an unknown name, or the backend's failure to measure (the server could
// not be reached); an unmet guarantee is a result with Met false, not an
// error (see RequireGuarantees).
func CheckGuarantees(ctx context.Context, b Backend, require []Guarantee) ([]GuaranteeResult, error) {
	for _, g := range require {
		if err := driver.CheckGuarantee("Require", g); err != nil {
			return nil, err
		}
	}
	if len(require) == 0 {
		return nil, nil
	}
	measured := map[Guarantee]driver.Measurement{}
	if gr, ok := b.(driver.Guarantor); ok {
		m, err := gr.Guarantees(ctx)
		if err != nil {
			return nil, err
		}
		measured = m
	}
	name := backendName(b)
	out := make([]GuaranteeResult, 0, len(require))
	for _, g := range require {
		m, ok := measured[g]
		if !ok {
			m = structural(b, name, g)
		}
		r := GuaranteeResult{Guarantee: g, Met: m.Met, Observed: m.Observed, Fix: m.Fix}
		if r.Met {
			r.Fix = ""
		}
		out = append(out, r)
	}
	return out, nil
}

// RequireGuarantees returns nil if b meets every guarantee of require, an
// *UnmetGuaranteeError naming each one it does not, or the error of
// CheckGuarantees. It does not close b.
func RequireGuarantees(ctx context.Context, b Backend, require []Guarantee) error {
	rs, err := CheckGuarantees(ctx, b, require)
	if err != nil {
		return err
	}
	var unmet []GuaranteeResult
	for _, r := range rs {
		if !r.Met {
			unmet = append(unmet, r)
		}
	}
	if len(unmet) == 0 {
		return nil
	}
	return &UnmetGuaranteeError{Backend: backendName(b), Unmet: unmet}
}

func backendName(b Backend) string {
	if d, ok := b.(driver.Describer); ok {
		if n := d.Describe().Name; n != "" {
			return n
		}
	}
	return "backend"
}

// structural judges a guarantee the backend did not measure, from what its
// type offers.
func structural(b Backend, name string, g Guarantee) driver.Measurement {
	switch g {
	case FIFO:
		if _, ok := b.(driver.Waiter); ok {
			return driver.Measurement{Met: true, Observed: name + " queues waiters in the store (driver.Waiter)"}
		}
		return driver.Measurement{Observed: name + " has no queue in the store: waiters poll or are woken and race on each release",
			Fix: "use a backend that queues waiters: etcd or ZooKeeper"}
	case PushedLoss:
		if _, ok := b.(driver.LossNotifier); ok {
			return driver.Measurement{Met: true, Observed: name + " pushes loss to the holder (driver.LossNotifier)"}
		}
		return driver.Measurement{Observed: name + " tells a holder of loss only when a renewal is refused",
			Fix: "use a backend that pushes loss: etcd or ZooKeeper"}
	case FencedSemaphores:
		return driver.Measurement{Met: true, Observed: "fencelock.Semaphore: each permit is a lease on its slot key, with that slot's fencing token"}
	}
	return driver.Measurement{Observed: name + " does not measure " + string(g) + " on its server (no driver.Guarantor report): unknown",
		Fix: "use a backend that measures it (postgres, redis, etcd, zk, mongodb, file, mem)"}
}

// checkRequire validates names for Options.Validate.
func checkRequire(require []Guarantee) error {
	for _, g := range require {
		if err := driver.CheckGuarantee("Require", g); err != nil {
			return err
		}
	}
	return nil
}

// mergeRequire returns the union of a and b, a's order first.
func mergeRequire(a, b []Guarantee) []Guarantee {
	out := append([]Guarantee(nil), a...)
	for _, g := range b {
		seen := false
		for _, h := range out {
			seen = seen || g == h
		}
		if !seen {
			out = append(out, g)
		}
	}
	return out
}

// requireAtOpen checks o.Require on b within ctx, or, if ctx is nil,
// within Options.ReleaseTimeout (New takes no context).
func requireAtOpen(ctx context.Context, b Backend, o *Options) error {
	if len(o.Require) == 0 {
		return nil
	}
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), o.ReleaseTimeout)
		defer cancel()
	}
	return RequireGuarantees(ctx, b, o.Require)
}
