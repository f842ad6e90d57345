package mongo_test

import (
	"net/url"
	"testing"

	"github.com/fencelock/fencelock/internal/faultproxy"
)

// newProxy starts a fault proxy in front of the server at the URL raw; it
// is closed when the test ends. Its Blackhole mode stands for a server
// that stops answering (as if SIGSTOPped, without pausing the shared
// server), Pass for one that resumes, and Close for a server stopped
// after Open: its listener and connections gone, new connections refused.
func newProxy(t *testing.T, raw string) *faultproxy.Proxy {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Listen(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// viaProxy returns raw with its host replaced by the proxy's.
func viaProxy(t *testing.T, p *faultproxy.Proxy, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr()
	return u.String()
}
