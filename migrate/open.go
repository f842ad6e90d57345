package migrate

import (
	"context"
	"net/url"
	"strings"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

func init() {
	fencelock.Register("dual", openDual)
}

// DualURL returns the URL that opens a Dual of the backends at oldURL and
// newURL with fencelock.Open: dual://?old=…&new=… with both URLs
// query-escaped. The result carries the inner URLs' credentials: show it
// with driver.RedactURL, which redacts nested URLs too. Engine parameters (ttl, owner, …) go on the dual URL, not
// on the inner ones.
func DualURL(oldURL, newURL string) string {
	return "dual://?old=" + url.QueryEscape(oldURL) + "&new=" + url.QueryEscape(newURL)
}

// engineParams are the parameters fencelock.OpenBackend takes off a URL for
// the engine; on an inner URL of a dual one they would be lost.
var engineParams = []string{"ttl", "renew_interval", "margin", "rotate_every", "owner", "lock_delay"}

func openDual(ctx context.Context, u *url.URL) (driver.Backend, error) {
	if (u.Host != "" && u.Host != "/") || (u.Path != "" && u.Path != "/") || u.Opaque != "" {
		return nil, driver.InvalidURL(u.String(), "dual URLs are dual://?old=URL&new=URL, with no host or path")
	}
	p := driver.NewParams(u)
	oldURL := p.String("old", "")
	newURL := p.String("new", "")
	if err := p.Err(); err != nil {
		return nil, err
	}
	var open [2]driver.Backend
	for i, s := range []struct{ name, raw string }{{"old", oldURL}, {"new", newURL}} {
		if err := checkInner(s.name, s.raw); err != nil {
			closeAll(open[:i])
			return nil, err
		}
		b, _, err := fencelock.OpenBackend(ctx, s.raw)
		if err != nil {
			closeAll(open[:i])
			return nil, err
		}
		open[i] = b
	}
	d, err := NewDual(open[0], open[1])
	if err != nil {
		closeAll(open[:])
		return nil, err
	}
	return d, nil
}

func checkInner(name, raw string) error {
	opt := "dual URL parameter " + name
	if raw == "" {
		return &driver.InvalidOptionError{Option: opt, Value: `""`, Reason: "required: the " + name + " backend's URL, query-escaped (see migrate.DualURL)"}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return &driver.InvalidOptionError{Option: opt, Value: driver.RedactURL(raw), Reason: "not a URL"}
	}
	if strings.EqualFold(u.Scheme, "dual") {
		return &driver.InvalidOptionError{Option: opt, Value: driver.RedactURL(raw), Reason: "a dual backend cannot nest another"}
	}
	q := u.Query()
	for _, e := range engineParams {
		if q.Has(e) {
			return &driver.InvalidOptionError{Option: opt, Value: driver.RedactURL(raw), Reason: "engine parameter " + e + " belongs on the dual URL, where the engine reads it"}
		}
	}
	return nil
}

// closeAll closes what a failed open had opened; their errors add nothing
// to the one being returned.
func closeAll(bs []driver.Backend) {
	for _, b := range bs {
		if b != nil {
			_ = b.Close()
		}
	}
}
