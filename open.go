package fencelock

import (
	"context"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// OpenFunc opens a backend from a URL whose scheme it was registered for.
// The engine's own parameters (ttl, renew_interval, margin, rotate_every,
// owner) have already been removed from u's query; the OpenFunc must reject
// any parameter it does not know (driver.Params does this), should report
// a URL it cannot use with an *InvalidOptionError (driver.InvalidURL), and
// must not put credentials from u into error messages: show URLs with
// driver.RedactURL and wrap client libraries' errors with
// driver.RedactError. (OpenBackend also scrubs what an OpenFunc returns,
// as a last line of defence.)
type OpenFunc func(ctx context.Context, u *url.URL) (Backend, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]OpenFunc{}
)

// Register makes a backend available to Open under a URL scheme, in the
// manner of database/sql.Register. Schemes are case-insensitive. Backend
// packages call it from init; importing the package (for its side effect if
// need be) is what makes the scheme known. Register panics if open is nil or
// the scheme is already registered.
func Register(scheme string, open OpenFunc) {
	scheme = strings.ToLower(scheme)
	registryMu.Lock()
	defer registryMu.Unlock()
	if open == nil {
		panic("fencelock: Register open func is nil")
	}
	if _, dup := registry[scheme]; dup {
		panic("fencelock: Register called twice for scheme " + scheme)
	}
	registry[scheme] = open
}

// Schemes returns the registered URL schemes, sorted.
func Schemes() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s := make([]string, 0, len(registry))
	for k := range registry {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

func init() {
	Register("mem", func(ctx context.Context, u *url.URL) (Backend, error) {
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
		return memory.Named(name).Backend(), nil
	})
}

// OpenBackend opens a backend from a URL without creating a Client, and
// returns the engine parameters found in the URL as Options.
func OpenBackend(ctx context.Context, rawURL string) (Backend, *Options, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse errors quote the URL, password included.
		return nil, nil, driver.InvalidURL(rawURL, "cannot be parsed")
	}
	if err := driver.CheckPorts(u); err != nil {
		return nil, nil, err
	}
	scheme := strings.ToLower(u.Scheme)
	registryMu.RLock()
	open, ok := registry[scheme]
	registryMu.RUnlock()
	if !ok {
		return nil, nil, unknownScheme(u.Scheme, rawURL)
	}
	q := u.Query()
	o := &Options{}
	for name, dst := range map[string]*time.Duration{
		"ttl": &o.TTL, "renew_interval": &o.RenewInterval, "margin": &o.Margin, "rotate_every": &o.RotateEvery,
	} {
		if q.Has(name) {
			// One rule for a TTL from a URL and from a flag
			// (driver.ParseTTL); an empty or zero value is refused, not
			// taken for the default.
			parse := driver.ParseDuration
			if name == "ttl" {
				parse = driver.ParseTTL
			}
			d, err := parse("URL parameter "+strconv.Quote(name), q.Get(name))
			if err != nil {
				return nil, nil, err
			}
			*dst = d
		}
		q.Del(name)
	}
	o.Owner = q.Get("owner")
	q.Del("owner")
	u2 := *u
	u2.Scheme = scheme
	u2.RawQuery = q.Encode()
	b, err := open(ctx, &u2)
	if err != nil {
		// A backend's own error should already be redacted; make sure.
		if msg := err.Error(); driver.RedactText(msg, rawURL) != msg {
			err = driver.RedactError(err, rawURL)
		}
		return nil, nil, err
	}
	return b, o, nil
}

// Open opens the backend named by rawURL's scheme ("mem://", "postgres://",
// "redis://", "etcd://", "zk://", "mongodb://", or any registered scheme)
// and returns a Client on it. Engine options may be given in the URL's
// query (ttl, renew_interval, margin, rotate_every, owner); a non-zero field
// of opts wins over the URL. No credential from the URL appears in errors
// (see driver.RedactURL).
func Open(ctx context.Context, rawURL string, opts *Options) (*Client, error) {
	b, uo, err := OpenBackend(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	o := *uo
	if opts != nil {
		merged := *opts
		if merged.TTL == 0 {
			merged.TTL = o.TTL
		}
		if merged.RenewInterval == 0 {
			merged.RenewInterval = o.RenewInterval
		}
		if merged.Margin == 0 {
			merged.Margin = o.Margin
		}
		if merged.RotateEvery == 0 {
			merged.RotateEvery = o.RotateEvery
		}
		if merged.Owner == "" {
			merged.Owner = o.Owner
		}
		o = merged
	}
	c, err := New(b, &o)
	if err != nil {
		b.Close()
		return nil, err
	}
	return c, nil
}
