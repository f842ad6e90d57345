package fencelock

import (
	"context"

	"github.com/fencelock/fencelock/driver"
)

// Guarantee names a property a deployment may require of its store
// (Options.Require, the URL parameter require=): see the constants below
// and docs/deploying.md.
type Guarantee = driver.Guarantee

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
	return driver.RequireGuarantees(ctx, b, o.Require)
}
