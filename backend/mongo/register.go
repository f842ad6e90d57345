package mongo

import (
	"context"
	"net/url"

	"github.com/fencelock/fencelock"
)

// URL schemes this package registers with fencelock.Open.
const (
	// Scheme is the URL scheme of a MongoDB deployment given by hosts.
	Scheme = "mongodb"
	// SchemeSRV is the URL scheme of a deployment found by a DNS SRV
	// look-up.
	SchemeSRV = "mongodb+srv"
)

func init() {
	fencelock.Register(Scheme, openURL)
	fencelock.Register(SchemeSRV, openURL)
}

func openURL(ctx context.Context, u *url.URL) (fencelock.Backend, error) {
	return OpenURL(ctx, u)
}
