package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance/resource"
	"github.com/fencelock/fencelock/kit/httpfence"
	pgfence "github.com/fencelock/fencelock/kit/postgres"
)

var _ httpfence.ContextChecker = pgfence.Checker{}

// serveData serves f's data table over HTTP: PUT /r/{name} upserts the
// body (a plain write: the fencing is the middleware's), GET reads it.
// The PUTs are fenced by httpfence.Middleware over c.
func serveData(t *testing.T, f *fixture, c httpfence.Checker) *httptest.Server {
	data := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		switch r.Method {
		case http.MethodPut:
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if _, err := f.pool.Exec(r.Context(), f.upsert(), name, string(b)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case http.MethodGet:
			v, ok, err := f.read(r.Context(), name)
			switch {
			case err != nil:
				http.Error(w, err.Error(), http.StatusInternalServerError)
			case !ok:
				http.NotFound(w, r)
			default:
				io.WriteString(w, v)
			}
		default:
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
	puts := func(r *http.Request) string {
		if r.Method == http.MethodGet {
			return ""
		}
		return r.PathValue("name")
	}
	mux := http.NewServeMux()
	mux.Handle("/r/{name}", httpfence.Middleware(c, puts, data))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// httpResource is a resource.Resource over HTTP: Write PUTs through
// httpfence.Transport, Read GETs.
type httpResource struct {
	base   string
	client *http.Client
}

func newHTTPResource(srv *httptest.Server) *httpResource {
	return &httpResource{base: srv.URL, client: &http.Client{Transport: &httpfence.Transport{Base: srv.Client().Transport}, Timeout: 30 * time.Second}}
}

func (h *httpResource) Write(ctx context.Context, name string, token fencelock.Token, holder, value string) error {
	req, err := http.NewRequestWithContext(httpfence.WithToken(ctx, token, holder), http.MethodPut, h.base+"/r/"+url.PathEscape(name), strings.NewReader(value))
	if err != nil {
		return err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if err := httpfence.Refusal(resp); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("PUT %s: %s: %s", name, resp.Status, body)
	}
	return nil
}

func (h *httpResource) Read(ctx context.Context, name string) (string, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.base+"/r/"+url.PathEscape(name), nil)
	if err != nil {
		return "", false, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return "", false, err
	case resp.StatusCode == http.StatusNotFound:
		return "", false, nil
	case resp.StatusCode != http.StatusOK:
		return "", false, fmt.Errorf("GET %s: %s: %s", name, resp.Status, body)
	}
	return string(body), true, nil
}

// TestMiddlewareOverCheckerPassesTheResourceSuite: a service writing a
// table behind httpfence.Middleware over a Checker on the PostgreSQL
// fence table, written through httpfence.Transport, is a fenced resource:
// it passes the resource conformance suite (tokens up to 2^63-1, as
// bigint holds).
func TestMiddlewareOverCheckerPassesTheResourceSuite(t *testing.T) {
	f := newFixture(t)
	r := newHTTPResource(serveData(t, f, f.fences.Checker(f.pool)))
	resource.Run(t, resource.Harness{Resource: func(*testing.T) resource.Resource { return r }})
}

// TestCheckerSharesOneFenceAcrossReplicas: two replicas of a service,
// each with its own Middleware over a Checker on one fence table, share
// one fence: a token one accepts refuses an older one, and an equal token
// from another holder, at the other.
func TestCheckerSharesOneFenceAcrossReplicas(t *testing.T) {
	ctx := ctxT(t)
	f := newFixture(t)
	one := newHTTPResource(serveData(t, f, f.fences.Checker(f.pool)))
	two := newHTTPResource(serveData(t, f, pgfence.Checker{DB: f.pool, Fences: f.fences}))
	if err := one.Write(ctx, "r", 5, "a", "a-1"); err != nil {
		t.Fatalf("replica one, token 5: %v", err)
	}
	for _, w := range []struct {
		token  fencelock.Token
		holder string
	}{{4, "b"}, {5, "b"}} {
		err := two.Write(ctx, "r", w.token, w.holder, "late")
		var se *fencelock.StaleTokenError
		if !errors.As(err, &se) || se.Highest != 5 {
			t.Errorf("replica two, token %d from %s after replica one accepted 5 from a: err = %v; want a refusal, highest 5", w.token, w.holder, err)
		}
	}
	if err := two.Write(ctx, "r", 5, "a", "a-2"); err != nil {
		t.Fatalf("replica two, token 5 from a, its holder: %v; want accepted", err)
	}
	if v, _, err := f.read(ctx, "r"); err != nil || v != "a-2" {
		t.Errorf("value = %q, %v; want a-2", v, err)
	}
	if tok, h := f.fence(t, "r"); tok != 5 || h != "a" {
		t.Errorf("fence = %d %q; want 5 \"a\"", tok, h)
	}
}

// TestCheckerGivesUpAfterTimeout: a check that waits for a fence row
// another transaction holds ends after Checker.Timeout with an error that
// is not a refusal, and records nothing.
func TestCheckerGivesUpAfterTimeout(t *testing.T) {
	ctx := ctxT(t)
	f := newFixture(t)
	held := make(chan struct{})
	release := make(chan struct{})
	holderDone := make(chan error, 1)
	go func() {
		holderDone <- f.fences.Tx(ctx, f.pool, "r", 5, "a", func(pgx.Tx) error {
			close(held)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	select {
	case <-held:
	case err := <-holderDone:
		t.Fatalf("the transaction holding the fence row: %v", err)
	}
	checked := make(chan error, 1)
	c := pgfence.Checker{DB: f.pool, Fences: f.fences, Timeout: 200 * time.Millisecond}
	go func() { checked <- c.Check("r", 6, "b") }()
	var err error
	select {
	case err = <-checked:
	case <-ctx.Done():
		close(release)
		t.Fatal("Check did not give up waiting for the held fence row")
	}
	close(release)
	if err == nil || errors.Is(err, fencelock.ErrStaleToken) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("check past its timeout: err = %v; want a deadline error, not a refusal", err)
	}
	if err := <-holderDone; err != nil {
		t.Fatalf("the transaction holding the fence row: %v", err)
	}
	if tok, h := f.fence(t, "r"); tok != 5 || h != "a" {
		t.Errorf("fence = %d %q; want 5 \"a\": the timed-out check recorded its token", tok, h)
	}
}
