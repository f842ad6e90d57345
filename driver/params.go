package driver

import (
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Params reads a URL's query parameters for a backend's opener and rejects
// the ones nobody asked for, so a typo ("tabel=") is an error instead of a
// silently ignored setting.
//
//	p := driver.NewParams(u)
//	table := p.String("table", "fencelock_locks")
//	timeout := p.Duration("dial_timeout", 5*time.Second)
//	if err := p.Err(); err != nil { return nil, err }
type Params struct {
	vals  url.Values
	known []string
	err   error
}

// NewParams returns the query parameters of u.
func NewParams(u *url.URL) *Params {
	return &Params{vals: u.Query()}
}

func (p *Params) take(name string) (string, bool) {
	p.known = append(p.known, name)
	vs, ok := p.vals[name]
	if !ok {
		return "", false
	}
	delete(p.vals, name)
	if len(vs) > 1 && p.err == nil {
		shown := strings.Join(vs, ",")
		if IsSecretParam(name) {
			shown = Redacted
		}
		p.err = &InvalidOptionError{Option: "URL parameter " + strconv.Quote(name), Value: shown, Reason: "given more than once"}
	}
	return vs[len(vs)-1], true
}

// String returns the parameter's value, or def if absent.
func (p *Params) String(name, def string) string {
	if v, ok := p.take(name); ok {
		return v
	}
	return def
}

// Duration returns the parameter parsed with time.ParseDuration, or def.
func (p *Params) Duration(name string, def time.Duration) time.Duration {
	v, ok := p.take(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil && p.err == nil {
		p.err = &InvalidOptionError{Option: "URL parameter " + strconv.Quote(name), Value: showValue(name, v), Reason: "not a duration (e.g. 1500ms, 15s)"}
	}
	return d
}

// Int returns the parameter parsed as a decimal integer, or def.
func (p *Params) Int(name string, def int) int {
	v, ok := p.take(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil && p.err == nil {
		p.err = &InvalidOptionError{Option: "URL parameter " + strconv.Quote(name), Value: showValue(name, v), Reason: "not an integer"}
	}
	return n
}

// Bool returns the parameter parsed with strconv.ParseBool, or def.
func (p *Params) Bool(name string, def bool) bool {
	v, ok := p.take(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil && p.err == nil {
		p.err = &InvalidOptionError{Option: "URL parameter " + strconv.Quote(name), Value: showValue(name, v), Reason: "not a boolean"}
	}
	return b
}

// Rest removes and returns every parameter not read so far, for a backend
// that passes them on to its client library's own parser. Err then reports
// no unknown parameters.
func (p *Params) Rest() url.Values {
	rest := p.vals
	p.vals = url.Values{}
	return rest
}

// Err returns the first malformed value, or an *InvalidOptionError naming
// the first parameter that was never read, listing the known ones.
func (p *Params) Err() error {
	if p.err != nil {
		return p.err
	}
	if len(p.vals) == 0 {
		return nil
	}
	var unknown []string
	for k := range p.vals {
		unknown = append(unknown, k)
	}
	sort.Strings(unknown)
	known := append([]string(nil), p.known...)
	sort.Strings(known)
	reason := "unknown; known parameters: " + strings.Join(known, ", ")
	if len(known) == 0 {
		reason = "unknown: this URL takes no parameters of its own"
	}
	return &InvalidOptionError{Option: "URL parameter", Value: strconv.Quote(unknown[0]), Reason: reason}
}

// showValue is how an error shows a parameter's value: quoted, or
// Redacted for a parameter that may carry a credential.
func showValue(name, v string) string {
	if IsSecretParam(name) {
		return Redacted
	}
	return strconv.Quote(v)
}
