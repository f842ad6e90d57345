package mongo

import (
	"context"
	"net/url"

	"github.com/fencelock/fencelock"
)

// Scheme is the URL scheme of this backend: fencelock.Open("mongodb://…")
// opens it. SchemeSRV is the DNS seed-list form.
const (
	Scheme    = "mongodb"
	SchemeSRV = "mongodb+srv"
)

// Schemes are the URL schemes this package registers with fencelock.Open.
var Schemes = []string{Scheme, SchemeSRV}

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
