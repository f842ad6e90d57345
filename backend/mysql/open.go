package mysql

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fencelock/fencelock/driver"
)

// DefaultPort is the port of a URL without one.
const DefaultPort = "3306"

// defaultDialTimeout bounds a connection's establishment when the URL
// has no timeout=.
const defaultDialTimeout = 10 * time.Second

// errUnknownVariable is ER_UNKNOWN_SYSTEM_VARIABLE: a URL parameter that
// the driver passed on as a session variable, unknown to the server too.
const errUnknownVariable = 1193

// Open returns a Backend that owns its connections, from a URL
//
//	mysql://[user[:password]@]host[:port]/database[?params]
//	mariadb://… (the same)
//
// See the package documentation's URLs section for the parameters. No
// credential from the URL appears in an error: see driver.RedactURL.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "cannot be parsed")
	}
	return OpenURL(ctx, u)
}

// OpenURL is Open for a parsed URL (scheme mysql or mariadb).
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	raw := u.String()
	redacted := driver.RedactURL(raw)
	scheme := strings.ToLower(u.Scheme)
	if scheme != "mysql" && scheme != "mariadb" {
		return nil, driver.InvalidURL(raw, "scheme must be mysql or mariadb")
	}
	if err := driver.CheckPorts(u); err != nil {
		return nil, err
	}
	cfg, o, maxConns, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, &driver.InvalidOptionError{Option: "URL", Value: redacted, Reason: "rejected by the MySQL driver: " + driver.RedactText(err.Error(), raw)}
	}
	db := sql.OpenDB(boundedConnector{Connector: connector, addr: cfg.Addr, timeout: cfg.Timeout})
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	// Below the servers' default wait_timeout (8 hours) and any
	// load balancer's idle timeout.
	db.SetConnMaxIdleTime(5 * time.Minute)
	b, err := New(ctx, db, o)
	if err != nil {
		db.Close()
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == errUnknownVariable {
			return nil, &driver.InvalidOptionError{Option: "URL parameter", Value: redacted,
				Reason: "unknown to fencelock, the MySQL driver and the server: " + driver.RedactText(me.Message, raw)}
		}
		var ie *driver.InvalidOptionError
		if errors.As(err, &ie) {
			return nil, err
		}
		if errors.As(err, &me) {
			if hint := loginHint[me.Number]; hint != "" {
				return nil, fmt.Errorf("mysql: %s: %w; %s", redacted, driver.RedactError(err, raw), hint)
			}
		}
		return nil, fmt.Errorf("mysql: %s: %w", redacted, driver.RedactError(err, raw))
	}
	b.owned = true
	return b, nil
}

// loginHint says how to fix the server's refusals of a login, by error
// number.
var loginHint = map[uint16]string{
	1045: "check the URL's user and password (percent-encoded: mysql://USER:PASSWORD@host/db) and that the account may log in from this host",
	1044: "grant the URL's user access to the database (GRANT ALL ON db.* TO 'user'@'host'), or name another in the URL's path",
	1049: "create the database (CREATE DATABASE db) or correct the URL's path",
}

// DriverConfig returns the github.com/go-sql-driver/mysql configuration
// that Open makes of a mysql:// or mariadb:// URL (credentials, TLS, the
// driver's parameters and session variables; this package's own, such as
// table=, are left out), for a pool of your own to pass to New:
//
//	cfg, err := mysql.DriverConfig(u)
//	connector, err := gomysql.NewConnector(cfg)
//	b, err := mysql.New(ctx, sql.OpenDB(connector), &mysql.Options{Table: "locks"})
func DriverConfig(u *url.URL) (*mysql.Config, error) {
	if s := strings.ToLower(u.Scheme); s != "mysql" && s != "mariadb" {
		return nil, driver.InvalidURL(u.String(), "scheme must be mysql or mariadb")
	}
	if err := driver.CheckPorts(u); err != nil {
		return nil, err
	}
	cfg, _, _, err := parseURL(u)
	return cfg, err
}

// parseURL turns the URL into the driver's configuration, the backend's
// options and the pool size.
func parseURL(u *url.URL) (*mysql.Config, *Options, int, error) {
	p := driver.NewParams(u)
	o := &Options{Table: p.String("table", "")}
	o.SkipCreate = !p.Bool("create_table", true)
	maxConns := p.Int("max_open_conns", DefaultMaxOpenConns())
	socket := p.String("socket", "")
	tlsMode := p.String("tls", "")
	tlsCA := p.String("tls_ca", "")
	tlsCert := p.String("tls_cert", "")
	tlsKey := p.String("tls_key", "")
	tlsServerName := p.String("tls_server_name", "")
	rest := p.Rest()
	if err := p.Err(); err != nil {
		return nil, nil, 0, err
	}
	for k, vs := range rest {
		switch strings.ToLower(k) {
		case "password", "user", "username":
			// The driver would send SET password = … (which, given a
			// hash, changes the account's password) or SET user = ….
			shown := strings.Join(vs, ",")
			if driver.IsSecretParam(k) {
				shown = driver.Redacted
			}
			return nil, nil, 0, &driver.InvalidOptionError{Option: "URL parameter " + strconv.Quote(k), Value: shown,
				Reason: "credentials go in the URL's user information, percent-encoded: mysql://USER:PASSWORD@host:3306/database"}
		}
		if len(vs) > 1 {
			shown := strings.Join(vs, ",")
			if driver.IsSecretParam(k) {
				shown = driver.Redacted
			}
			return nil, nil, 0, &driver.InvalidOptionError{Option: "URL parameter " + strconv.Quote(k), Value: shown, Reason: "given more than once"}
		}
	}
	if maxConns < 1 {
		return nil, nil, 0, &driver.InvalidOptionError{Option: "URL parameter \"max_open_conns\"", Value: strconv.Itoa(maxConns), Reason: "must be positive"}
	}
	if err := o.Validate(); err != nil {
		return nil, nil, 0, err
	}
	// The driver's own parameters (timeout, readTimeout, charset,
	// interpolateParams, …) and session variables, as its DSN has them.
	dsn := "/"
	if len(rest) > 0 {
		dsn += "?" + rest.Encode()
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, nil, 0, &driver.InvalidOptionError{Option: "URL parameters", Value: driver.RedactURL("?" + rest.Encode()), Reason: "rejected by the MySQL driver: " + driver.RedactText(err.Error(), u.String())}
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" || strings.Contains(cfg.DBName, "/") {
		return nil, nil, 0, driver.InvalidURL(u.String(), "the path must name the database: mysql://user@host:3306/DATABASE")
	}
	switch {
	case socket != "":
		if u.Host != "" && u.Hostname() != "localhost" {
			return nil, nil, 0, driver.InvalidURL(u.String(), "socket= is a unix socket: leave the host empty or localhost (mysql://user@localhost/db?socket=/run/mysqld/mysqld.sock)")
		}
		cfg.Net, cfg.Addr = "unix", socket
	case u.Host == "":
		return nil, nil, 0, driver.InvalidURL(u.String(), "no host: write mysql://user@HOST[:PORT]/database, or socket=PATH for a unix socket")
	default:
		port := u.Port()
		if port == "" {
			port = DefaultPort
		}
		cfg.Net, cfg.Addr = "tcp", net.JoinHostPort(u.Hostname(), port)
	}
	// The driver logs connection errors to stderr by default; a backend
	// logs nothing unless given a logger, and the errors reach the caller.
	cfg.Logger = mysql.Logger(discard{})
	if !rest.Has("interpolateParams") {
		// One round trip per statement; the driver escapes the values.
		cfg.InterpolateParams = true
	}
	if !rest.Has("timeout") {
		cfg.Timeout = defaultDialTimeout
	}
	if err := applyTLS(cfg, u, tlsMode, tlsCA, tlsCert, tlsKey, tlsServerName); err != nil {
		return nil, nil, 0, err
	}
	return cfg, o, maxConns, nil
}

// applyTLS sets cfg.TLS from tls= (false, true, skip-verify, preferred)
// and the files of tls_ca=, tls_cert= and tls_key=.
func applyTLS(cfg *mysql.Config, u *url.URL, mode, ca, cert, key, serverName string) error {
	bad := func(param, value, reason string) error {
		if driver.IsSecretParam(param) {
			value = driver.Redacted
		}
		return &driver.InvalidOptionError{Option: "URL parameter " + strconv.Quote(param), Value: value, Reason: reason}
	}
	files := ca != "" || cert != "" || key != ""
	switch strings.ToLower(mode) {
	case "":
		if !files {
			return nil
		}
		mode = "true"
	case "false":
		if files {
			return bad("tls", mode, "tls=false with tls_ca, tls_cert or tls_key: drop them or set tls=true")
		}
		return nil
	case "true", "skip-verify", "preferred":
	default:
		return bad("tls", mode, "must be true, false, skip-verify or preferred")
	}
	if (cert == "") != (key == "") {
		return bad("tls_cert", cert, "tls_cert and tls_key go together (a client certificate and its key)")
	}
	host := serverName
	if host == "" {
		host = u.Hostname()
	}
	c := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	switch strings.ToLower(mode) {
	case "skip-verify":
		c.InsecureSkipVerify = true
	case "preferred":
		c.InsecureSkipVerify = true
		cfg.AllowFallbackToPlaintext = true
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return bad("tls_ca", ca, "cannot be read: "+err.Error())
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return bad("tls_ca", ca, "holds no PEM certificate")
		}
		c.RootCAs = pool
	}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return bad("tls_cert", cert, "with tls_key: "+err.Error())
		}
		c.Certificates = []tls.Certificate{kp}
	}
	cfg.TLS = c
	return nil
}

// boundedConnector bounds a connection's whole establishment (dial,
// handshake, authentication and the session variables) by the URL's
// timeout=: the driver bounds only the dial with it, and a server that
// accepts the connection but never answers (paused, or not MySQL) would
// otherwise hold a call without a deadline for ever.
type boundedConnector struct {
	sqldriver.Connector
	addr    string
	timeout time.Duration
}

func (c boundedConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	if c.timeout <= 0 {
		return c.Connector.Connect(ctx)
	}
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	conn, err := c.Connector.Connect(cctx)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		return nil, fmt.Errorf("no answer from %s within timeout=%s (connecting, handshake and login): the server accepts connections but does not reply (paused, overloaded, or not MySQL); check it, or raise timeout= in the URL: %w", c.addr, c.timeout, err)
	}
	return conn, err
}

// discard is the driver's logger: it drops everything.
type discard struct{}

func (discard) Print(...any) {}
