package etcd

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

	"github.com/fencelock/fencelock/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Open connects to the etcd cluster named by rawURL and returns a Backend
// that owns the connection: its Close closes it. The URL's form and its
// parameters are in the package documentation, under URLs.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "not a URL")
	}
	return OpenURL(ctx, u)
}

// OpenURL is Open for a parsed URL (scheme etcd or etcds).
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	raw := u.String()
	cfg, opts, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	cfg.Context = context.WithoutCancel(ctx)
	failFast(&cfg)
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: connect to %s: %w", driver.RedactURL(raw), driver.RedactError(err, raw))
	}
	withOneShotKeepAlive(cli)
	// clientv3 dials lazily: check that the cluster answers, so a wrong
	// address fails here rather than on the first lock. A refused
	// connection fails at once (failFast), naming the refusal.
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	_, err = cli.Get(pctx, opts.Prefix+"\x00", clientv3.WithCountOnly())
	cancel()
	if err != nil {
		cli.Close()
		err = driver.RedactError(err, raw)
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			// The caller's context ended: its error, and what the
			// cluster did meanwhile.
			return nil, fmt.Errorf("etcd: %s did not answer: %w: %w", driver.RedactURL(raw), cerr, err)
		}
		return nil, fmt.Errorf("etcd: %s did not answer: %w", driver.RedactURL(raw), err)
	}
	b, err := New(ctx, cli, &opts)
	if err != nil {
		cli.Close()
		return nil, driver.RedactError(err, raw)
	}
	b.own = true
	return b, nil
}

// parseURL turns an Open URL into the client's configuration (without its
// Context) and the backend's Options, checking both.
func parseURL(u *url.URL) (clientv3.Config, Options, error) {
	raw := u.String()
	bad := func(reason string) error {
		return driver.InvalidURL(raw, reason)
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "etcd" && scheme != "etcds" {
		return clientv3.Config{}, Options{}, bad("scheme must be etcd or etcds")
	}
	if u.Opaque != "" || u.Host == "" {
		return clientv3.Config{}, Options{}, bad("want etcd://host:port[,host:port...]/prefix/")
	}
	if u.Fragment != "" {
		return clientv3.Config{}, Options{}, bad("fragments are not allowed")
	}
	endpoints, err := parseEndpoints(u.Host, bad)
	if err != nil {
		return clientv3.Config{}, Options{}, err
	}

	var opts Options
	if p := u.Path; p != "" && p != "/" {
		if !strings.HasSuffix(p, "/") {
			p += "/"
		}
		opts.Prefix = p
	}
	params := driver.NewParams(u)
	dialTimeout := params.Duration("dial_timeout", 5*time.Second)
	opts.CleanupTimeout = params.Duration("cleanup_timeout", 0)
	var caFile, certFile, keyFile, serverName string
	if scheme == "etcds" {
		caFile = params.String("ca_file", "")
		certFile = params.String("cert_file", "")
		keyFile = params.String("key_file", "")
		serverName = params.String("server_name", "")
	}
	if err := params.Err(); err != nil {
		return clientv3.Config{}, Options{}, err
	}
	if dialTimeout <= 0 {
		return clientv3.Config{}, Options{}, &driver.InvalidOptionError{Option: "URL parameter \"dial_timeout\"", Value: dialTimeout.String(), Reason: "must be positive"}
	}
	if (certFile == "") != (keyFile == "") {
		return clientv3.Config{}, Options{}, bad("cert_file and key_file must be given together")
	}
	if _, err := opts.resolve(); err != nil {
		return clientv3.Config{}, Options{}, err
	}

	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: dialTimeout,
		Logger:      zap.NewNop(),
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	if scheme == "etcds" {
		cfg.TLS, err = tlsConfig(caFile, certFile, keyFile, serverName, raw, bad)
		if err != nil {
			return clientv3.Config{}, Options{}, err
		}
	}
	return cfg, opts, nil
}

// parseEndpoints splits a URL's host list into host:port endpoints, adding
// the default port 2379 where none is given.
func parseEndpoints(hosts string, bad func(string) error) ([]string, error) {
	var endpoints []string
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return nil, bad("empty host in the endpoint list")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "2379")
		}
		if _, port, err := net.SplitHostPort(h); err != nil {
			return nil, bad("bad host " + strconv.Quote(h))
		} else if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return nil, bad("bad port " + strconv.Quote(port))
		}
		endpoints = append(endpoints, h)
	}
	return endpoints, nil
}

// tlsConfig builds the TLS configuration of an etcds URL from its
// parameters; file errors are redacted against raw.
func tlsConfig(caFile, certFile, keyFile, serverName, raw string, bad func(string) error) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, bad("ca_file: " + driver.RedactText(err.Error(), raw))
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, bad("ca_file: no PEM certificates found")
		}
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, bad("cert_file/key_file: " + driver.RedactText(err.Error(), raw))
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
