package httpfence_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/kit/httpfence"
)

// ctxChecker is a ContextChecker over a Fence that records whether each
// check was given a server request's context, and counts calls of its
// context-free Check.
type ctxChecker struct {
	fence fencelock.Fence

	mu          sync.Mutex
	withRequest int // CheckContext calls with a server request's context
	plain       int // Check calls
}

func (c *ctxChecker) Check(resource string, token fencelock.Token, holder string) error {
	c.mu.Lock()
	c.plain++
	c.mu.Unlock()
	return c.fence.Check(resource, token, holder)
}

func (c *ctxChecker) CheckContext(ctx context.Context, resource string, token fencelock.Token, holder string) error {
	if ctx.Value(http.ServerContextKey) != nil {
		c.mu.Lock()
		c.withRequest++
		c.mu.Unlock()
	}
	return c.fence.Check(resource, token, holder)
}

var _ httpfence.ContextChecker = (*ctxChecker)(nil)

// TestMiddlewareChecksWithRequestContext: a Checker that has CheckContext
// is asked through it, with the request's context (so a check over a
// store ends when the client goes away), and never through Check; its
// answers are applied as Check's are.
func TestMiddlewareChecksWithRequestContext(t *testing.T) {
	c := &ctxChecker{}
	mux := http.NewServeMux()
	mux.Handle("/r/{name}", httpfence.Middleware(c, writes, &store{vals: map[string]string{}}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	fencing := func(token int) http.Header {
		return http.Header{httpfence.HeaderToken: {strconv.Itoa(token)}, httpfence.HeaderHolder: {"a"}}
	}
	if code, body := put(t, srv, fencing(5)); code != http.StatusNoContent {
		t.Fatalf("token 5: %d %s; want 204", code, body)
	}
	if code, body := put(t, srv, fencing(4)); code != http.StatusConflict {
		t.Fatalf("token 4 after 5: %d %s; want 409", code, body)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.withRequest != 2 || c.plain != 0 {
		t.Errorf("CheckContext with the request's context %d times, Check %d times; want 2 and 0", c.withRequest, c.plain)
	}
}
