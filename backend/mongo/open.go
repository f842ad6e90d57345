package mongo

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/fencelock/fencelock/driver"
)

// Open connects to the MongoDB deployment at rawURL and returns a Backend
// that owns its client (Close disconnects it). The URL's parameters are in
// the package doc's URLs section.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "cannot be parsed")
	}
	return OpenURL(ctx, u)
}

// OpenURL is Open for a parsed URL. It reads fencelock's own parameters
// (database, collection, namespace, clock_resync) and
// passes every other parameter (replicaSet, authSource, tls, w,
// readConcernLevel, ...) to the driver's connection-string parser; a
// parameter that is neither is refused.
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	raw := u.String()
	scheme := strings.ToLower(u.Scheme)
	if scheme != Scheme && scheme != SchemeSRV {
		return nil, driver.InvalidURL(raw, "scheme must be mongodb or mongodb+srv")
	}
	if err := driver.CheckPorts(u); err != nil {
		return nil, err
	}
	p := driver.NewParams(u)
	var o Options
	o.Database = p.String("database", "")
	o.Collection = p.String("collection", "")
	o.Namespace = p.String("namespace", "")
	o.ClockResync = p.Duration("clock_resync", 0)
	// The rest go to the driver: taken before Err, which would refuse
	// every parameter not read as unknown.
	rest := p.Rest()
	if err := p.Err(); err != nil {
		return nil, err
	}
	for name := range rest {
		if !driverParams[strings.ToLower(name)] {
			// The driver ignores options it does not know; a typo must
			// not silently drop a setting.
			return nil, &driver.InvalidOptionError{Option: "URL parameter", Value: strconv.Quote(name),
				Reason: "unknown; fencelock's are clock_resync, collection, database, namespace; the rest must be MongoDB connection-string options (replicaSet, authSource, tls, w, ...)"}
		}
	}
	if o.Database == "" {
		o.Database = strings.TrimPrefix(u.Path, "/")
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	du := *u
	du.Scheme = scheme
	du.RawQuery = rest.Encode()
	copts := options.Client().ApplyURI(du.String())
	if err := copts.Validate(); err != nil {
		return nil, driver.InvalidURL(raw, driver.RedactText(err.Error(), raw))
	}
	// Concerns given in the URL are the user's choice; otherwise the
	// backend's safe defaults apply.
	has := func(name string) bool {
		for k := range rest {
			if strings.EqualFold(k, name) {
				return true
			}
		}
		return false
	}
	if (has("w") || has("journal")) && copts.WriteConcern != nil {
		o.WriteConcern = copts.WriteConcern
	}
	if has("readConcernLevel") && copts.ReadConcern != nil {
		o.ReadConcern = copts.ReadConcern
	}
	// A server that does not answer must not hold a call for the
	// driver's default 30s (see reach.go).
	if copts.ServerSelectionTimeout == nil {
		copts.SetServerSelectionTimeout(DefaultServerSelectionTimeout)
	}
	if copts.ConnectTimeout == nil {
		copts.SetConnectTimeout(DefaultConnectTimeout)
	}
	r := &reach{}
	copts.SetServerMonitor(r.monitor())
	client, err := mongo.Connect(copts)
	if err != nil {
		return nil, fmt.Errorf("mongo: connecting to %s: %w", driver.RedactURL(raw), driver.RedactError(err, raw))
	}
	b, err := openBackend(ctx, client, true, r, &o)
	if err != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(dctx)
		return nil, driver.RedactError(err, raw)
	}
	return b, nil
}

// Driver settings Open uses when the URL does not give them
// (serverSelectionTimeoutMS, connectTimeoutMS): the driver's defaults
// (30s each) would hold a call on a server that does not answer far
// beyond a lease's TTL.
const (
	DefaultServerSelectionTimeout = 5 * time.Second
	DefaultConnectTimeout         = 5 * time.Second
)

// driverParams are the MongoDB connection-string options (lower case)
// that Open passes to the driver.
var driverParams = func() map[string]bool {
	m := make(map[string]bool)
	for _, n := range strings.Fields(`appname authmechanism authmechanismproperties authsource compressors
		connecttimeoutms directconnection heartbeatfrequencyms journal loadbalanced localthresholdms
		maxconnecting maxidletimems maxpoolsize minpoolsize maxstalenessseconds readconcernlevel
		readpreference readpreferencetags replicaset retryreads retrywrites serverselectiontimeoutms
		serverselectiontryonce sockettimeoutms srvmaxhosts srvservicename ssl tls
		tlsallowinvalidcertificates tlsallowinvalidhostnames tlscafile tlscertificatekeyfile
		tlscertificatekeyfilepassword tlsinsecure tlsdisableocspendpointcheck
		tlsdisablecertificaterevocationcheck w wtimeoutms zlibcompressionlevel zstdcompressionlevel
		timeoutms proxyhost proxyport proxyusername proxypassword servermonitoringmode
		waitqueuetimeoutms gssapiservicename`) {
		m[n] = true
	}
	return m
}()
