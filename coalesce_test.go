package fencelock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/driver"
)

// batchProbe is the memory backend with gates in front of its single
// Acquire and Release (so that the calls that arrive meanwhile queue)
// and of its AcquireBatch (so that a batch can be held in flight), and a
// record of every batch it was sent.
type batchProbe struct {
	*memory.Backend
	mu         sync.Mutex
	gate       chan struct{} // if set, single Acquire and Release wait for it
	batchGate  chan struct{} // if set, AcquireBatch waits for it
	singles    int
	acqBatches [][]string // keys of each AcquireBatch
	relBatches [][]string // keys of each ReleaseBatch
}

func newProbe(s *memory.Store) *batchProbe { return &batchProbe{Backend: s.Backend()} }

func (p *batchProbe) waitGate(which *chan struct{}) {
	p.mu.Lock()
	g := *which
	p.mu.Unlock()
	if g != nil {
		<-g
	}
}

func (p *batchProbe) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	p.mu.Lock()
	p.singles++
	p.mu.Unlock()
	p.waitGate(&p.gate)
	return p.Backend.Acquire(ctx, req)
}

func (p *batchProbe) Release(ctx context.Context, g driver.Grant) error {
	p.waitGate(&p.gate)
	return p.Backend.Release(ctx, g)
}

func (p *batchProbe) AcquireBatch(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	p.mu.Lock()
	p.acqBatches = append(p.acqBatches, keys)
	p.mu.Unlock()
	p.waitGate(&p.batchGate)
	return p.Backend.AcquireBatch(ctx, reqs)
}

func (p *batchProbe) ReleaseBatch(ctx context.Context, gs []driver.Grant) ([]error, error) {
	keys := make([]string, len(gs))
	for i, g := range gs {
		keys[i] = g.Key
	}
	p.mu.Lock()
	p.relBatches = append(p.relBatches, keys)
	p.mu.Unlock()
	return p.Backend.ReleaseBatch(ctx, gs)
}

func (p *batchProbe) batches() (acq, rel [][]string, singles int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.acqBatches), slices.Clone(p.relBatches), p.singles
}

type tryOutcome struct {
	key string
	l   *fencelock.Lease
	err error
}

func tryAsync(ctx context.Context, c *fencelock.Client, key string, out chan<- tryOutcome) {
	go func() {
		l, err := c.TryAcquire(ctx, key)
		out <- tryOutcome{key, l, err}
	}()
}

// fillLanes starts fencelock.CoalesceInFlight TryAcquires of keys first0,
// first1, …, which wait at p's gate and take every place a lane has in
// flight, and waits until they do: the calls after them queue.
func fillLanes(t *testing.T, c *fencelock.Client, out chan<- tryOutcome) []string {
	var keys []string
	for i := range fencelock.CoalesceInFlight {
		k := "first" + string(rune('0'+i))
		keys = append(keys, k)
		tryAsync(t.Context(), c, k, out)
	}
	synctest.Wait()
	return keys
}

// A lone caller goes through the backend's single Acquire and Release,
// never a batch: coalescing costs it nothing.
func TestLoneCallerIsNeverBatched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newProbe(memory.NewStore())
		c := newClient(t, p, nil)
		for _, k := range []string{"a", "b", "c"} {
			l, err := c.TryAcquire(t.Context(), k)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		acq, rel, singles := p.batches()
		if len(acq) != 0 || len(rel) != 0 || singles != 3 {
			t.Errorf("sequential calls: %d acquire batches, %d release batches, %d single acquires; want 0, 0, 3", len(acq), len(rel), singles)
		}
	})
}

// Calls that arrive while one is in flight go together as one batch, and
// each member gets its own answer: a grant of its own key, a refusal of
// a held key, the *InvalidKeyError of a bad key, its own context's error
// for a member whose context ended while it was queued; none of them
// changes another's.
func TestCoalescedAcquiresEachGetTheirOwnAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memory.NewStore()
		other := newClient(t, s.Backend(), nil)
		if _, err := other.TryAcquire(t.Context(), "held"); err != nil {
			t.Fatal(err)
		}
		p := newProbe(s)
		p.gate = make(chan struct{})
		c := newClient(t, p, &fencelock.Options{ReleaseTimeout: time.Second})
		out := make(chan tryOutcome, 16)
		firsts := fillLanes(t, c, out) // each goes alone, waits at the gate
		keys := []string{"k1", "held", "", "k2", "k3"}
		for _, k := range keys {
			tryAsync(t.Context(), c, k, out)
		}
		cctx, cancel := context.WithCancel(t.Context())
		tryAsync(cctx, c, "cancelled", out)
		synctest.Wait() // every one queued behind the firsts
		cancel()
		// The attempt outlives its caller's end by the overrun budget
		// (ReleaseTimeout): then it leaves the queue.
		time.Sleep(2 * time.Second)
		synctest.Wait()
		p.mu.Lock()
		close(p.gate)
		p.gate = nil
		p.mu.Unlock()
		got := map[string]tryOutcome{}
		for range len(keys) + len(firsts) + 1 {
			o := <-out
			got[o.key] = o
		}
		for _, k := range append(firsts, "k1", "k2", "k3") {
			o := got[k]
			if o.err != nil {
				t.Fatalf("%s: %v", k, o.err)
			}
			if o.l.Key() != k {
				t.Errorf("the lease of %q is on %q: an answer went to the wrong member", k, o.l.Key())
			}
			info, err := c.Inspect(t.Context(), k)
			if err != nil || info.Owner != o.l.Owner() || info.Token != o.l.Token() {
				t.Errorf("%s: the store holds %+v (%v); the lease is %s, token %d", k, info, err, o.l.Owner(), o.l.Token())
			}
		}
		if err := got["held"].err; !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Errorf("held key: %v; want ErrNotAcquired", err)
		}
		if err := got[""].err; !errors.Is(err, fencelock.ErrInvalidKey) {
			t.Errorf("bad key: %v; want ErrInvalidKey", err)
		}
		if err := got["cancelled"].err; !errors.Is(err, context.Canceled) {
			t.Errorf("member cancelled while queued: %v; want context.Canceled", err)
		}
		if info, _ := s.Backend().Inspect(t.Context(), "cancelled"); info.Locked() {
			t.Errorf("a member that left the queue got the key: %+v", info)
		}
		acq, _, _ := p.batches()
		if len(acq) != 1 {
			t.Fatalf("acquire batches %v; want one", acq)
		}
		b := slices.Clone(acq[0])
		slices.Sort(b)
		if want := []string{"", "held", "k1", "k2", "k3"}; !slices.Equal(b, want) {
			t.Errorf("the batch carried %q; want %q (the cancelled member left it)", b, want)
		}
	})
}

// A member whose context ends while its batch is in flight gets an
// unknown outcome at once, and the grant the batch brings for it later
// is released: no record is left for nobody.
func TestMemberLeavingBatchInFlightLeavesNoRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memory.NewStore()
		p := newProbe(s)
		p.gate, p.batchGate = make(chan struct{}), make(chan struct{})
		c := newClient(t, p, &fencelock.Options{ReleaseTimeout: time.Second})
		out := make(chan tryOutcome, 4)
		firsts := fillLanes(t, c, out)
		actx, cancel := context.WithCancel(t.Context())
		tryAsync(actx, c, "a", out)
		tryAsync(t.Context(), c, "b", out)
		synctest.Wait()
		p.mu.Lock()
		close(p.gate) // the firsts return; a and b go as one batch, held at batchGate
		p.gate = nil
		p.mu.Unlock()
		for range firsts {
			if o := <-out; o.err != nil {
				t.Fatal(o.err)
			}
		}
		synctest.Wait()
		cancel()
		time.Sleep(2 * time.Second) // past a's overrun budget: a gives up
		o := <-out
		if o.key != "a" || !errors.Is(o.err, context.Canceled) {
			t.Fatalf("got %s: %v; want a: context.Canceled", o.key, o.err)
		}
		p.mu.Lock()
		close(p.batchGate)
		p.batchGate = nil
		p.mu.Unlock()
		if o := <-out; o.key != "b" || o.err != nil || o.l.Key() != "b" {
			t.Fatalf("b: %+v", o)
		}
		synctest.Wait()
		if info, _ := s.Backend().Inspect(t.Context(), "a"); info.Locked() {
			t.Errorf("the grant for a, which left, is still held: %+v", info)
		}
		if acq, _, _ := p.batches(); len(acq) != 1 || len(acq[0]) != 2 {
			t.Errorf("acquire batches %v; want one of a and b", acq)
		}
	})
}

// Concurrent releases coalesce too, each with its own answer.
func TestCoalescedReleasesEachGetTheirOwnAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := memory.NewStore()
		p := newProbe(s)
		c := newClient(t, p, nil)
		var (
			leases []*fencelock.Lease
			firsts []string
		)
		for i := range fencelock.CoalesceInFlight {
			firsts = append(firsts, "first"+string(rune('0'+i)))
		}
		for _, k := range append(slices.Clone(firsts), "r1", "r2", "r3") {
			l, err := c.TryAcquire(t.Context(), k)
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, l)
		}
		// r2's record is gone (the memory store tells its holder at
		// once, so its release is answered without a request).
		if _, err := s.Backend().ForceRelease(t.Context(), "r2"); err != nil {
			t.Fatal(err)
		}
		p.mu.Lock()
		p.gate = make(chan struct{})
		p.mu.Unlock()
		errs := make([]error, len(leases))
		var wg sync.WaitGroup
		for i := range firsts {
			wg.Go(func() { errs[i] = leases[i].Release(t.Context()) })
		}
		synctest.Wait()
		for i := len(firsts); i < len(leases); i++ {
			wg.Go(func() { errs[i] = leases[i].Release(t.Context()) })
		}
		synctest.Wait()
		p.mu.Lock()
		close(p.gate)
		p.gate = nil
		p.mu.Unlock()
		wg.Wait()
		for i, err := range errs {
			if k := leases[i].Key(); k == "r2" {
				if !errors.Is(err, fencelock.ErrNotHeld) {
					t.Errorf("r2 (force-released): %v; want ErrNotHeld", err)
				}
			} else if err != nil {
				t.Errorf("%s: %v", k, err)
			}
		}
		for _, k := range append(firsts, "r1", "r3") {
			if info, _ := s.Backend().Inspect(t.Context(), k); info.Locked() {
				t.Errorf("%s still held after its release: %+v", k, info)
			}
		}
		_, rel, _ := p.batches()
		if len(rel) != 1 || len(rel[0]) != 2 {
			t.Errorf("release batches %v; want one of r1 and r3", rel)
		}
	})
}

// Options.NoCoalesce sends every call alone.
func TestNoCoalesceSendsEveryCallAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newProbe(memory.NewStore())
		p.gate = make(chan struct{})
		c := newClient(t, p, &fencelock.Options{NoCoalesce: true})
		out := make(chan tryOutcome, 4)
		for _, k := range []string{"a", "b", "c"} {
			tryAsync(t.Context(), c, k, out)
		}
		synctest.Wait()
		p.mu.Lock()
		close(p.gate)
		p.gate = nil
		p.mu.Unlock()
		for range 3 {
			if o := <-out; o.err != nil {
				t.Fatal(o.err)
			}
		}
		if acq, _, singles := p.batches(); len(acq) != 0 || singles != 3 {
			t.Errorf("with NoCoalesce: batches %v, %d single acquires; want none, 3", acq, singles)
		}
	})
}

// The URL parameter coalesce= takes on and off, and nothing else.
func TestOpenCoalesceParameter(t *testing.T) {
	for _, v := range []string{"on", "off"} {
		c, err := fencelock.Open(t.Context(), "mem://coalesce-param?coalesce="+v, nil)
		if err != nil {
			t.Fatalf("coalesce=%s: %v", v, err)
		}
		if got := c.Options().NoCoalesce; got != (v == "off") {
			t.Errorf("coalesce=%s: NoCoalesce = %v", v, got)
		}
		c.Close()
	}
	if _, err := fencelock.Open(t.Context(), "mem://coalesce-param?coalesce=maybe", nil); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Errorf("coalesce=maybe: %v; want ErrInvalidOption", err)
	}
}

// Many goroutines acquiring and releasing private keys through one
// client (batches form as the scheduler lets them) each get leases of
// their own keys; run under -race.
func TestConcurrentCallersGetTheirOwnLeases(t *testing.T) {
	p := newProbe(memory.NewStore())
	c := newClient(t, p, nil)
	var wg sync.WaitGroup
	keys := []string{"w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7"}
	for _, k := range keys {
		wg.Go(func() {
			for range 200 {
				l, err := c.TryAcquire(t.Context(), k)
				if err != nil {
					t.Error(err)
					return
				}
				if l.Key() != k {
					t.Errorf("lease for %s is on %s", k, l.Key())
				}
				if err := l.Release(t.Context()); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	acqB, acqM, _, _ := fencelock.CoalesceStats(c)
	t.Logf("%d acquire batches of %d members", acqB, acqM)
}
