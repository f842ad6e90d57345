package driver

import (
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// Redacted is what RedactURL, RedactText and RedactError put where a
// secret was.
const Redacted = "xxxxx"

// secretWords are the substrings (lower case) of a query parameter's name
// that mark its value as a credential. They cover every backend's own
// syntax: password, sslpassword, passfile and sslkey (pgx);
// sentinel_password (Redis); authMechanismProperties,
// tlsCertificateKeyFilePassword and proxyPassword (MongoDB); key_file
// (etcd); and the usual names of tokens, keys and signatures.
var secretWords = []string{"pass", "pwd", "secret", "token", "key", "cred", "auth", "sig"}

// IsSecretParam reports whether a URL query parameter of this name may
// carry a credential, so that RedactURL hides its value. The test is by
// substring, case-insensitive, on the name as written and unescaped.
func IsSecretParam(name string) bool {
	for _, n := range []string{name, unescape(name)} {
		n = strings.ToLower(n)
		for _, w := range secretWords {
			if strings.Contains(n, w) {
				return true
			}
		}
	}
	return false
}

// RedactURL returns rawURL with every credential it may carry replaced by
// Redacted: the password of its userinfo, the value of every query (and
// fragment) parameter that IsSecretParam names, and, recursively, those of
// URLs nested in parameter values (a dual:// URL's old= and new=, a
// PostgreSQL listen_url=). It is the one redaction rule of fencelock:
// every URL the project prints or logs goes through it first, and
// third-party backends should use it too.
//
// RedactURL works on the text and never needs url.Parse to succeed, so a
// malformed URL is redacted as well: what looks like userinfo (the text
// before the last '@' of the authority) keeps its user name and loses the
// rest, and name=value pairs separated by '&', ';' or (in a string that is
// not a URL, such as a key=value DSN) white space lose the values of
// secret names. Everything else is kept as written.
func RedactURL(rawURL string) string {
	out, _ := redact(rawURL, 0)
	return out
}

// RedactText returns text (typically a client library's error message)
// with every secret that rawURL carries replaced by Redacted, in each form
// a library may have quoted it: as written, unescaped, re-escaped for a
// query, a path or userinfo, or Go-quoted. rawURL itself, if quoted whole,
// is replaced by RedactURL(rawURL).
func RedactText(text, rawURL string) string {
	red, secrets := redact(rawURL, 0)
	if rawURL != "" {
		text = strings.ReplaceAll(text, rawURL, red)
	}
	var forms []string
	for _, s := range secrets {
		forms = append(forms, secretForms(s)...)
	}
	// Longest first, so that a secret is not half-replaced by a shorter
	// form of itself.
	sort.Slice(forms, func(i, j int) bool { return len(forms[i]) > len(forms[j]) })
	for _, f := range forms {
		if f != "" && f != Redacted {
			text = strings.ReplaceAll(text, f, Redacted)
		}
	}
	return text
}

// RedactError returns an error whose text is err's with every secret of
// rawURL removed (RedactText) and that unwraps to err, so errors.Is and
// errors.As still find what err matches. Backends wrap the errors of
// their client libraries with it, since those may quote the URL or the
// password. A nil err gives nil.
func RedactError(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	return &redactedError{msg: RedactText(err.Error(), rawURL), err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// InvalidURL returns the *InvalidOptionError for a URL that a backend
// cannot use, with the URL redacted. reason must not quote the URL; pass a
// library's message through RedactText first.
func InvalidURL(rawURL, reason string) *InvalidOptionError {
	return &InvalidOptionError{Option: "URL", Value: RedactURL(rawURL), Reason: reason}
}

func unescape(s string) string {
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// secretForms returns the ways a library may have written the secret s.
func secretForms(s string) []string {
	if s == "" {
		return nil
	}
	forms := []string{s}
	vals := []string{s, unescape(s)}
	if v, err := url.PathUnescape(s); err == nil {
		vals = append(vals, v) // '+' kept, where QueryUnescape makes it a space
	}
	// A compound value (MongoDB's authMechanismProperties=K:V,K2:V2) may
	// be quoted in parts.
	for _, part := range strings.FieldsFunc(unescape(s), func(r rune) bool { return r == ',' || r == ':' }) {
		if len(part) >= 4 && part != s {
			vals = append(vals, part)
		}
	}
	for _, v := range vals {
		forms = append(forms, v, url.QueryEscape(v), url.PathEscape(v),
			strings.TrimPrefix(url.UserPassword("", v).String(), ":"),
			strings.Trim(strconv.Quote(v), `"`))
	}
	return forms
}

// maxDepth bounds the recursion into nested URLs.
const maxDepth = 4

// redact is RedactURL that also returns the secrets it removed.
func redact(raw string, depth int) (string, []string) {
	var secrets []string
	prefix, rest := "", raw
	isURL := false
	if i := strings.Index(raw, "://"); i >= 0 && isScheme(raw[:i]) {
		prefix, rest, isURL = raw[:i+3], raw[i+3:], true
	} else if i := strings.IndexByte(raw, ':'); i > 0 && isScheme(raw[:i]) {
		// scheme:opaque: parsed like a string that is not a URL, since
		// "host:5432 password=x" looks like one too.
		prefix, rest = raw[:i+1], raw[i+1:]
	}

	// Userinfo: the text before the last '@' of the authority. The
	// authority ends at the first '?' or '#', except that an '@' in the
	// first name of the query ("u:p?w@host", a password with an unescaped
	// '?') still ends a userinfo.
	q := strings.IndexAny(rest, "?#")
	if q < 0 {
		q = len(rest)
	}
	at := strings.LastIndexByte(rest[:q], '@')
	if q < len(rest) {
		seg := rest[q:]
		if j := strings.IndexAny(seg, "=&;"); j >= 0 {
			seg = seg[:j]
		}
		if k := strings.LastIndexByte(seg, '@'); k >= 0 {
			at = q + k
		}
	}
	var out strings.Builder
	out.WriteString(prefix)
	if at >= 0 && !isURL && prefix != "" && !strings.ContainsAny(rest[:at], "/?#") {
		// "user:password@host/db" without a scheme parses as scheme
		// "user" and opaque "password@host/db": what looks like the
		// scheme is the user name, and the rest of the userinfo is
		// the password.
		out.WriteString(Redacted)
		secrets = append(secrets, rest[:at])
		out.WriteByte('@')
		rest = rest[at+1:]
	} else if at >= 0 {
		ui := rest[:at]
		switch c := strings.IndexByte(ui, ':'); {
		case c >= 0:
			out.WriteString(ui[:c+1] + Redacted)
			secrets = append(secrets, ui[c+1:])
		case strings.ContainsAny(ui, "/?#&=;"):
			// Not a user name: something else went wrong; hide it all.
			out.WriteString(Redacted)
			secrets = append(secrets, ui)
		default:
			out.WriteString(ui)
		}
		out.WriteByte('@')
		rest = rest[at+1:]
	}

	// The rest: host and path kept; query and fragment parameters
	// redacted. In a string that is not a URL, white space also separates
	// parameters (a key=value DSN).
	seps := "&;"
	if !isURL {
		seps = "&; \t\r\n"
	}
	q = strings.IndexAny(rest, "?#")
	if q < 0 {
		if isURL {
			out.WriteString(rest)
			return out.String(), secrets
		}
		q = 0
	}
	out.WriteString(rest[:q])
	s, sec := redactParams(rest[q:], seps, depth)
	out.WriteString(s)
	return out.String(), append(secrets, sec...)
}

// redactParams redacts name=value pairs in s, keeping the separators
// (and the '?' or '#' that s may start with) as written.
func redactParams(s, seps string, depth int) (string, []string) {
	var out strings.Builder
	var secrets []string
	for len(s) > 0 {
		if s[0] == '?' || s[0] == '#' || strings.IndexByte(seps, s[0]) >= 0 {
			out.WriteByte(s[0])
			s = s[1:]
			continue
		}
		end := strings.IndexAny(s, seps+"?#")
		if end < 0 {
			end = len(s)
		}
		pair := s[:end]
		s = s[end:]
		name, value, ok := strings.Cut(pair, "=")
		switch {
		case !ok:
			out.WriteString(pair)
		case IsSecretParam(name):
			out.WriteString(name + "=" + Redacted)
			if value != "" {
				secrets = append(secrets, value)
			}
		default:
			out.WriteString(name + "=")
			v := unescape(value)
			if strings.Contains(v, "://") || strings.Contains(v, "@") {
				if depth >= maxDepth {
					// Nested too deep to look into: hide it all.
					out.WriteString(Redacted)
					secrets = append(secrets, value)
					break
				}
				rv, sec := redact(v, depth+1)
				if rv != v {
					out.WriteString(url.QueryEscape(rv))
					secrets = append(secrets, sec...)
					break
				}
			}
			out.WriteString(value)
		}
	}
	return out.String(), secrets
}

// isScheme reports whether s is a URL scheme: a letter, then letters,
// digits, '+', '-' or '.'.
func isScheme(s string) bool {
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// CheckPorts checks the port of every host in u's host part (a
// comma-separated list, as multi-host URLs have): each port that is given
// must be a decimal number from 1 to 65535. It returns an
// *InvalidOptionError naming the URL (redacted) otherwise, so that a bad
// port is a bad URL on every backend rather than a failure to connect.
func CheckPorts(u *url.URL) error {
	if u == nil || u.Host == "" {
		return nil
	}
	for _, h := range strings.Split(u.Host, ",") {
		i := strings.LastIndexByte(h, ':')
		if i < 0 || strings.HasSuffix(h, "]") {
			continue
		}
		port := h[i+1:]
		if port == "" {
			continue
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || port[0] == '+' || port[0] == '-' {
			return InvalidURL(u.String(), "bad port "+strconv.Quote(port)+" (want 1 to 65535)")
		}
	}
	return nil
}
