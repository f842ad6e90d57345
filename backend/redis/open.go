package redis

import (
	"context"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/driver"
)

// Open opens a Backend from a URL; the backend owns its go-redis client and
// closes it on Close. The URL's forms and parameters are in the package
// documentation, under URLs; a URL that cannot be used, a bad port
// included, is an *InvalidOptionError.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "cannot be parsed")
	}
	return OpenURL(ctx, u)
}

// OpenURL is Open for a parsed URL.
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	client, opts, err := clientFromURL(u)
	if err != nil {
		return nil, err
	}
	b, err := newBackend(ctx, client, true, opts)
	if err != nil {
		_ = client.Close()
		return nil, driver.RedactError(err, u.String())
	}
	return b, nil
}

func badURL(u *url.URL, reason string) error {
	return driver.InvalidURL(u.String(), reason)
}

// clientFromURL builds the go-redis client a URL names, without
// connecting.
func clientFromURL(u *url.URL) (goredis.UniversalClient, *Options, error) {
	scheme := strings.ToLower(u.Scheme)
	base, kind, _ := strings.Cut(scheme, "+")
	if base != "redis" && base != "rediss" || (kind != "" && kind != "sentinel" && kind != "cluster") {
		return nil, nil, badURL(u, "scheme must be one of "+strings.Join(Schemes, ", "))
	}
	if err := driver.CheckPorts(u); err != nil {
		return nil, nil, err
	}
	p := driver.NewParams(u)
	opts := &Options{
		Prefix:     p.String("prefix", DefaultPrefix),
		SkipChecks: p.Bool("skip_checks", false),
		// wait_replicas=N and wait_timeout=DURATION: Options.WaitReplicas
		// and WaitTimeout (replica-acknowledged grants).
		WaitReplicas: p.Int("wait_replicas", 0),
		WaitTimeout:  p.Duration("wait_timeout", 0),
	}
	var sentinelUser, sentinelPass string
	if kind == "sentinel" {
		sentinelUser = p.String("sentinel_username", "")
		sentinelPass = p.String("sentinel_password", "")
	}
	rest := p.Rest()
	if err := p.Err(); err != nil {
		return nil, nil, err
	}
	// go-redis keeps one value of a repeated parameter; refuse the
	// repeat, as driver.Params does for this package's own.
	for _, name := range slices.Sorted(maps.Keys(rest)) {
		if len(rest[name]) > 1 && name != "addr" {
			return nil, nil, &driver.InvalidOptionError{Option: "URL parameter " + strconv.Quote(name), Value: strconv.Itoa(len(rest[name])) + " values", Reason: "given more than once"}
		}
	}
	if err := opts.Validate(); err != nil {
		return nil, nil, err
	}
	if opts.Prefix == "" {
		return nil, nil, &driver.InvalidOptionError{Option: "URL parameter \"prefix\"", Value: `""`, Reason: "empty (leave it out for the default, " + DefaultPrefix + ")"}
	}
	for _, reserved := range []string{"addr", "master_name"} {
		if rest.Has(reserved) && kind != "" {
			return nil, nil, badURL(u, "parameter "+reserved+" is not used: list the hosts in the URL's host part, comma-separated")
		}
	}
	goErr := func(err error) error {
		if names, ok := strings.CutPrefix(err.Error(), "redis: unexpected option: "); ok {
			// go-redis names the parameters it does not know, and no
			// others: list them, with the one probably meant.
			first, _, _ := strings.Cut(names, ",")
			known := append([]string{"prefix", "skip_checks", "wait_replicas", "wait_timeout"}, goredisParams[kind]...)
			if kind == "sentinel" {
				known = append(known, "sentinel_username", "sentinel_password")
			}
			return driver.UnknownParam(strings.TrimSpace(first), known)
		}
		// go-redis names the parameter or value at fault; it is
		// redacted all the same, in case a value was a secret.
		return badURL(u, driver.RedactText(strings.TrimPrefix(err.Error(), "redis: "), u.String()))
	}
	hosts := strings.Split(u.Host, ",")
	for _, h := range hosts {
		if h == "" && kind != "" {
			return nil, nil, badURL(u, "empty host in the host list")
		}
	}
	switch kind {
	case "":
		if len(hosts) > 1 {
			return nil, nil, badURL(u, "a "+base+":// URL names one server; for a primary with replicas use "+base+"+sentinel://SENTINEL,…/MASTER, for a Cluster "+base+"+cluster://NODE,…")
		}
		gu := *u
		gu.Scheme = base
		gu.RawQuery = rest.Encode()
		o, err := goredis.ParseURL(gu.String())
		if err != nil {
			return nil, nil, goErr(err)
		}
		o.ContextTimeoutEnabled = true
		o.MaxRetries, o.DialerRetries = failFast(rest, o.MaxRetries, o.DialerRetries)
		return goredis.NewClient(o), opts, nil

	case "sentinel":
		parts := strings.FieldsFunc(u.Path, func(r rune) bool { return r == '/' })
		switch len(parts) {
		case 1:
		case 2:
			if rest.Has("db") {
				return nil, nil, badURL(u, "database given both in the path and as db=")
			}
			rest.Set("db", parts[1])
		default:
			return nil, nil, badURL(u, "the path must be /MASTER_NAME or /MASTER_NAME/DB")
		}
		rest.Set("master_name", parts[0])
		for _, h := range hosts[1:] {
			rest.Add("addr", h)
		}
		gu := url.URL{Scheme: base, Host: hosts[0], RawQuery: rest.Encode()}
		o, err := goredis.ParseFailoverURL(gu.String())
		if err != nil {
			return nil, nil, goErr(err)
		}
		o.ContextTimeoutEnabled = true
		o.MaxRetries, o.DialerRetries = failFast(rest, o.MaxRetries, o.DialerRetries)
		o.SentinelUsername, o.SentinelPassword = sentinelUser, sentinelPass
		o.Username, o.Password = "", ""
		if u.User != nil {
			o.Username = u.User.Username()
			o.Password, _ = u.User.Password()
		}
		return goredis.NewFailoverClient(o), opts, nil

	default: // cluster
		if u.Path != "" && u.Path != "/" {
			return nil, nil, badURL(u, "a Cluster URL has no path (Cluster has only database 0)")
		}
		for _, h := range hosts[1:] {
			rest.Add("addr", h)
		}
		gu := url.URL{Scheme: base, User: u.User, Host: hosts[0], RawQuery: rest.Encode()}
		o, err := goredis.ParseClusterURL(gu.String())
		if err != nil {
			return nil, nil, goErr(err)
		}
		o.ContextTimeoutEnabled = true
		o.MaxRetries, o.DialerRetries = failFast(rest, o.MaxRetries, o.DialerRetries)
		return goredis.NewClusterClient(o), opts, nil
	}
}

// goredisParams are the query parameters go-redis's URL parsers read, by
// URL kind ("" for a single server, "sentinel", "cluster"), for the error
// that names an unknown one. addr and master_name are left out: the URL's
// host list and path give them.
var goredisParams = map[string][]string{
	"": {"client_name", "conn_max_idle_time", "conn_max_lifetime", "db", "dial_timeout",
		"max_active_conns", "max_idle_conns", "max_retries", "max_retry_backoff", "min_idle_conns",
		"min_retry_backoff", "pool_fifo", "pool_size", "pool_timeout", "protocol", "read_timeout", "skip_verify", "write_timeout"},
	"sentinel": {"client_name", "conn_max_idle_time", "conn_max_lifetime", "db", "dial_timeout", "dialer_retries",
		"max_active_conns", "max_idle_conns", "max_retries", "max_retry_backoff", "min_idle_conns",
		"min_retry_backoff", "pool_fifo", "pool_size", "pool_timeout", "protocol", "read_timeout", "replica_only",
		"route_by_latency", "route_randomly", "skip_verify", "use_disconnected_replicas", "write_timeout"},
	"cluster": {"client_name", "conn_max_idle_time", "conn_max_lifetime", "dial_timeout", "dialer_retries",
		"max_active_conns", "max_idle_conns", "max_redirects", "max_retries", "max_retry_backoff", "min_idle_conns",
		"min_retry_backoff", "pool_fifo", "pool_size", "pool_timeout", "protocol", "read_only", "read_timeout",
		"route_by_latency", "route_randomly", "write_timeout"},
}

// Defaults of a URL's client where go-redis's would hide a refused
// connection for seconds: go-redis dials up to 5 times, 100ms apart, in
// each of up to 4 attempts of a command (and a Sentinel client nests the
// same again when it asks the Sentinels for the primary), so a server
// that refuses connections was reported after about 2s (more than 30s
// through a Sentinel). One dial per attempt and one retry (for a pooled
// connection the server closed, as after a restart) report it within
// milliseconds; the engine, not the driver, decides whether to try again.
const (
	defaultMaxRetries    = 1
	defaultDialerRetries = 1
)

// failFast returns the retry counts of a URL's client: the URL's
// max_retries and dialer_retries (go-redis's parameters; dialer_retries
// exists only for Sentinel and Cluster URLs) where it gives them, else
// this package's defaults.
func failFast(q url.Values, maxRetries, dialerRetries int) (int, int) {
	if !q.Has("max_retries") {
		maxRetries = defaultMaxRetries
	}
	if !q.Has("dialer_retries") {
		dialerRetries = defaultDialerRetries
	}
	return maxRetries, dialerRetries
}
