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
	vals, _ := url.ParseQuery(u.RawQuery)
	return &Params{vals: vals, err: CheckQuery(u)}
}

// CheckQuery returns an *InvalidOptionError naming the URL (redacted) if
// u's query cannot be parsed whole: url.URL.Query drops a pair that holds
// a ';' or a '%' not followed by two hex digits, so that a parameter such
// as "table=a;b" would otherwise be ignored without a word.
func CheckQuery(u *url.URL) error {
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		return InvalidURL(u.String(), "its query cannot be parsed: percent-encode a ';' in a value as %3B and a '%' as %25")
	}
	return nil
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
	return UnknownParam(unknown[0], p.known)
}

// EngineParams are the URL parameters the engine reads (fencelock.Open
// removes them before a backend sees the URL): every URL takes them.
var EngineParams = []string{"lock_delay", "margin", "owner", "renew_interval", "require", "rotate_every", "ttl"}

// UnknownParam returns the *InvalidOptionError for a URL parameter that
// neither the backend (known) nor the engine (EngineParams) reads: it
// lists both, and names the parameter most probably meant.
func UnknownParam(name string, known []string) error {
	own := append([]string(nil), known...)
	sort.Strings(own)
	reason := "unknown"
	switch strings.ToLower(name) {
	case "password", "pass", "pwd", "user", "username":
		// Credentials go where every URL form keeps them.
		reason += "; credentials go in the URL's userinfo: SCHEME://USER:PASSWORD@HOST/... (percent-encode / ? # @ : in them)"
	default:
		if guess := closest(name, append(append([]string(nil), own...), EngineParams...)); guess != "" {
			reason += "; did you mean " + guess + "?"
		}
	}
	if len(own) > 0 {
		reason += "; this backend's parameters: " + strings.Join(own, ", ") + "; every URL's: " + strings.Join(EngineParams, ", ")
	} else {
		reason += "; this URL takes no parameters of its own, only the engine's: " + strings.Join(EngineParams, ", ")
	}
	return &InvalidOptionError{Option: "URL parameter", Value: strconv.Quote(name), Reason: reason}
}

// closest returns the word of words nearest to s by edit distance, if
// near enough to be a typo, else "".
func closest(s string, words []string) string {
	best, bestD := "", 3
	for _, w := range words {
		if d := EditDistance(strings.ToLower(s), w); d < bestD || d == bestD && w < best {
			best, bestD = w, d
		}
	}
	if best == "" || bestD*2 > len(s) {
		return ""
	}
	return best
}

// EditDistance is the Levenshtein distance between a and b, in bytes: how
// many insertions, deletions and substitutions turn one into the other.
// Errors use it to name what a misspelt word probably meant.
func EditDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// showValue is how an error shows a parameter's value: quoted, or
// Redacted for a parameter that may carry a credential.
func showValue(name, v string) string {
	if IsSecretParam(name) {
		return Redacted
	}
	return strconv.Quote(v)
}
