package otel_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/fakebackend"
	flotel "github.com/fencelock/fencelock/observe/otel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
)

// rig is an Observer on SDK providers whose output the test reads.
type rig struct {
	obs    *flotel.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
}

func newRig(t *testing.T, o *flotel.Options) *rig {
	t.Helper()
	r := &rig{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	obs, err := flotel.New(mp, tp, o)
	if err != nil {
		t.Fatal(err)
	}
	r.obs = obs
	return r
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

func attrString(set attribute.Set) string {
	var ls []string
	for _, kv := range set.ToSlice() {
		ls = append(ls, fmt.Sprintf("%s=%q", kv.Key, kv.Value.Emit()))
	}
	sort.Strings(ls)
	return "{" + strings.Join(ls, ",") + "}"
}

// values collects the reader and returns every data point as
// `name{k="v",…}` → value; a histogram gives name.count and name.sum.
func (r *rig) values(t *testing.T) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != flotel.ScopeName {
			t.Errorf("scope %q; want %q", sm.Scope.Name, flotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name+attrString(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				if m.Unit != "s" {
					t.Errorf("%s has unit %q; want s", m.Name, m.Unit)
				}
				for _, p := range d.DataPoints {
					out[m.Name+".count"+attrString(p.Attributes)] = float64(p.Count)
					out[m.Name+".sum"+attrString(p.Attributes)] = p.Sum
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// want checks that every data point in w has exactly that value.
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
			t.Errorf("no data point %s", k)
			continue
		}
		if d := v - w[k]; d > 1e-6 || d < -1e-6 {
			t.Errorf("%s = %v; want %v", k, v, w[k])
		}
	}
}

// span is what a test checks of an ended span.
type span struct {
	name     string
	duration time.Duration
	status   codes.Code
	attrs    map[attribute.Key]attribute.Value
	events   int
}

func (r *rig) ended() []span {
	var out []span
	for _, s := range r.spans.Ended() {
		sp := span{name: s.Name(), duration: s.EndTime().Sub(s.StartTime()), status: s.Status().Code,
			attrs: map[attribute.Key]attribute.Value{}, events: len(s.Events())}
		for _, kv := range s.Attributes() {
			sp.attrs[kv.Key] = kv.Value
		}
		if s.Parent().IsValid() {
			sp.name += " (with a parent!)"
		}
		out = append(out, sp)
	}
	return out
}

func names(ss []span) string {
	var n []string
	for _, s := range ss {
		n = append(n, s.name)
	}
	return strings.Join(n, " ")
}

func TestAcquireRenewRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, nil)
		c := newClient(t, memory.New(), &fencelock.Options{TTL: 3 * time.Second, Observer: r.obs})
		l, err := c.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond) // renewals at 1s and 2s
		want(t, r.values(t), map[string]float64{`fencelock.leases.held{backend="memory"}`: 1})
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		want(t, r.values(t), map[string]float64{
			`fencelock.acquire{backend="memory",result="acquired"}`:            1,
			`fencelock.acquire{backend="memory",result="not_acquired"}`:        0,
			`fencelock.acquire{backend="memory",result="failed"}`:              0,
			`fencelock.acquire.contended{backend="memory"}`:                    0,
			`fencelock.acquire.wait.count{backend="memory",result="acquired"}`: 1,
			`fencelock.acquire.wait.sum{backend="memory",result="acquired"}`:   0,
			`fencelock.renew{backend="memory",result="ok"}`:                    2,
			`fencelock.renew{backend="memory",result="transient"}`:             0,
			`fencelock.renew.latency.count{backend="memory"}`:                  2,
			`fencelock.release{backend="memory",result="ok"}`:                  1,
			`fencelock.hold.count{backend="memory",end="released"}`:            1,
			`fencelock.hold.sum{backend="memory",end="released"}`:              2.5,
			`fencelock.leases.held{backend="memory"}`:                          0,
			`fencelock.lost{backend="memory",cause="local_expiry"}`:            0,
			`fencelock.fence.rejected{}`:                                       0,
		})
		ss := r.ended()
		if names(ss) != "fencelock.acquire fencelock.release" {
			t.Fatalf("spans %q; want an acquire and a release", names(ss))
		}
		acq, rel := ss[0], ss[1]
		if acq.duration != 0 || acq.status != codes.Unset || acq.attrs["fencelock.backend"].AsString() != "memory" ||
			acq.attrs["fencelock.token"].AsInt64() != 1 || acq.attrs["fencelock.contended"].AsBool() ||
			acq.attrs["fencelock.result"].AsString() != "acquired" || acq.attrs["fencelock.owner"].AsString() != l.Owner() {
			t.Errorf("acquire span %+v", acq)
		}
		if _, ok := acq.attrs["fencelock.key"]; ok {
			t.Error("the key is on the span without Options.SpanKeys")
		}
		if rel.status != codes.Unset || rel.attrs["fencelock.held"].AsFloat64() != 2.5 || rel.attrs["fencelock.result"].AsString() != "ok" {
			t.Errorf("release span %+v", rel)
		}
	})
}

func TestContendedAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, &flotel.Options{SpanKeys: true})
		store := memory.NewStore()
		h := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Minute})
		w := newClient(t, store.Backend(), &fencelock.Options{TTL: time.Minute, Observer: r.obs})
		l, err := h.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.TryAcquire(t.Context(), "k"); !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err = w.Acquire(ctx, "k")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire with 1s deadline: %v", err)
		}
		go func() {
			time.Sleep(3 * time.Second)
			l.Release(context.Background())
		}()
		wl, err := w.Acquire(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		want(t, r.values(t), map[string]float64{
			`fencelock.acquire{backend="memory",result="acquired"}`:                1,
			`fencelock.acquire{backend="memory",result="not_acquired"}`:            1,
			`fencelock.acquire{backend="memory",result="failed"}`:                  1,
			`fencelock.acquire.contended{backend="memory"}`:                        1,
			`fencelock.acquire.retry{backend="memory"}`:                            0,
			`fencelock.acquire.wait.sum{backend="memory",result="acquired"}`:       3,
			`fencelock.acquire.wait.count{backend="memory",result="not_acquired"}`: 1,
			`fencelock.acquire.wait.sum{backend="memory",result="failed"}`:         1,
			`fencelock.leases.held{backend="memory"}`:                              1,
		})
		ss := r.ended()
		if names(ss) != "fencelock.acquire fencelock.acquire fencelock.acquire" {
			t.Fatalf("spans %q; want three acquires", names(ss))
		}
		for i, w := range []struct {
			result    string
			duration  time.Duration
			status    codes.Code
			contended bool
			events    int
		}{
			{"not_acquired", 0, codes.Unset, true, 0},
			{"failed", time.Second, codes.Error, true, 1}, // timed out waiting on a held key; the error is recorded as an event
			{"acquired", 3 * time.Second, codes.Unset, true, 0},
		} {
			s := ss[i]
			if s.attrs["fencelock.result"].AsString() != w.result || s.duration != w.duration || s.status != w.status ||
				s.attrs["fencelock.contended"].AsBool() != w.contended || s.events != w.events || s.attrs["fencelock.key"].AsString() != "k" {
				t.Errorf("span %d: %+v; want result %s lasting %v, status %v, contended %v, %d events, key k",
					i, s, w.result, w.duration, w.status, w.contended, w.events)
			}
		}
		wl.Release(t.Context())
	})
}

func TestLossByExpiryTheftAndForceRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, nil)
		store := memory.NewStore()
		b := store.Backend()
		// The memory backend without loss notification or batch renewal (a
		// loss is found by the renewal loop), keeping its name.
		c := newClient(t, fakebackend.New(b, fakebackend.Describer).Backend(), &fencelock.Options{TTL: 3 * time.Second, Observer: r.obs})

		// Expiry at TTL − Margin = 2.7s; the best-effort release fails.
		l, _ := c.Acquire(t.Context(), "expiry")
		b.SetUnreachable(true)
		<-l.Done()
		synctest.Wait()
		b.SetUnreachable(false)
		got := r.values(t)
		want(t, got, map[string]float64{
			`fencelock.lost{backend="memory",cause="local_expiry"}`: 1,
			`fencelock.danger_zone{backend="memory"}`:               1,
			`fencelock.cleanup_failed{backend="memory"}`:            1,
			`fencelock.hold.count{backend="memory",end="lost"}`:     1,
			`fencelock.hold.sum{backend="memory",end="lost"}`:       2.7,
			`fencelock.renew{backend="memory",result="definite"}`:   0,
			`fencelock.leases.held{backend="memory"}`:               0,
		})
		if n := got[`fencelock.renew{backend="memory",result="transient"}`]; n < 2 {
			t.Errorf("transient renewal failures = %v; want at least 2", n)
		}

		// Theft: the record expires in the store; the renewal at 1s is refused.
		l2, _ := c.Acquire(t.Context(), "theft")
		time.Sleep(500 * time.Millisecond)
		store.Expire("theft")
		<-l2.Done()

		// Force release, told at once by the backend's loss notification.
		fc := newClient(t, b, &fencelock.Options{TTL: 3 * time.Second, Observer: r.obs})
		l3, _ := fc.Acquire(t.Context(), "forced")
		time.Sleep(200 * time.Millisecond)
		if _, err := fc.ForceRelease(t.Context(), "forced"); err != nil {
			t.Fatal(err)
		}
		<-l3.Done()

		want(t, r.values(t), map[string]float64{
			`fencelock.lost{backend="memory",cause="local_expiry"}`:    1,
			`fencelock.lost{backend="memory",cause="not_held"}`:        2,
			`fencelock.lost{backend="memory",cause="token_regressed"}`: 0,
			`fencelock.lost{backend="memory",cause="other"}`:           0,
			`fencelock.renew{backend="memory",result="definite"}`:      1,
			`fencelock.hold.count{backend="memory",end="lost"}`:        3,
			`fencelock.hold.sum{backend="memory",end="lost"}`:          2.7 + 1 + 0.2,
			`fencelock.leases.held{backend="memory"}`:                  0,
		})
		var causes []string
		for _, s := range r.ended() {
			if s.name == "fencelock.lost" {
				if s.status != codes.Error || s.duration != 0 {
					t.Errorf("lost span %+v; want a zero-length error span", s)
				}
				causes = append(causes, s.attrs["fencelock.cause"].AsString())
			}
		}
		if strings.Join(causes, " ") != "local_expiry not_held not_held" {
			t.Errorf("lost spans with causes %v", causes)
		}
	})
}

func TestRetriedReleaseCountsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, nil)
		b := memory.New()
		c := newClient(t, b, &fencelock.Options{TTL: 3 * time.Second, Observer: r.obs})
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
		want(t, r.values(t), map[string]float64{
			`fencelock.release{backend="memory",result="failed"}`:   1,
			`fencelock.release{backend="memory",result="ok"}`:       1,
			`fencelock.hold.count{backend="memory",end="released"}`: 1,
			`fencelock.hold.sum{backend="memory",end="released"}`:   0.1,
			`fencelock.leases.held{backend="memory"}`:               0,
		})
		var statuses []codes.Code
		for _, s := range r.ended() {
			if s.name == "fencelock.release" {
				statuses = append(statuses, s.status)
			}
		}
		if len(statuses) != 2 || statuses[0] != codes.Error || statuses[1] != codes.Unset {
			t.Errorf("release span statuses %v; want [Error Unset]", statuses)
		}
	})
}

func TestRotationFenceAndKeyLabel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		prefix := func(key string) string { k, _, _ := strings.Cut(key, "/"); return k }
		r := newRig(t, &flotel.Options{KeyLabel: prefix})
		c := newClient(t, memory.New(), &fencelock.Options{TTL: 4 * time.Second, RenewInterval: time.Second, RotateEvery: 2 * time.Second, Observer: r.obs})
		l, _ := c.Acquire(t.Context(), "jobs/1")
		time.Sleep(2500 * time.Millisecond)
		f := fencelock.Fence{Observer: r.obs}
		if err := f.Check("accounts/7", 5, "x"); err != nil {
			t.Fatal(err)
		}
		if err := f.Admit("accounts/7", l); !errors.Is(err, fencelock.ErrStaleToken) {
			t.Fatalf("Admit with token %d after 5: %v", l.Token(), err)
		}
		got := r.values(t)
		want(t, got, map[string]float64{
			`fencelock.token.rotated{backend="memory",key="jobs"}`:             1,
			`fencelock.acquire{backend="memory",key="jobs",result="acquired"}`: 1,
			`fencelock.fence.rejected{key="accounts"}`:                         1,
		})
		for k := range got {
			if strings.Contains(k, `"jobs/`) || strings.Contains(k, `"accounts/`) {
				t.Errorf("a raw key became an attribute value: %s", k)
			}
		}
	})
}

// TestGlobalProviders: nil providers mean the otel globals. (Before a
// program installs its providers, the globals forward to the ones installed
// later; that is otel's own behaviour, and it happens only once per process,
// so this test installs first to be repeatable.)
func TestGlobalProviders(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	obs, err := flotel.New(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, memory.New(), &fencelock.Options{TTL: time.Minute, Observer: obs})
	l, err := c.TryAcquire(t.Context(), "g")
	if err != nil {
		t.Fatal(err)
	}
	l.Release(t.Context())
	r := &rig{obs: obs, reader: reader, spans: spans}
	want(t, r.values(t), map[string]float64{`fencelock.acquire{backend="memory",result="acquired"}`: 1})
	if n := names(r.ended()); n != "fencelock.acquire fencelock.release" {
		t.Errorf("spans %q", n)
	}
}

func TestOptionsValidate(t *testing.T) {
	_, err := flotel.New(nil, nil, &flotel.Options{WaitBuckets: []float64{2, 1}})
	var ie *fencelock.InvalidOptionError
	if !errors.As(err, &ie) || ie.Option != "WaitBuckets" || !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Fatalf("New with decreasing buckets: %v", err)
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
	} {
		if got := flotel.LostCause(tc.err); got != tc.want {
			t.Errorf("LostCause(%v) = %q; want %q", tc.err, got, tc.want)
		}
	}
}

// TestNoopTracerProvider: metrics without spans.
func TestNoopTracerProvider(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := flotel.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), noop.NewTracerProvider(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, memory.New(), &fencelock.Options{TTL: time.Minute, Observer: obs})
	l, err := c.TryAcquire(t.Context(), "n")
	if err != nil {
		t.Fatal(err)
	}
	l.Release(t.Context())
	r := &rig{obs: obs, reader: reader}
	want(t, r.values(t), map[string]float64{
		`fencelock.acquire{backend="memory",result="acquired"}`: 1,
		`fencelock.release{backend="memory",result="ok"}`:       1,
	})
}
