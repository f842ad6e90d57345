package nats

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencelock/fencelock/driver"
)

// Open connects to the NATS servers named by rawURL and returns a Backend
// that owns the connection: its Close closes it. The URL's form and its
// parameters are in the package documentation, under URLs.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "not a URL")
	}
	return OpenURL(ctx, u)
}

// config is what an Open URL says.
type config struct {
	servers        []string
	opts           []natsgo.Option
	backend        Options
	connectTimeout time.Duration
}

// OpenURL is Open for a parsed URL (scheme nats or nats+tls).
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	raw := u.String()
	cfg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	opts := append([]natsgo.Option{
		natsgo.Name("fencelock"),
		natsgo.Timeout(cfg.connectTimeout),
		// Reconnect for as long as it takes, quickly: a server restart
		// should not end the backend. Nothing is buffered while
		// disconnected: a request then fails at once, as a transient
		// error, instead of being sent whenever the connection is back.
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(100 * time.Millisecond),
		natsgo.ReconnectJitter(100*time.Millisecond, 100*time.Millisecond),
		natsgo.ReconnectBufSize(-1),
		natsgo.NoCallbacksAfterClientClose(),
		// The servers are those the URL lists, not those the cluster
		// announces: what the URL names is what the program reaches.
		natsgo.IgnoreDiscoveredServers(),
	}, cfg.opts...)
	nc, err := natsgo.Connect(strings.Join(cfg.servers, ","), opts...)
	if err != nil {
		if errors.Is(err, natsgo.ErrNoServers) {
			// The client keeps no server's own error: dial them to name
			// the cause (a refused connection, a name that does not
			// resolve).
			if cause := dialCause(ctx, cfg.servers, cfg.connectTimeout); cause != nil {
				err = fmt.Errorf("%w: %w", err, cause)
			}
		}
		return nil, fmt.Errorf("nats: connect to %s (is the NATS server running, and are the hosts and ports right?): %w", driver.RedactURL(raw), driver.RedactError(err, raw))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, driver.RedactError(err, raw)
	}
	nctx, cancel := context.WithTimeout(ctx, cfg.connectTimeout)
	defer cancel()
	b, err := New(nctx, js, &cfg.backend)
	if err != nil {
		nc.Close()
		var oe *driver.InvalidOptionError
		var ue *driver.UnsupportedError
		if errors.As(err, &oe) || errors.As(err, &ue) {
			return nil, err
		}
		return nil, fmt.Errorf("nats: %s: %w", driver.RedactURL(raw), driver.RedactError(err, raw))
	}
	b.own = true
	return b, nil
}

// parseURL turns an Open URL into the connection's servers and options
// and the backend's Options, checking both.
func parseURL(u *url.URL) (config, error) {
	raw := u.String()
	bad := func(reason string) error { return driver.InvalidURL(raw, reason) }
	scheme := strings.ToLower(u.Scheme)
	if scheme != Scheme && scheme != SchemeTLS {
		return config{}, bad("scheme must be nats or nats+tls")
	}
	if u.Opaque != "" || u.Host == "" {
		return config{}, bad("want nats://host:port[,host:port...][?params]")
	}
	if u.Fragment != "" {
		return config{}, bad("fragments are not allowed")
	}
	if u.Path != "" && u.Path != "/" {
		return config{}, bad("a path is not allowed; name the bucket with ?bucket=")
	}
	var cfg config
	tlsScheme := "nats"
	if scheme == SchemeTLS {
		tlsScheme = "tls"
	}
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return config{}, bad("empty host in the server list")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "4222")
		}
		_, port, err := net.SplitHostPort(h)
		if err != nil {
			return config{}, bad("bad host " + strconv.Quote(h))
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return config{}, bad("bad port " + strconv.Quote(port))
		}
		cfg.servers = append(cfg.servers, tlsScheme+"://"+h)
	}

	p := driver.NewParams(u)
	cfg.backend.Bucket = p.String("bucket", DefaultBucket)
	cfg.backend.Replicas = p.Int("replicas", 1)
	storage := p.String("storage", "file")
	cfg.connectTimeout = p.Duration("connect_timeout", 5*time.Second)
	token := p.String("token", "")
	creds := p.String("creds", "")
	nkey := p.String("nkey", "")
	var caFile, certFile, keyFile, serverName string
	if scheme == SchemeTLS {
		caFile = p.String("ca_file", "")
		certFile = p.String("cert_file", "")
		keyFile = p.String("key_file", "")
		serverName = p.String("server_name", "")
	}
	if err := p.Err(); err != nil {
		return config{}, err
	}
	switch strings.ToLower(storage) {
	case "file":
		cfg.backend.Storage = jetstream.FileStorage
	case "memory":
		cfg.backend.Storage = jetstream.MemoryStorage
	default:
		return config{}, &driver.InvalidOptionError{Option: "URL parameter \"storage\"", Value: strconv.Quote(storage), Reason: "must be file or memory"}
	}
	if cfg.connectTimeout <= 0 {
		return config{}, &driver.InvalidOptionError{Option: "URL parameter \"connect_timeout\"", Value: cfg.connectTimeout.String(), Reason: "must be positive"}
	}
	if _, err := cfg.backend.resolve(); err != nil {
		return config{}, err
	}

	// Credentials: one kind at most.
	kinds := 0
	if u.User != nil {
		kinds++
		user := u.User.Username()
		pw, ok := u.User.Password()
		if !ok {
			// NATS reads nats://TOKEN@host as a token, but a URL's user
			// name is shown wherever the URL is (only passwords are
			// redacted): a token goes in token=.
			return config{}, bad("a user name without a password; write user:password@, or give a token as ?token=")
		}
		cfg.opts = append(cfg.opts, natsgo.UserInfo(user, pw))
	}
	if token != "" {
		kinds++
		cfg.opts = append(cfg.opts, natsgo.Token(token))
	}
	if creds != "" {
		kinds++
		if _, err := os.Stat(creds); err != nil {
			return config{}, bad("creds: " + driver.RedactText(err.Error(), raw))
		}
		cfg.opts = append(cfg.opts, natsgo.UserCredentials(creds))
	}
	if nkey != "" {
		kinds++
		opt, err := natsgo.NkeyOptionFromSeed(nkey)
		if err != nil {
			return config{}, bad("nkey: the seed file cannot be read: " + driver.RedactText(err.Error(), raw))
		}
		cfg.opts = append(cfg.opts, opt)
	}
	if kinds > 1 {
		return config{}, bad("give one credential: user:password@ or token@ in the URL, token=, creds= or nkey=")
	}

	if scheme == SchemeTLS {
		if (certFile == "") != (keyFile == "") {
			return config{}, bad("cert_file and key_file must be given together")
		}
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
		if caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return config{}, bad("ca_file: " + driver.RedactText(err.Error(), raw))
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return config{}, bad("ca_file: no PEM certificates found")
			}
		}
		if certFile != "" {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return config{}, bad("cert_file/key_file: " + driver.RedactText(err.Error(), raw))
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		cfg.opts = append(cfg.opts, natsgo.Secure(tc))
	}
	return cfg, nil
}

// dialCause dials each server (scheme://host:port) once, within timeout
// in all, and returns the errors of those that cannot be reached, or nil.
func dialCause(ctx context.Context, servers []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	var errs []error
	for _, s := range servers {
		_, hp, _ := strings.Cut(s, "://")
		c, err := d.DialContext(ctx, "tcp", hp)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.Close()
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return &joined{msg: strings.Join(msgs, "; "), errs: errs}
}

// joined is errors.Join's error on one line.
type joined struct {
	msg  string
	errs []error
}

func (e *joined) Error() string   { return e.msg }
func (e *joined) Unwrap() []error { return e.errs }
