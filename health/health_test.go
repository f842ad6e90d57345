package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/health"
	"github.com/fencelock/fencelock/recipe"
)

// events is an Observer that hands every event of one kind to a channel,
// so a test waits for the engine instead of sleeping.
type events struct {
	kind fencelock.EventKind
	ch   chan fencelock.Event
}

func on(kind fencelock.EventKind) *events {
	return &events{kind: kind, ch: make(chan fencelock.Event, 64)}
}

func (e *events) Observe(ev fencelock.Event) {
	if ev.Kind == e.kind {
		select {
		case e.ch <- ev:
		default:
		}
	}
}

// setup returns a probe, a memory backend and a Client on it whose
// Observer is the probe's, wrapping next.
func setup(t *testing.T, o *fencelock.Options, po *health.Options, next fencelock.Observer) (*health.Probe, *memory.Backend, *fencelock.Client) {
	t.Helper()
	p := health.New(po)
	b := memory.New()
	var opts fencelock.Options
	if o != nil {
		opts = *o
	}
	opts.Observer = p.Observer(next)
	c, err := fencelock.New(b, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return p, b, c
}

func result(t *testing.T, r health.Report, name string) health.Result {
	t.Helper()
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("report has no check %q: %+v", name, r)
	return health.Result{}
}

// A held lease whose renewals fail enters its danger zone: the probe
// fails it while the lease is still held (Remaining below the threshold,
// Done not closed), and keeps failing it, as lost, once it is lost.
func TestLeaseCheckFailsInDangerZoneAndWhenLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		danger := on(fencelock.EventDanger)
		p, b, c := setup(t, &fencelock.Options{TTL: 3 * time.Second}, nil, danger)
		l, err := c.TryAcquire(t.Context(), "job")
		if err != nil {
			t.Fatal(err)
		}
		p.Watch("job", c, l)
		if err := p.Err(); err != nil {
			t.Fatalf("fresh lease: %v", err)
		}
		b.SetUnreachable(true)
		<-danger.ch // the engine's danger zone: less than one RenewInterval left
		// The default threshold is min(RenewInterval, (TTL−Margin−RenewInterval)/2)
		// = min(1s, 0.85s): advance the bubble's clock to just below it.
		time.Sleep(l.Remaining() - 850*time.Millisecond + time.Millisecond)
		select {
		case <-l.Done():
			t.Fatal("lease ended before the danger zone's end")
		default:
		}
		r := result(t, p.Check(), "job")
		if r.OK || !strings.Contains(r.Reason, "danger zone") {
			t.Fatalf("lease with %v left: check %+v, want failing in its danger zone", l.Remaining(), r)
		}
		if err := p.Err(); !errors.Is(err, health.ErrUnhealthy) {
			t.Fatalf("Err = %v, want ErrUnhealthy", err)
		}
		<-l.Done()
		r = result(t, p.Check(), "job")
		if r.OK || !strings.Contains(r.Reason, "lost") {
			t.Fatalf("lost lease: check %+v, want failing as lost", r)
		}
	})
}

// A healthy lease never trips the default threshold, even with the
// tightest renewal schedule Options.Validate accepts (RenewInterval TTL/2,
// Margin TTL − 3/2 × RenewInterval), where less than one RenewInterval of
// validity is left before every renewal.
func TestLeaseCheckPassesWhileRenewalsSucceed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		renewed := on(fencelock.EventRenewed)
		o := &fencelock.Options{TTL: 4 * time.Second, RenewInterval: 2 * time.Second, Margin: time.Second}
		p, _, c := setup(t, o, nil, renewed)
		l, err := c.TryAcquire(t.Context(), "job")
		if err != nil {
			t.Fatal(err)
		}
		p.Watch("job", c, l)
		for range 5 {
			// Just before each renewal validity is lowest (1s here,
			// half a RenewInterval): check there, then let it renew.
			time.Sleep(2*time.Second - time.Millisecond)
			if err := p.Err(); err != nil {
				t.Fatalf("healthy lease with %v left: %v", l.Remaining(), err)
			}
			<-renewed.ch
		}
	})
}

// A lease released by its holder passes; one taken away by
// ForceRelease fails as lost.
func TestLeaseCheckReleasedPassesForcedFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _, c := setup(t, nil, nil, nil)
		ctx := t.Context()
		a, err := c.TryAcquire(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		f, err := c.TryAcquire(ctx, "f")
		if err != nil {
			t.Fatal(err)
		}
		p.Watch("a", c, a)
		p.Watch("f", c, f)
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ForceRelease(ctx, "f"); err != nil {
			t.Fatal(err)
		}
		<-f.Done()
		rep := p.Check()
		if r := result(t, rep, "a"); !r.OK || !strings.Contains(r.Reason, "released") {
			t.Errorf("released lease: %+v, want passing", r)
		}
		if r := result(t, rep, "f"); r.OK || !strings.Contains(r.Reason, "lost") {
			t.Errorf("force-released lease: %+v, want failing as lost", r)
		}
		p.Forget("f")
		if err := p.Err(); err != nil {
			t.Errorf("after Forget of the lost lease: %v", err)
		}
	})
}

// The store check passes while failures are within StoreBound, fails once
// the store has answered nothing for longer, and passes again at the
// store's next answer.
func TestStoreCheckFailsPastBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		failed := on(fencelock.EventRenewFailed)
		p, b, c := setup(t, &fencelock.Options{TTL: 3 * time.Second}, &health.Options{StoreBound: 2 * time.Second}, failed)
		ctx := t.Context()
		l, err := c.TryAcquire(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if r := result(t, p.Check(), "store"); !r.OK {
			t.Fatalf("store answering: %+v", r)
		}
		b.SetUnreachable(true)
		<-failed.ch // at 1s (the first renewal): within the 2s bound
		if r := result(t, p.Check(), "store"); !r.OK || !strings.Contains(r.Reason, "within the bound") {
			t.Fatalf("first failed renewal: %+v, want passing within the bound", r)
		}
		<-l.Done() // lost at 2.7s, the store silent since 0s
		r := result(t, p.Check(), "store")
		if r.OK || !strings.Contains(r.Reason, memory.ErrUnreachable.Error()) {
			t.Fatalf("store silent past the bound: %+v, want failing with the store's error", r)
		}
		b.SetUnreachable(false)
		if _, err := c.TryAcquire(ctx, "other"); err != nil {
			t.Fatal(err)
		}
		if r := result(t, p.Check(), "store"); !r.OK {
			t.Fatalf("store answering again: %+v", r)
		}
	})
}

// An election's term lease, watched as each term starts, fails the check
// when the term is lost and passes again once the next term holds.
func TestLeaderCheckFollowsElection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _, c := setup(t, nil, nil, nil)
		ctx, cancel := context.WithCancel(t.Context())
		terms := make(chan *fencelock.Lease)
		// gate holds each term before its Watch, so the test sees the
		// check between terms.
		gate := make(chan struct{})
		done := make(chan error)
		go func() {
			done <- recipe.Elect(ctx, c, "leader", "me", nil, func(ctx context.Context, l *fencelock.Lease) error {
				<-gate
				p.Watch("leader", c, l)
				terms <- l
				<-ctx.Done()
				return nil
			}, nil)
		}()
		gate <- struct{}{}
		first := <-terms
		if err := p.Err(); err != nil {
			t.Fatalf("leading: %v", err)
		}
		if _, err := c.ForceRelease(t.Context(), "leader"); err != nil {
			t.Fatal(err)
		}
		<-first.Done()
		if r := result(t, p.Check(), "leader"); r.OK {
			t.Fatalf("term lost: %+v, want failing", r)
		}
		gate <- struct{}{}
		<-terms // the next term
		if err := p.Err(); err != nil {
			t.Fatalf("leading again: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := p.Err(); err != nil {
			t.Fatalf("after resigning: %v", err)
		}
	})
}

// ServeHTTP answers 200 with every check's JSON while healthy and 503
// once a check fails.
func TestHandlerStatusAndBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _, c := setup(t, nil, nil, nil)
		l, err := c.TryAcquire(t.Context(), "job")
		if err != nil {
			t.Fatal(err)
		}
		p.Watch("job", c, l)
		get := func() (int, health.Report) {
			w := httptest.NewRecorder()
			p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			var rep health.Report
			if err := json.Unmarshal(w.Body.Bytes(), &rep); err != nil {
				t.Fatalf("body %q: %v", w.Body, err)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			return w.Code, rep
		}
		code, rep := get()
		if code != http.StatusOK || !rep.OK || len(rep.Checks) != 2 || rep.Checks[0].Name != "store" || rep.Checks[1].Name != "job" {
			t.Fatalf("healthy: %d %+v", code, rep)
		}
		if _, err := c.ForceRelease(t.Context(), "job"); err != nil {
			t.Fatal(err)
		}
		<-l.Done()
		code, rep = get()
		if code != http.StatusServiceUnavailable || rep.OK || rep.Checks[1].OK {
			t.Fatalf("lease lost: %d %+v", code, rep)
		}
	})
}
