package prometheus_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	flprom "github.com/fencelock/fencelock/observe/prometheus"
	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func newObserver(t *testing.T, o *flprom.Options) (*flprom.Observer, *prom.Registry) {
	t.Helper()
	obs, err := flprom.New(o)
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	if err := reg.Register(obs); err != nil {
		t.Fatal(err)
	}
	return obs, reg
}

func newClient(t *testing.T, b driver.Backend, o *fencelock.Options) *fencelock.Client {
	t.Helper()
	c, err := fencelock.New(b, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// values gathers reg and returns every sample as `name{l="v",…}` → value;
// a histogram gives name_count and name_sum.
func values(t *testing.T, reg prom.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			sort.Strings(ls)
			labels := "{" + strings.Join(ls, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[mf.GetName()+labels] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[mf.GetName()+labels] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[mf.GetName()+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
				out[mf.GetName()+"_sum"+labels] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// want checks that every sample in w has exactly that value.
func want(t *testing.T, got map[string]float64, w map[string]float64) {
	t.Helper()
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, ok := got[k]
		if !ok {
			t.Errorf("no sample %s", k)
			continue
		}
		// Sums of durations: compare to the microsecond.
		if d := v - w[k]; d > 1e-6 || d < -1e-6 {
			t.Errorf("%s = %v; want %v", k, v, w[k])
		}
	}
}

func TestAcquireRenewRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs, reg := newObserver(t, nil)
		c := newClient(t, memory.New(), &fencelock.Options{TTL: 3 * time.Second, Observer: obs})
		l, err := c.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond) // renewals at 1s and 2s
		want(t, values(t, reg), map[string]float64{`fencelock_leases_held{backend="memory"}`: 1})
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		want(t, values(t, reg), map[string]float64{
			`fencelock_acquire_wait_seconds_count{backend="memory",result="acquired"}`: 1,
			`fencelock_acquire_wait_seconds_sum{backend="memory",result="acquired"}`:   0,
			`fencelock_acquire_contended_total{backend="memory"}`:                      0,
			`fencelock_renew_latency_seconds_count{backend="memory"}`:                  2,
			`fencelock_hold_seconds_count{backend="memory",end="released"}`:            1,
			`fencelock_hold_seconds_sum{backend="memory",end="released"}`:              2.5,
			`fencelock_hold_seconds_count{backend="memory",end="lost"}`:                0,
			`fencelock_leases_held{backend="memory"}`:                                  0,
		})
		// The counters, as a scrape shows them.
		err = testutil.CollectAndCompare(obs, strings.NewReader(`
# HELP fencelock_acquire_total Acquire and TryAcquire calls by result: acquired, not_acquired (TryAcquire found the key held), failed (context ended or backend failed).
# TYPE fencelock_acquire_total counter
fencelock_acquire_total{backend="memory",result="acquired"} 1
fencelock_acquire_total{backend="memory",result="failed"} 0
fencelock_acquire_total{backend="memory",result="not_acquired"} 0
# HELP fencelock_renew_total Renewals by result: ok, transient (failed, will be retried), definite (refused by the store; the lease is lost).
# TYPE fencelock_renew_total counter
fencelock_renew_total{backend="memory",result="definite"} 0
fencelock_renew_total{backend="memory",result="ok"} 2
fencelock_renew_total{backend="memory",result="transient"} 0
# HELP fencelock_release_total Release calls by result: ok, not_held (the store no longer had the lease: work may not have been exclusive), failed (store unreachable).
# TYPE fencelock_release_total counter
fencelock_release_total{backend="memory",result="failed"} 0
fencelock_release_total{backend="memory",result="not_held"} 0
fencelock_release_total{backend="memory",result="ok"} 1
`), "fencelock_acquire_total", "fencelock_renew_total", "fencelock_release_total")
		if err != nil {
			t.Error(err)
		}
	})
}

func TestContendedAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs, reg := newObserver(t, nil)
		store := memory.NewStore()
		h := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Minute})
		w := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Minute, Observer: obs})
		l, err := h.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.TryAcquire(t.Context(), "k"); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatal(err)
		}
		// A waiting Acquire that gives up after 1s.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err = w.Acquire(ctx, "k")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire with 1s deadline: %v", err)
		}
		// A waiting Acquire that gets the key when it is released 3s later.
		go func() {
			time.Sleep(3 * time.Second)
			l.Release(context.Background())
		}()
		wl, err := w.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		want(t, values(t, reg), map[string]float64{
			`fencelock_acquire_total{backend="memory",result="acquired"}`:                  1,
			`fencelock_acquire_total{backend="memory",result="not_acquired"}`:              1,
			`fencelock_acquire_total{backend="memory",result="failed"}`:                    1,
			`fencelock_acquire_contended_total{backend="memory"}`:                          1,
			`fencelock_acquire_retry_total{backend="memory"}`:                              0,
			`fencelock_acquire_wait_seconds_sum{backend="memory",result="acquired"}`:       3,
			`fencelock_acquire_wait_seconds_count{backend="memory",result="not_acquired"}`: 1,
			`fencelock_acquire_wait_seconds_sum{backend="memory",result="failed"}`:         1,
			`fencelock_leases_held{backend="memory"}`:                                      1,
		})
		wl.Release(t.Context())
	})
}

func TestLossByExpiryTheftAndForceRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs, reg := newObserver(t, nil)
		store := memory.NewStore()
		b := store.Backend()
		// The memory backend without loss notification or batch renewal (a
		// loss is found by the renewal loop), keeping its name.
		c := newClient(t, fakebackend.New(b, fakebackend.Describer).Backend(), &fencelock.Options{TTL: 3 * time.Second, Observer: obs})

		// Expiry: the store is unreachable, local validity runs out at
		// TTL − Margin = 2.7s; the best-effort release of the lost lease fails.
		l, _ := c.Acquire(t.Context(), "expiry")
		b.SetUnreachable(true)
		<-l.Done()
		synctest.Wait()
		b.SetUnreachable(false)
		got := values(t, reg)
		want(t, got, map[string]float64{
			`fencelock_lost_total{backend="memory",cause="local_expiry"}`:   1,
			`fencelock_danger_zone_total{backend="memory"}`:                 1,
			`fencelock_cleanup_failed_total{backend="memory"}`:              1,
			`fencelock_hold_seconds_count{backend="memory",end="lost"}`:     1,
			`fencelock_hold_seconds_sum{backend="memory",end="lost"}`:       2.7,
			`fencelock_renew_total{backend="memory",result="definite"}`:     0,
			`fencelock_renew_total{backend="memory",result="ok"}`:           0,
			`fencelock_leases_held{backend="memory"}`:                       0,
			`fencelock_hold_seconds_count{backend="memory",end="released"}`: 0,
		})
		if n := got[`fencelock_renew_total{backend="memory",result="transient"}`]; n < 2 {
			t.Errorf("transient renewal failures = %v; want at least 2", n)
		}

		// Theft: the record expires in the store; the next renewal (at 1s)
		// is refused.
		l2, _ := c.Acquire(t.Context(), "theft")
		time.Sleep(500 * time.Millisecond)
		store.Expire("theft")
		<-l2.Done()

		// Force release, told at once by the backend's loss notification.
		fc := newClient(t, b, &fencelock.Options{TTL: 3 * time.Second, Observer: obs})
		l3, _ := fc.Acquire(t.Context(), "forced")
		time.Sleep(200 * time.Millisecond)
		if _, err := fc.ForceRelease(t.Context(), "forced"); err != nil {
			t.Fatal(err)
		}
		<-l3.Done()

		want(t, values(t, reg), map[string]float64{
			`fencelock_lost_total{backend="memory",cause="local_expiry"}`:    1,
			`fencelock_lost_total{backend="memory",cause="not_held"}`:        2,
			`fencelock_lost_total{backend="memory",cause="token_regressed"}`: 0,
			`fencelock_lost_total{backend="memory",cause="other"}`:           0,
			`fencelock_renew_total{backend="memory",result="definite"}`:      1,
			`fencelock_hold_seconds_count{backend="memory",end="lost"}`:      3,
			`fencelock_hold_seconds_sum{backend="memory",end="lost"}`:        2.7 + 1 + 0.2,
			`fencelock_leases_held{backend="memory"}`:                        0,
		})
	})
}

func TestRetriedReleaseCountsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs, reg := newObserver(t, nil)
		b := memory.New()
		c := newClient(t, b, &fencelock.Options{TTL: 3 * time.Second, Observer: obs})
		l, _ := c.Acquire(t.Context(), "k")
		time.Sleep(100 * time.Millisecond)
		b.SetUnreachable(true)
		if err := l.Release(t.Context()); err == nil {
			t.Fatal("Release on an unreachable store succeeded")
		}
		b.SetUnreachable(false)
		time.Sleep(100 * time.Millisecond)
		if err := l.Release(t.Context()); err != nil {
			t.Fatalf("retried Release: %v", err)
		}
		want(t, values(t, reg), map[string]float64{
			`fencelock_release_total{backend="memory",result="failed"}`:     1,
			`fencelock_release_total{backend="memory",result="ok"}`:         1,
			`fencelock_hold_seconds_count{backend="memory",end="released"}`: 1,
			`fencelock_hold_seconds_sum{backend="memory",end="released"}`:   0.1,
			`fencelock_leases_held{backend="memory"}`:                       0,
		})
	})
}

func TestRotationAndFence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs, reg := newObserver(t, nil)
		c := newClient(t, memory.New(), &fencelock.Options{TTL: 4 * time.Second, RenewInterval: time.Second, RotateEvery: 2 * time.Second, Observer: obs})
		l, _ := c.Acquire(t.Context(), "k")
		time.Sleep(2500 * time.Millisecond)
		f := fencelock.Fence{Observer: obs}
		if err := f.Check("res", 5, "x"); err != nil {
			t.Fatal(err)
		}
		if err := f.Admit("res", l); !errors.Is(err, fencelock.ErrStaleToken) {
			t.Fatalf("Admit with token %d after 5: %v", l.Token(), err)
		}
		want(t, values(t, reg), map[string]float64{
			`fencelock_token_rotated_total{backend="memory"}`: 1,
			`fencelock_fence_rejected_total{}`:                1,
		})
	})
}

func TestKeyLabel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prefix := func(key string) string {
			if i := strings.IndexByte(key, '/'); i >= 0 {
				return key[:i]
			}
			return "other"
		}
		obs, reg := newObserver(t, &flprom.Options{KeyLabel: prefix})
		c := newClient(t, memory.New(), &fencelock.Options{TTL: time.Minute, Observer: obs})
		for _, k := range []string{"jobs/1", "jobs/2", "users/9", "jobs/1"} {
			l, err := c.TryAcquire(t.Context(), k)
			if err != nil {
				t.Fatal(err)
			}
			l.Release(t.Context())
		}
		f := fencelock.Fence{Observer: obs}
		f.Check("accounts/7", 2, "a")
		f.Check("accounts/7", 1, "b")
		got := values(t, reg)
		want(t, got, map[string]float64{
			`fencelock_acquire_total{backend="memory",key="jobs",result="acquired"}`:  3,
			`fencelock_acquire_total{backend="memory",key="users",result="acquired"}`: 1,
			`fencelock_leases_held{backend="memory",key="jobs"}`:                      0,
			`fencelock_fence_rejected_total{key="accounts"}`:                          1,
		})
		for k := range got {
			if strings.Contains(k, `"jobs/`) || strings.Contains(k, `"users/`) {
				t.Errorf("a raw key became a label value: %s", k)
			}
		}
	})
}

// TestHTTPScrape exports through promhttp and parses what a Prometheus
// server would read.
func TestHTTPScrape(t *testing.T) {
	obs, reg := newObserver(t, nil)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	store := memory.NewStore()
	a := newClient(t, store.Backend(), &fencelock.Options{TTL: 10 * time.Second, Observer: obs})
	b := newClient(t, store.Backend(), &fencelock.Options{TTL: 10 * time.Second, Observer: obs})
	ctx := t.Context()
	la, err := a.Acquire(ctx, "scrape")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "scrape"); !errors.Is(err, fencelock.ErrNotAcquired) {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(50 * time.Millisecond)
		la.Release(context.Background())
	}()
	lb, err := b.Acquire(ctx, "scrape")
	if err != nil {
		t.Fatal(err)
	}
	<-released // its event is emitted after the waiter may have been granted

	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	for _, line := range []string{
		`# TYPE fencelock_acquire_total counter`,
		`fencelock_acquire_total{backend="memory",result="acquired"} 2`,
		`fencelock_acquire_total{backend="memory",result="not_acquired"} 1`,
		`fencelock_acquire_contended_total{backend="memory"} 1`,
		`fencelock_release_total{backend="memory",result="ok"} 1`,
		`fencelock_leases_held{backend="memory"} 1`,
		`# TYPE fencelock_acquire_wait_seconds histogram`,
		`fencelock_acquire_wait_seconds_count{backend="memory",result="acquired"} 2`,
		`fencelock_acquire_wait_seconds_bucket{backend="memory",result="acquired",le="+Inf"} 2`,
		`fencelock_hold_seconds_count{backend="memory",end="released"} 1`,
		`fencelock_fence_rejected_total 0`,
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("scrape lacks line %q", line)
		}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, text)
	}
	for _, name := range []string{"fencelock_acquire_total", "fencelock_acquire_contended_total", "fencelock_acquire_retry_total",
		"fencelock_acquire_wait_seconds", "fencelock_hold_seconds", "fencelock_renew_total", "fencelock_renew_latency_seconds",
		"fencelock_token_rotated_total", "fencelock_danger_zone_total", "fencelock_lost_total", "fencelock_release_total",
		"fencelock_cleanup_failed_total", "fencelock_fence_rejected_total", "fencelock_leases_held"} {
		if mfs[name] == nil {
			t.Errorf("scrape lacks family %s", name)
		}
	}
	// The waiter's wait is the 50ms until the release, give or take a
	// loaded machine; the hold of the first lease is at least as long.
	for _, m := range mfs["fencelock_hold_seconds"].GetMetric() {
		if m.GetLabel()[1].GetValue() != "released" {
			continue
		}
		if s := m.GetHistogram().GetSampleSum(); s < 0.05 || s > 30 {
			t.Errorf("hold sum %v; want about 0.05s", s)
		}
	}
	lb.Release(ctx)
}

func TestOptionsValidate(t *testing.T) {
	_, err := flprom.New(&flprom.Options{HoldBuckets: []float64{1, 1}})
	var ie *fencelock.InvalidOptionError
	if !errors.As(err, &ie) || ie.Option != "HoldBuckets" || !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Fatalf("New with non-increasing buckets: %v", err)
	}
	if err := (*flprom.Options)(nil).Validate(); err != nil {
		t.Fatalf("nil options: %v", err)
	}
}

func TestLostCause(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&fencelock.LostError{Cause: fencelock.ErrLocalExpiry}, "local_expiry"},
		{&fencelock.LostError{Cause: fencelock.ErrNotHeld}, "not_held"},
		{&fencelock.LostError{Cause: fmt.Errorf("%w: 3 < 5", fencelock.ErrTokenRegressed)}, "token_regressed"},
		{&fencelock.LostError{Cause: fencelock.ErrClosed}, "other"},
		{nil, "other"},
	} {
		if got := flprom.LostCause(tc.err); got != tc.want {
			t.Errorf("LostCause(%v) = %q; want %q", tc.err, got, tc.want)
		}
	}
}
