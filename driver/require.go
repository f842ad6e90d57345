package driver

import (
	"context"
	"errors"
	"strings"
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
// guarantees a deployment requires (fencelock.Options.Require). It matches ErrGuaranteeUnmet. fencelock.Open and
// fencelock.OpenBackend close the backend before returning it.
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
// (Guarantor, then what b's interfaces show) and returns one
// result per guarantee, in order. The error is an *InvalidOptionError for
// an unknown name, or the backend's failure to measure (the server could
// not be reached); an unmet guarantee is a result with Met false, not an
// error (see RequireGuarantees).
func CheckGuarantees(ctx context.Context, b Backend, require []Guarantee) ([]GuaranteeResult, error) {
	for _, g := range require {
		if err := CheckGuarantee("Require", g); err != nil {
			return nil, err
		}
	}
	if len(require) == 0 {
		return nil, nil
	}
	measured := map[Guarantee]Measurement{}
	if gr, ok := b.(Guarantor); ok {
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
	if d, ok := b.(Describer); ok {
		if n := d.Describe().Name; n != "" {
			return n
		}
	}
	return "backend"
}

// structural judges a guarantee the backend did not measure, from what its
// type offers.
func structural(b Backend, name string, g Guarantee) Measurement {
	switch g {
	case FIFO:
		if _, ok := b.(Waiter); ok {
			return Measurement{Met: true, Observed: name + " queues waiters in the store (Waiter)"}
		}
		return Measurement{Observed: name + " has no queue in the store: waiters poll or are woken and race on each release",
			Fix: "use a backend that queues waiters: etcd or ZooKeeper"}
	case PushedLoss:
		if _, ok := b.(LossNotifier); ok {
			return Measurement{Met: true, Observed: name + " pushes loss to the holder (LossNotifier)"}
		}
		return Measurement{Observed: name + " tells a holder of loss only when a renewal is refused",
			Fix: "use a backend that pushes loss: etcd or ZooKeeper"}
	case FencedSemaphores:
		return Measurement{Met: true, Observed: "recipe.Semaphore: each permit is a lease on its slot key, with that slot's fencing token"}
	}
	return Measurement{Observed: name + " does not measure " + string(g) + " on its server (no Guarantor report): unknown",
		Fix: "use a backend that measures it (postgres, redis, etcd, zk, mongodb, file, mem)"}
}
