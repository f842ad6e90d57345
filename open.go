package fencelock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
)

var (
	registryMu sync.RWMutex
	registry   = map[string]func(ctx context.Context, u *url.URL) (Backend, error){}
)

// Register makes a backend available to Open under a URL scheme, in the
// manner of database/sql.Register. Schemes are case-insensitive. Backend
// packages call it from init; importing the package (for its side effect if
// need be) is what makes the scheme known. Register panics if open is nil or
// the scheme is already registered.
//
// open opens a backend from a URL whose scheme it was registered for. The
// engine's own parameters (ttl, renew_interval, margin, rotate_every,
// owner, lock_delay, require, coalesce) have already been removed from u's query;
// open must reject any parameter it does not know (driver.Params does
// this), should report a URL it cannot use with an *InvalidOptionError
// (driver.InvalidURL), and must not put credentials from u into error
// messages: show URLs with driver.RedactURL and wrap client libraries'
// errors with driver.RedactError. (OpenBackend also scrubs what open
// returns, as a last line of defence.)
func Register(scheme string, open func(ctx context.Context, u *url.URL) (Backend, error)) {
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

// OpenBackend opens a backend from a URL without creating a Client, and
// returns the engine parameters found in the URL as Options. If the URL
// names guarantees (require=), OpenBackend measures them within ctx and,
// if any is unmet, closes the backend and returns an
// *driver.UnmetGuaranteeError.
func OpenBackend(ctx context.Context, rawURL string) (Backend, *Options, error) {
	return openBackend(ctx, rawURL, true)
}

func openBackend(ctx context.Context, rawURL string, check bool) (Backend, *Options, error) {
	if err := checkURLText(rawURL); err != nil {
		return nil, nil, err
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		if i := strings.Index(rawURL, "://"); i <= 0 || strings.ContainsAny(rawURL[:i], "@/?#:") {
			// "127.0.0.1:6379", "app:pw@db:5432/app": no scheme at all.
			return nil, nil, unknownScheme("", rawURL)
		}
		// url.Parse errors quote the URL, password included: say what
		// is wrong without them.
		return nil, nil, driver.InvalidURL(rawURL, parseFailure(err))
	}
	if err := driver.CheckPorts(u); err != nil {
		return nil, nil, err
	}
	if err := driver.CheckQuery(u); err != nil {
		return nil, nil, err
	}
	scheme := strings.ToLower(u.Scheme)
	if err := checkSlashes(rawURL, u, scheme); err != nil {
		return nil, nil, err
	}
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
		"lock_delay": &o.LockDelay,
	} {
		if q.Has(name) {
			if err := onceOnly(q, name); err != nil {
				return nil, nil, err
			}
			// One rule for a TTL from a URL and from a flag
			// (driver.ParseTTL); an empty or zero value is refused, not
			// taken for the default.
			parse := driver.ParseDuration
			switch name {
			case "ttl":
				parse = driver.ParseTTL
			case "lock_delay":
				parse = driver.ParseLockDelay
			}
			d, err := parse("URL parameter "+strconv.Quote(name), q.Get(name))
			if err != nil {
				return nil, nil, err
			}
			*dst = d
		}
		q.Del(name)
	}
	if err := onceOnly(q, "owner"); err != nil {
		return nil, nil, err
	}
	o.Owner = q.Get("owner")
	q.Del("owner")
	if q.Has("coalesce") {
		if err := onceOnly(q, "coalesce"); err != nil {
			return nil, nil, err
		}
		switch v := q.Get("coalesce"); v {
		case "on":
		case "off":
			o.NoCoalesce = true
		default:
			return nil, nil, &driver.InvalidOptionError{Option: "URL parameter \"coalesce\"", Value: strconv.Quote(v), Reason: "must be on or off"}
		}
		q.Del("coalesce")
	}
	if q.Has("require") {
		if o.Require, err = driver.ParseGuarantees("URL parameter \"require\"", strings.Join(q["require"], ",")); err != nil {
			return nil, nil, err
		}
		q.Del("require")
	}
	u2 := *u
	u2.Scheme = scheme
	u2.RawQuery = q.Encode()
	b, err := open(ctx, &u2)
	if err != nil {
		// A backend's own error should already be redacted; make sure.
		if msg := err.Error(); driver.RedactText(msg, rawURL) != msg {
			err = driver.RedactError(err, rawURL)
		}
		return nil, nil, engineParamGuess(err, q)
	}
	if !check {
		return b, o, nil
	}
	if err := requireAtOpen(ctx, b, &Options{Require: o.Require}); err != nil {
		b.Close()
		return nil, nil, redactOpen(err, rawURL)
	}
	return b, o, nil
}

// onceOnly refuses an engine parameter given more than once ("ttl=10s&ttl=20s"),
// as driver.Params does a backend's: taking one of the values silently would
// leave the other, perhaps the one meant, unused. require= may repeat: its
// values add up.
func onceOnly(q url.Values, name string) error {
	if vs := q[name]; len(vs) > 1 {
		return &driver.InvalidOptionError{Option: "URL parameter " + strconv.Quote(name), Value: strconv.Quote(strings.Join(vs, ",")),
			Reason: "given more than once; keep one"}
	}
	return nil
}

// checkURLText refuses, with what to do, a URL that is empty or carries
// white space or quotes around it (an environment file or a YAML value
// that kept them, a line read with its newline): url.Parse would fail on
// it or, worse, hand a backend a host or database name with a space.
func checkURLText(rawURL string) error {
	switch t := strings.TrimSpace(rawURL); {
	case t == "":
		return driver.InvalidURL(strconv.Quote(rawURL), "empty: give a backend URL such as redis://HOST:6379/0 or file:///DIR")
	case t != rawURL:
		return driver.InvalidURL(strconv.Quote(driver.RedactURL(t)), "white space before or after it; remove it")
	case len(t) >= 2 && (t[0] == '"' || t[0] == '\'') && t[len(t)-1] == t[0]:
		return driver.InvalidURL(driver.RedactURL(t[1:len(t)-1]), "it is in quotes, which are part of the value here (an env file or a config that kept them); remove them")
	}
	return nil
}

// parseFailure says what made url.Parse refuse a URL that has a scheme,
// without repeating url.Parse's message: it quotes the URL, and the text
// it names (a "port" or an "escape") is often a piece of the password.
func parseFailure(err error) string {
	var ue *url.Error
	inner := err.Error()
	if errors.As(err, &ue) {
		inner = ue.Err.Error()
	}
	const encode = "; in the user and the password, percent-encode '/' as %2F, '?' as %3F, '#' as %23, '@' as %40, '%' as %25 and a space as %20"
	switch {
	case strings.HasPrefix(inner, "invalid port"):
		return "cannot be parsed: what follows the host's ':' is not a port number (a password with '/', '?' or '#' ends the host early)" + encode
	case strings.HasPrefix(inner, "invalid URL escape"):
		return "cannot be parsed: a '%' not followed by two hexadecimal digits" + encode
	case strings.Contains(inner, "invalid userinfo"):
		return "cannot be parsed: the user or the password holds a character a URL cannot" + encode
	case strings.Contains(inner, "in host name"):
		return "cannot be parsed: the host holds a character a host name cannot (a space, or a password's '/', '?' or '#' ended the user part early)" + encode
	case strings.Contains(inner, "control character"):
		return "cannot be parsed: it holds a control character (a newline or a tab?); remove it"
	}
	return "cannot be parsed; write it as SCHEME://[USER[:PASSWORD]@]HOST[:PORT]/..." + encode
}

// networkSchemes are the schemes of the project's backends that always
// name a host: "redis:/host" (one slash) is a typo for "redis://host".
var networkSchemes = map[string]bool{
	"postgres": true, "postgresql": true, "redis": true, "rediss": true,
	"redis+cluster": true, "rediss+cluster": true, "redis+sentinel": true, "rediss+sentinel": true,
	"etcd": true, "etcds": true, "zk": true, "mongodb": true, "mongodb+srv": true,
	"nats": true, "nats+tls": true,
}

// checkSlashes refuses a URL of a network backend written with one slash
// after the scheme, which url.Parse reads as a path with no host.
func checkSlashes(rawURL string, u *url.URL, scheme string) error {
	rest := rawURL[len(u.Scheme)+1:]
	if !networkSchemes[scheme] || u.Host != "" || !strings.HasPrefix(rest, "/") || strings.HasPrefix(rest, "//") {
		return nil
	}
	fixed := u.Scheme + ":/" + rest
	return &driver.InvalidOptionError{Option: "URL", Value: driver.RedactText(rawURL, fixed),
		Reason: "one slash after " + strconv.Quote(u.Scheme+":") + "; did you mean " + driver.RedactURL(fixed) + "?"}
}

// engineParamGuess adds to a backend's refusal of a URL parameter the
// engine parameter it was probably meant to be ("tll" → ttl), for
// backends whose own message does not (those that hand unknown
// parameters to their client library or server).
func engineParamGuess(err error, rest url.Values) error {
	var ioe *InvalidOptionError
	msg := err.Error()
	if !errors.As(err, &ioe) || !strings.HasPrefix(ioe.Option, "URL") || strings.Contains(msg, "did you mean") {
		return err
	}
	names := make([]string, 0, len(rest))
	for name := range rest {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !strings.Contains(msg, strconv.Quote(name)) && !strings.Contains(msg, "option: "+name) {
			continue
		}
		for _, e := range driver.EngineParams {
			if d := driver.EditDistance(strings.ToLower(name), e); d > 0 && d <= 2 && d*2 <= len(name) {
				return fmt.Errorf("%w; did you mean %s? (every URL takes the engine's %s)", err, e, strings.Join(driver.EngineParams, ", "))
			}
		}
	}
	return err
}

// Open opens the backend named by rawURL's scheme ("mem://", "postgres://",
// "redis://", "etcd://", "zk://", "mongodb://", or any registered scheme)
// and returns a Client on it. Engine options may be given in the URL's
// query (ttl, renew_interval, margin, rotate_every, owner, lock_delay,
// coalesce); a non-zero field
// of opts wins over the URL. No credential from the URL appears in errors
// (see driver.RedactURL). Guarantees named by the URL's require= and by
// opts.Require are both required: Open measures them within ctx and, if
// any is unmet, closes the backend and returns a *driver.UnmetGuaranteeError.
func Open(ctx context.Context, rawURL string, opts *Options) (*Client, error) {
	b, uo, err := openBackend(ctx, rawURL, false)
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
		if merged.LockDelay == 0 {
			merged.LockDelay = o.LockDelay
		}
		merged.Require = mergeRequire(o.Require, merged.Require)
		merged.NoCoalesce = merged.NoCoalesce || o.NoCoalesce
		o = merged
	}
	c, err := newClient(ctx, b, &o)
	if err != nil {
		b.Close()
		return nil, redactOpen(err, rawURL)
	}
	return c, nil
}

// redactOpen scrubs rawURL's secrets from err's text (a failure to measure
// the required guarantees may quote a client library's message), keeping
// what errors.Is and errors.As find.
func redactOpen(err error, rawURL string) error {
	if msg := err.Error(); driver.RedactText(msg, rawURL) != msg {
		return driver.RedactError(err, rawURL)
	}
	return err
}
