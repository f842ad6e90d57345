package postgres

import (
	"context"
	"net/url"

	"github.com/fencelock/fencelock"
)

// Scheme is the URL scheme of this backend: fencelock.Open("postgres://…")
// opens it, and so does the alias "postgresql".
const Scheme = "postgres"

// Schemes are the URL schemes this package registers with fencelock.Open.
var Schemes = []string{Scheme, "postgresql"}

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
