// Package storetest runs the health probe against a real Redis
// (FENCELOCK_TEST_REDIS) reached through a fault proxy the test cuts. It
// is a module of its own, holding only tests, so that the root module
// requires no store client.
package storetest

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/health"
	"github.com/fencelock/fencelock/internal/faultproxy"
	"github.com/fencelock/fencelock/internal/testenv"
)

type failures chan fencelock.Event

func (f failures) Observe(e fencelock.Event) {
	if e.Kind == fencelock.EventRenewFailed {
		select {
		case f <- e:
		default:
		}
	}
}

// A client holding a lease on Redis whose connection is cut (every
// connection reset, as when the server is down): the probe still passes
// at the first failed renewal (within StoreBound), and fails, with 503,
// by the time the lease is lost: the store check (silent past the bound)
// and the lease check (lost). Once the store answers again, it passes.
func TestProbeFailsWhenRedisUnreachablePastBound(t *testing.T) {
	u, err := url.Parse(testenv.URL(t, "FENCELOCK_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	px, err := faultproxy.Listen(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	u.Host = px.Addr()

	const ttl, bound = 2 * time.Second, time.Second
	p := health.New(&health.Options{StoreBound: bound})
	failed := make(failures, 16)
	c, err := fencelock.Open(t.Context(), u.String(), &fencelock.Options{TTL: ttl, Observer: p.Observer(failed)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	key := "health-storetest/" + t.Name() + "/" + time.Now().Format("150405.000000000")
	l, err := c.TryAcquire(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	p.Watch("job", c, l)
	status := func() int {
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return w.Code
	}
	if code := status(); code != http.StatusOK {
		t.Fatalf("store answering: %d, %v", code, p.Err())
	}

	px.SetMode(faultproxy.Reset)
	cut := time.Now()
	<-failed // the first renewal after the cut
	if r := p.Check(); !r.OK && time.Since(cut) < bound/2 {
		t.Fatalf("first failed renewal, %v after the cut: %+v, want passing within the bound", time.Since(cut), r)
	}
	select {
	case <-l.Done():
	case <-time.After(2 * ttl):
		t.Fatalf("lease still held %v after the store was cut", 2*ttl)
	}
	rep := p.Check()
	if rep.OK || status() != http.StatusServiceUnavailable {
		t.Fatalf("store cut for %v (bound %v), lease lost: %+v, want failing", time.Since(cut), bound, rep)
	}
	for _, r := range rep.Checks {
		if r.OK {
			t.Errorf("check %s passes after the store was cut past the bound: %s", r.Name, r.Reason)
		}
		if r.Name == "store" && !strings.Contains(r.Reason, "more than the bound") {
			t.Errorf("store check's reason: %s", r.Reason)
		}
	}

	px.SetMode(faultproxy.Pass)
	l2, err := c.Acquire(t.Context(), key, fencelock.WithWait(10*ttl))
	if err != nil {
		t.Fatal(err)
	}
	p.Watch("job", c, l2)
	if err := p.Err(); err != nil {
		t.Fatalf("store answering again: %v", err)
	}
	_ = l2.Release(t.Context())
}
