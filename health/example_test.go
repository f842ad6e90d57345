package health_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/memory" // mem://
	"github.com/fencelock/fencelock/health"
)

// A leader serves its health on /healthz for a Kubernetes liveness probe:
//
//	livenessProbe:
//	  httpGet: {path: /healthz, port: 8080}
//	  periodSeconds: 5
//
// The probe fails (503) when the leader's lease is lost or in its danger
// zone, or when the store has failed the client's requests for longer
// than StoreBound, so the kubelet restarts a leader that can no longer
// lead. In production the handler is served with
// http.ListenAndServe(":8080", mux); here an httptest server stands in.
func ExampleProbe() {
	ctx := context.Background()
	probe := health.New(&health.Options{StoreBound: health.DefaultStoreBound})
	opts := fencelock.Options{}
	opts.Observer = probe.Observer(opts.Observer) // feeds the "store" check
	c, err := fencelock.Open(ctx, "mem://example-health", &opts)
	if err != nil {
		panic(err)
	}
	defer c.Close()

	mux := http.NewServeMux()
	mux.Handle("/healthz", probe)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	status := func() int {
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	lease, err := c.Acquire(ctx, "leader")
	if err != nil {
		panic(err)
	}
	probe.Watch("leader", c, lease)
	fmt.Println("leading:", status())

	// An operator takes the lock away: the lease is lost.
	if _, err := c.ForceRelease(ctx, "leader"); err != nil {
		panic(err)
	}
	<-lease.Done()
	fmt.Println("lost:", status())
	fmt.Println(probe.Err() != nil)
	// Output:
	// leading: 200
	// lost: 503
	// true
}
