package httpfence_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/memory" // mem://
	"github.com/fencelock/fencelock/kit/httpfence"
)

// The server fences every PUT by its path with an in-memory Fence; the
// client's lease token rides on every request through Transport. After
// the lock passes to a new holder, the old holder's late write is refused
// with 409 Conflict, which Refusal turns back into a StaleTokenError.
func Example() {
	ctx := context.Background()

	// Server: the protected service.
	var mu sync.Mutex
	value := ""
	save := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		value = string(b)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	byPath := func(r *http.Request) string { return r.URL.Path }
	srv := httptest.NewServer(httpfence.Middleware(&fencelock.Fence{}, byPath, save))
	defer srv.Close()

	// Client: two holders of the lock on "reports", one after the other.
	c, err := fencelock.Open(ctx, "mem://httpfence-example", nil)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	write := func(lease *fencelock.Lease, body string) error {
		client := &http.Client{Transport: &httpfence.Transport{Lease: lease}}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+"/reports", strings.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if err := httpfence.Refusal(resp); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Errorf("PUT: %s", resp.Status)
		}
		return nil
	}

	first, err := c.Acquire(ctx, "reports")
	if err != nil {
		panic(err)
	}
	fmt.Println("first:", write(first, "draft"))
	// The first holder is paused past its lease; here it just releases.
	_ = first.Release(ctx)
	second, err := c.Acquire(ctx, "reports")
	if err != nil {
		panic(err)
	}
	fmt.Println("second:", write(second, "final"))
	fmt.Println("first, late:", write(first, "stale draft"))
	mu.Lock()
	fmt.Println("value:", value)
	mu.Unlock()
	// Output:
	// first: <nil>
	// second: <nil>
	// first, late: fencelock: stale fencing token 1 for "/reports" (highest seen 2)
	// value: final
}
