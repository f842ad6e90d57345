package prometheus_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	flprom "github.com/fencelock/fencelock/observe/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func Example() {
	// One Observer for every Client of the process, registered once.
	obs, err := flprom.New(&flprom.Options{
		// Optional: a "key" label from a bounded set, here the first path
		// segment of the key. Without it, keys are not labels.
		KeyLabel: func(key string) string { k, _, _ := strings.Cut(key, "/"); return k },
	})
	if err != nil {
		panic(err)
	}
	reg := prom.NewRegistry()
	reg.MustRegister(obs)
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	ctx := context.Background()
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: 15 * time.Second, Observer: obs})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	for _, key := range []string{"jobs/nightly", "jobs/hourly"} {
		l, err := c.Acquire(ctx, key)
		if err != nil {
			panic(err)
		}
		l.Release(ctx)
	}

	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "fencelock_acquire_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			fmt.Print(mf.GetName(), "{")
			for i, lp := range m.GetLabel() {
				if i > 0 {
					fmt.Print(",")
				}
				fmt.Printf("%s=%q", lp.GetName(), lp.GetValue())
			}
			fmt.Println("}", m.GetCounter().GetValue())
		}
	}
	// Output:
	// fencelock_acquire_total{backend="memory",key="jobs",result="acquired"} 2
	// fencelock_acquire_total{backend="memory",key="jobs",result="failed"} 0
	// fencelock_acquire_total{backend="memory",key="jobs",result="not_acquired"} 0
}
