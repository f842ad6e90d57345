package file

import (
	"context"
	"net/url"
	"strings"

	"github.com/fencelock/fencelock/driver"
)

// Open opens a Backend from a file URL. The URL's forms and its parameter
// are in the package documentation, under URLs.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "cannot be parsed")
	}
	return OpenURL(ctx, u)
}

// OpenURL is Open for a parsed URL (scheme file).
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	if !strings.EqualFold(u.Scheme, Scheme) {
		return nil, &driver.InvalidOptionError{Option: "URL", Value: driver.RedactURL(u.String()), Reason: "scheme must be file"}
	}
	if u.Host != "" && u.Host != "localhost" {
		return nil, &driver.InvalidOptionError{Option: "URL", Value: driver.RedactURL(u.String()), Reason: "the file backend is local to one machine: the host must be empty or localhost (file:///path/to/dir)"}
	}
	if u.User != nil {
		return nil, &driver.InvalidOptionError{Option: "URL", Value: driver.RedactURL(u.String()), Reason: "file URLs take no user or password"}
	}
	p := driver.NewParams(u)
	sync := p.Bool("sync", true)
	if err := p.Err(); err != nil {
		return nil, err
	}
	dir := u.Path
	if u.Opaque != "" {
		dir = u.Opaque
	}
	return New(ctx, &Options{Dir: dir, NoSync: !sync})
}
