package httpfence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/memory" // mem://
	"github.com/fencelock/fencelock/conformance/resource"
	"github.com/fencelock/fencelock/kit/httpfence"
)

// store is the protected service: a map behind PUT and GET /r/{name}.
type store struct {
	mu   sync.Mutex
	vals map[string]string
}

func (s *store) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	switch r.Method {
	case http.MethodPut:
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.vals[name] = string(b)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet:
		s.mu.Lock()
		v, ok := s.vals[name]
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, v)
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// writes fences the PUTs to /r/{name}, by name; GETs are not fenced.
func writes(r *http.Request) string {
	if r.Method == http.MethodGet {
		return ""
	}
	return r.PathValue("name")
}

type middlewareFunc func(httpfence.Checker, func(*http.Request) string, http.Handler) http.Handler

// newServer serves a store behind mw over an in-memory Fence.
func newServer(t *testing.T, mw middlewareFunc) *httptest.Server {
	mux := http.NewServeMux()
	mux.Handle("/r/{name}", mw(&fencelock.Fence{}, writes, &store{vals: map[string]string{}}))
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
	ctx = httpfence.WithToken(ctx, token, holder)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, h.base+"/r/"+url.PathEscape(name), strings.NewReader(value))
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

// TestMiddlewarePassesTheResourceSuite: a service behind Middleware over
// fencelock.Fence, written through Transport, is a fenced resource: it
// passes the resource conformance suite, tokens up to 2^64-1 included.
func TestMiddlewarePassesTheResourceSuite(t *testing.T) {
	r := newHTTPResource(newServer(t, httpfence.Middleware))
	resource.Run(t, resource.Harness{Resource: func(*testing.T) resource.Resource { return r }, Tokens64: true})
}

func put(t *testing.T, srv *httptest.Server, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, srv.URL+"/r/x", strings.NewReader("v"))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMiddlewareRefusesMissingAndMalformedFencing: a fenced write without
// a well-formed token and holder is 400, says what is wrong, and writes
// nothing.
func TestMiddlewareRefusesMissingAndMalformedFencing(t *testing.T) {
	srv := newServer(t, httpfence.Middleware)
	for _, c := range []struct {
		name   string
		header http.Header
		says   string
	}{
		{"no token", http.Header{"Fencing-Holder": {"a"}}, "missing Fencing-Token"},
		{"no holder", http.Header{"Fencing-Token": {"5"}}, "missing Fencing-Holder"},
		{"empty holder", http.Header{"Fencing-Token": {"5"}, "Fencing-Holder": {""}}, "missing Fencing-Holder"},
		{"not a number", http.Header{"Fencing-Token": {"five"}, "Fencing-Holder": {"a"}}, "malformed Fencing-Token"},
		{"negative", http.Header{"Fencing-Token": {"-5"}, "Fencing-Holder": {"a"}}, "malformed Fencing-Token"},
		{"past 2^64-1", http.Header{"Fencing-Token": {"18446744073709551616"}, "Fencing-Holder": {"a"}}, "malformed Fencing-Token"},
		{"a double", http.Header{"Fencing-Token": {"9.007199254740992e15"}, "Fencing-Holder": {"a"}}, "malformed Fencing-Token"},
		{"two tokens", http.Header{"Fencing-Token": {"5", "6"}, "Fencing-Holder": {"a"}}, "2 Fencing-Token headers"},
		{"two holders", http.Header{"Fencing-Token": {"5"}, "Fencing-Holder": {"a", "b"}}, "2 Fencing-Holder headers"},
	} {
		code, body := put(t, srv, c.header)
		if code != http.StatusBadRequest || !strings.Contains(body, c.says) {
			t.Errorf("%s: %d %q; want 400 saying %q", c.name, code, body, c.says)
		}
	}
	r := newHTTPResource(srv)
	if v, ok, err := r.Read(t.Context(), "x"); err != nil || ok {
		t.Fatalf("after refused writes, Read = %q, %v, %v; want no value", v, ok, err)
	}
}

// TestRefusalIsStaleTokenError: a stale write is 409 with the
// StaleTokenError's text, and Refusal gives the error back, token and
// highest included.
func TestRefusalIsStaleTokenError(t *testing.T) {
	srv := newServer(t, httpfence.Middleware)
	if code, body := put(t, srv, http.Header{"Fencing-Token": {"7"}, "Fencing-Holder": {"a"}}); code != http.StatusNoContent {
		t.Fatalf("first write: %d %s", code, body)
	}
	want := &fencelock.StaleTokenError{Resource: "x", Token: 6, Highest: 7}
	code, body := put(t, srv, http.Header{"Fencing-Token": {"6"}, "Fencing-Holder": {"b"}})
	if code != http.StatusConflict || strings.TrimSpace(body) != want.Error() {
		t.Fatalf("stale write: %d %q; want 409 %q", code, body, want.Error())
	}
	err := newHTTPResource(srv).Write(t.Context(), "x", 6, "b", "late")
	var se *fencelock.StaleTokenError
	if !errors.Is(err, fencelock.ErrStaleToken) || !errors.As(err, &se) || *se != *want {
		t.Fatalf("Write of a stale token = %v; want %v", err, want)
	}
}

// TestTransportCarriesLeaseAndLeavesRequest: the Transport sends the
// lease's token and owner (the context's, when it names them), and leaves
// the caller's request untouched.
func TestTransportCarriesLeaseAndLeavesRequest(t *testing.T) {
	ctx := t.Context()
	c, err := fencelock.Open(ctx, "mem://httpfence-transport", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lease, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	defer srv.Close()
	client := &http.Client{Transport: &httpfence.Transport{Base: srv.Client().Transport, Lease: lease}, Timeout: 30 * time.Second}
	send := func(ctx context.Context) (http.Header, *http.Request) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return <-got, req
	}
	h, req := send(ctx)
	if h.Get("Fencing-Token") != fmt.Sprint(lease.Token()) || h.Get("Fencing-Holder") != lease.Owner() {
		t.Errorf("sent %q/%q; want the lease's %d/%q", h.Get("Fencing-Token"), h.Get("Fencing-Holder"), lease.Token(), lease.Owner())
	}
	if req.Header.Get("Fencing-Token") != "" {
		t.Errorf("the caller's request was changed: %v", req.Header)
	}
	h, _ = send(httpfence.WithToken(ctx, 1<<64-1, "other"))
	if h.Get("Fencing-Token") != "18446744073709551615" || h.Get("Fencing-Holder") != "other" {
		t.Errorf("with WithToken, sent %q/%q; want the context's", h.Get("Fencing-Token"), h.Get("Fencing-Holder"))
	}
}
