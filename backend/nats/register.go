package nats

import (
	"context"
	"net/url"

	"github.com/fencelock/fencelock"
)

// Scheme is the URL scheme of this backend: fencelock.Open("nats://…")
// opens it, and "nats+tls" (SchemeTLS) does over TLS.
const (
	Scheme    = "nats"
	SchemeTLS = "nats+tls"
)

// Schemes are the URL schemes this package registers with fencelock.Open.
var Schemes = []string{Scheme, SchemeTLS}

func init() {
	for _, s := range Schemes {
		fencelock.Register(s, func(ctx context.Context, u *url.URL) (fencelock.Backend, error) {
			b, err := OpenURL(ctx, u)
			if err != nil {
				return nil, err
			}
			return b, nil
		})
	}
}
