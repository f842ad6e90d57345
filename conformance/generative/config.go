package generative

import (
	"context"
	"fmt"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"pgregory.net/rapid"
)

// clientCfg is what sets one client of a program apart from the others
// on the same store: its own TTL, local-validity margin and default
// minimum hold (Options.MinHold), and the way its Backend was opened
// (Harness.Open or one of Options.Variants). Tokens must still strictly
// increase per key and at most one holder be valid, whatever mix of
// configurations shares a store.
type clientCfg struct {
	ttl     int // Options.TTL in tenths of the harness's TTL: 10 (the harness's) or 20
	margin  int // Options.Margin in hundredths of the client's TTL; 0: the default (TTL/10)
	minHold int // Options.MinHold in tenths of the harness's TTL; 0: none
	variant int // 0: Harness.Open; i > 0: Options.Variants[i-1]
}

func (c clientCfg) String() string {
	return fmt.Sprintf("ttl %d/10 margin %d/100 minhold %d/10 variant %d", c.ttl, c.margin, c.minHold, c.variant)
}

// drawClientCfg draws one client's configuration: the harness's (half
// the time), or a longer TTL, another margin, a default minimum hold
// and another variant, each drawn on its own.
func drawClientCfg(t *rapid.T, o *Options) clientCfg {
	c := clientCfg{ttl: 10}
	if rapid.Bool().Draw(t, "ownConfig") {
		c.ttl = rapid.SampledFrom([]int{10, 10, 20}).Draw(t, "clientTTL")
		c.margin = rapid.SampledFrom([]int{0, 5, 30}).Draw(t, "clientMargin")
		c.minHold = rapid.SampledFrom([]int{0, 0, 3, 12}).Draw(t, "clientMinHold")
	}
	if len(o.Variants) > 0 {
		c.variant = rapid.IntRange(0, len(o.Variants)).Draw(t, "variant")
	}
	return c
}

// TTL returns the client's TTL.
func (c clientCfg) TTL(h conformance.Harness) time.Duration {
	if c.ttl == 0 {
		return h.TTL
	}
	return time.Duration(c.ttl) * h.TTL / 10
}

// options returns the engine options of a client with this
// configuration (rotate: RotateEvery a third of its TTL).
func (c clientCfg) options(h conformance.Harness, rotate bool, owner string, obs fencelock.Observer) *fencelock.Options {
	ttl := c.TTL(h)
	o := &fencelock.Options{
		TTL:            ttl,
		MinBackoff:     2 * time.Millisecond,
		MaxBackoff:     max(h.TTL/8, 10*time.Millisecond),
		ReleaseTimeout: releaseTimeout(h.TTL),
		Observer:       obs,
		Owner:          owner,
		MinHold:        time.Duration(c.minHold) * h.TTL / 10,
	}
	if c.margin > 0 {
		o.Margin = time.Duration(c.margin) * ttl / 100
	}
	if rotate {
		o.RotateEvery = ttl / 3
	}
	return o
}

// open opens the client's Backend: with Harness.Open or its variant.
func (c clientCfg) open(ctx context.Context, h conformance.Harness, o *Options) (driver.Backend, error) {
	if c.variant > 0 && c.variant <= len(o.Variants) {
		b, err := o.Variants[c.variant-1](ctx)
		if err != nil {
			return nil, fmt.Errorf("Options.Variants[%d]: %w", c.variant-1, err)
		}
		return b, nil
	}
	b, err := h.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("Harness.Open: %w", err)
	}
	return b, nil
}

// longestTTL returns the longest lease TTL of a program whose clients
// have cfgs and whose steps ask for stepTTLs (tenths of the harness's
// TTL), and the slack scaled with it.
func longestTTL(h conformance.Harness, cfgs []clientCfg, stepTTLs []int) (time.Duration, time.Duration) {
	maxTTL := h.TTL
	for _, c := range cfgs {
		maxTTL = max(maxTTL, c.TTL(h))
	}
	for _, t := range stepTTLs {
		maxTTL = max(maxTTL, time.Duration(t)*h.TTL/10)
	}
	return maxTTL, time.Duration(float64(h.Slack) * float64(maxTTL) / float64(h.TTL))
}
