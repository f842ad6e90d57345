package zookeeper

import (
	"context"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock/driver"
)

// Open connects to the ZooKeeper ensemble named by rawURL and returns a
// Backend that owns the connection: its Close closes it. The URL's form and
// parameters are in the package documentation, under URLs.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "cannot be parsed")
	}
	return OpenURL(ctx, u)
}

// OpenURL is Open for a parsed URL (scheme "zk").
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	raw := u.String()
	if !strings.EqualFold(u.Scheme, "zk") {
		return nil, driver.InvalidURL(raw, "scheme must be zk")
	}
	if err := driver.CheckPorts(u); err != nil {
		return nil, err
	}
	p := driver.NewParams(u)
	sessTO := p.Duration("session_timeout", DefaultSessionTimeout)
	prefix := p.String("prefix", "fencelock")
	connTO := p.Duration("connect_timeout", DefaultConnectTimeout)
	if err := p.Err(); err != nil {
		return nil, err
	}
	if u.User != nil {
		return nil, driver.InvalidURL(raw, "credentials in zk URLs are not supported; pass an authenticated *zk.Conn to New")
	}
	if sessTO < 10*time.Millisecond || sessTO > 24*time.Hour {
		return nil, &driver.InvalidOptionError{Option: "URL parameter \"session_timeout\"", Value: sessTO.String(), Reason: "must be between 10ms and 24h (the server clamps it to 2..20 × tickTime by default)"}
	}
	if connTO <= 0 {
		return nil, &driver.InvalidOptionError{Option: "URL parameter \"connect_timeout\"", Value: connTO.String(), Reason: "must be positive"}
	}
	if u.Host == "" {
		return nil, driver.InvalidURL(raw, "no servers: want zk://host:port[,host:port...]/chroot")
	}
	var servers []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return nil, driver.InvalidURL(raw, "empty server in host list")
		}
		servers = append(servers, h)
	}
	root := path.Join("/", u.Path, prefix)
	if u.Path != "" && u.Path != "/" && path.Clean(u.Path) != strings.TrimSuffix(u.Path, "/") {
		return nil, &driver.InvalidOptionError{Option: "URL path", Value: strconv.Quote(u.Path), Reason: "must be a clean znode path"}
	}
	o, err := (&Options{Prefix: root}).resolve()
	if err != nil {
		return nil, err
	}
	b, err := dial(ctx, servers, sessTO, connTO, o)
	if err != nil {
		return nil, driver.RedactError(err, raw)
	}
	return b, nil
}
