package httpfence_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/kit/httpfence"
)

// TestMiddlewareKeepsAnAdmittedOlderWriteFromLandingLast: holder A (token
// 1) is admitted and its handler is slow to write; holder B (token 2)
// arrives meanwhile. Middleware makes B wait for A's handler to return
// before B is checked, so B's write lands last and the value is B's.
// Without the lock (the defect, shown by the second subtest), B is checked
// and writes while A's handler is still running, and A's write, from the
// older token, lands after B's.
func TestMiddlewareKeepsAnAdmittedOlderWriteFromLandingLast(t *testing.T) {
	for _, serialize := range []bool{true, false} {
		name := "with the lock"
		if !serialize {
			name = "without the lock, the older write lands last"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			aIn, releaseA := make(chan struct{}), make(chan struct{})
			waiting := make(chan string, 1)
			st := &store{vals: map[string]string{}}
			next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get(httpfence.HeaderHolder) == "A" {
					close(aIn)
					select {
					case <-releaseA:
					case <-r.Context().Done():
						return
					}
				}
				st.ServeHTTP(w, r)
			})
			mux := http.NewServeMux()
			mux.Handle("/r/{name}", httpfence.NewMiddleware(&fencelock.Fence{}, writes, next, serialize, func(res string) { waiting <- res }))
			srv := httptest.NewServer(mux)
			defer srv.Close()
			var once sync.Once
			release := func() { once.Do(func() { close(releaseA) }) }
			defer release() // before srv.Close, which waits for A's handler
			r := newHTTPResource(srv)

			aDone, bDone := make(chan error, 1), make(chan error, 1)
			go func() { aDone <- r.Write(ctx, "x", 1, "A", "a") }()
			select {
			case <-aIn:
			case <-ctx.Done():
				t.Fatal("A's write never reached the handler")
			}
			go func() { bDone <- r.Write(ctx, "x", 2, "B", "b") }()
			if serialize {
				select {
				case res := <-waiting:
					if res != "x" {
						t.Fatalf("a request waited for resource %q; want x", res)
					}
				case err := <-bDone:
					t.Fatalf("B's write (%v) completed while A's admitted write was still in its handler", err)
				case <-ctx.Done():
					t.Fatal("B never waited for A's handler")
				}
			} else {
				select {
				case err := <-bDone:
					if err != nil {
						t.Fatalf("B's write: %v", err)
					}
				case <-ctx.Done():
					t.Fatal("B's write did not complete")
				}
			}
			release()
			for _, done := range []chan error{aDone, bDone} {
				if !serialize && done == bDone {
					continue
				}
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("write: %v", err)
					}
				case <-ctx.Done():
					t.Fatal("a write did not complete")
				}
			}
			got, _, err := r.Read(ctx, "x")
			if err != nil {
				t.Fatal(err)
			}
			want := "b"
			if !serialize {
				want = "a" // the defect: token 1's write landed after token 2's
			}
			if got != want {
				t.Fatalf("value = %q; want %q", got, want)
			}
		})
	}
}

// TestMiddlewareWaitIsBoundedByTheRequest: a request waiting for the
// resource's lock gives up with 503 when its context ends, unchecked.
func TestMiddlewareWaitIsBoundedByTheRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	aIn, releaseA := make(chan struct{}), make(chan struct{})
	defer close(releaseA)
	waiting := make(chan string, 1)
	var fence fencelock.Fence
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(httpfence.HeaderHolder) == "A" {
			close(aIn)
			<-releaseA
		}
		w.WriteHeader(http.StatusNoContent)
	})
	h := httpfence.NewMiddleware(&fence, func(*http.Request) string { return "x" }, next, true, func(string) { waiting <- "x" })
	go func() {
		req := httptest.NewRequestWithContext(ctx, http.MethodPut, "/r/x", strings.NewReader("a"))
		req.Header.Set(httpfence.HeaderToken, "1")
		req.Header.Set(httpfence.HeaderHolder, "A")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	select {
	case <-aIn:
	case <-ctx.Done():
		t.Fatal("A's write never reached the handler")
	}
	bctx, bcancel := context.WithCancel(ctx)
	req := httptest.NewRequestWithContext(bctx, http.MethodPut, "/r/x", strings.NewReader("b"))
	req.Header.Set(httpfence.HeaderToken, "2")
	req.Header.Set(httpfence.HeaderHolder, "B")
	rec := httptest.NewRecorder()
	go func() { <-waiting; bcancel() }()
	h.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Result().Body)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(string(body), "gave up waiting") {
		t.Fatalf("B: %d %q; want 503 gave up waiting", rec.Code, body)
	}
	if h := fence.Highest("x"); h != 1 {
		t.Fatalf("Highest = %d after B gave up; want 1: B must not have been checked", h)
	}
}
