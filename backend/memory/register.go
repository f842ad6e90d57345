package memory

import (
	"context"
	"net/url"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// Scheme is the URL scheme of this backend: fencelock.Open("mem://NAME")
// opens a Backend on Named(NAME). A program that opens mem URLs imports
// this package, for its side effect if need be:
//
//	import _ "github.com/fencelock/fencelock/backend/memory"
const Scheme = "mem"

// Schemes are the URL schemes this package registers with fencelock.Open.
var Schemes = []string{Scheme}

func init() {
	for _, s := range Schemes {
		fencelock.Register(s, openURL)
	}
}

// openURL opens mem://NAME (or mem:NAME): a Backend on Named(NAME). The
// engine's parameters have been removed from u; any other parameter, a
// path or a user is refused.
func openURL(_ context.Context, u *url.URL) (fencelock.Backend, error) {
	if err := driver.NewParams(u).Err(); err != nil {
		return nil, err
	}
	if u.Path != "" && u.Path != "/" {
		return nil, driver.InvalidURL(u.String(), "mem URLs are mem://NAME with no path")
	}
	if u.User != nil {
		return nil, driver.InvalidURL(u.String(), "mem URLs take no user or password")
	}
	name := u.Host
	if name == "" {
		name = u.Opaque
	}
	return Named(name).Backend(), nil
}
