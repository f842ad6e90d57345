package mysql

import (
	"context"
	"net/url"

	"github.com/fencelock/fencelock"
)

// Scheme is the URL scheme of this backend: fencelock.Open("mysql://…")
// opens it, and so does the alias "mariadb".
const Scheme = "mysql"

// Schemes are the URL schemes this package registers with fencelock.Open.
var Schemes = []string{Scheme, "mariadb"}

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
