package conformance

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

const batchRule = "a BatchAcquirer answers every request of a batch on its own, in order: grants of free keys (each with its own owner and a token the store records), a refusal of a held key naming its holder, an *InvalidKeyError for a bad key with nothing stored, and of two requests for one key the first wins; a BatchReleaser frees exactly the grants that hold their keys and answers a stale one ErrNotHeld; a batch on an ended context stores nothing; and through one Client, concurrent callers on private keys are coalesced into batches of two or more while every caller gets the lease of its own key."

func testBatch(t *testing.T, s *suite) {
	b := s.backend(t)
	ba, acq := b.(driver.BatchAcquirer)
	br, rel := b.(driver.BatchReleaser)
	if !acq && !rel {
		t.Skip("capabilities BatchAcquirer and BatchReleaser not implemented by this backend: case not run")
	}
	ctx := s.ctx(t)
	ttl := 10 * s.h.TTL
	if acq {
		t.Run("AcquireBatchAnswersEachRequest", func(t *testing.T) {
			other := s.backend(t)
			held := rawAcquire(t, ctx, other, s.key(t, "held"), ttl)
			dup := s.key(t, "dup")
			// Not in key order: a backend that sorts must map back.
			reqs := []driver.AcquireRequest{
				{Key: s.key(t, "z"), Owner: "conformance-" + randHex(), TTL: ttl},
				{Key: held.Key, Owner: "conformance-" + randHex(), TTL: ttl},
				{Key: "", Owner: "conformance-" + randHex(), TTL: ttl},
				{Key: s.key(t, "a"), Owner: "conformance-" + randHex(), TTL: ttl, Metadata: []byte("m")},
				{Key: dup, Owner: "conformance-" + randHex(), TTL: ttl},
				{Key: dup, Owner: "conformance-" + randHex(), TTL: ttl},
				{Key: s.key(t, "m"), Owner: "conformance-" + randHex(), TTL: ttl},
			}
			res, err := ba.AcquireBatch(ctx, reqs)
			if err != nil {
				t.Fatalf("AcquireBatch: %v", err)
			}
			if len(res) != len(reqs) {
				t.Fatalf("AcquireBatch returned %d results for %d requests", len(res), len(reqs))
			}
			for _, i := range []int{0, 3, 4, 6} {
				r, req := res[i], reqs[i]
				if r.Err != nil {
					t.Errorf("request %d (%q, free): %v", i, req.Key, r.Err)
					continue
				}
				if r.Grant.Key != req.Key || r.Grant.Owner != req.Owner || r.Grant.Token == 0 {
					t.Errorf("request %d (%q, owner %s) got grant %+v: an answer of another request", i, req.Key, req.Owner, r.Grant)
				}
				info, err := other.Inspect(ctx, req.Key)
				if err != nil || info.Owner != req.Owner || info.Token != r.Grant.Token {
					t.Errorf("request %d: the store has %+v (%v); the grant is %+v", i, info, err, r.Grant)
				}
			}
			var he *driver.HeldError
			if !errors.Is(res[1].Err, driver.ErrNotAcquired) {
				t.Errorf("held key: %v; want ErrNotAcquired", res[1].Err)
			} else if errors.As(res[1].Err, &he) && he.Holder.Owner != "" && he.Holder.Owner != held.Owner {
				t.Errorf("held key: the refusal names %q; the holder is %q", he.Holder.Owner, held.Owner)
			}
			if !errors.Is(res[2].Err, driver.ErrInvalidKey) {
				t.Errorf("bad key: %v; want an *InvalidKeyError", res[2].Err)
			}
			if !errors.Is(res[5].Err, driver.ErrNotAcquired) {
				t.Errorf("the second request for one key: %v; want ErrNotAcquired (the first holds it)", res[5].Err)
			}
			if info, err := other.Inspect(ctx, held.Key); err != nil || info.Owner != held.Owner || info.Token != held.Token {
				t.Errorf("the held key changed hands in a batch: %+v (%v)", info, err)
			}
			if r, err := ba.AcquireBatch(ctx, reqs[:1]); err != nil || r[0].Err != nil || r[0].Grant.Token != res[0].Grant.Token {
				t.Errorf("a same-owner retry in a batch: %+v, %v; want the grant %+v again", r, err, res[0].Grant)
			}
		})
		t.Run("EndedContextStoresNothing", func(t *testing.T) {
			dead, cancel := context.WithCancel(ctx)
			cancel()
			key := s.key(t, "dead")
			if _, err := ba.AcquireBatch(dead, []driver.AcquireRequest{{Key: key, Owner: "conformance-" + randHex(), TTL: ttl}, {Key: key + "2", Owner: "conformance-" + randHex(), TTL: ttl}}); err == nil {
				t.Error("AcquireBatch on an ended context: no error")
			}
			for _, k := range []string{key, key + "2"} {
				if info, err := b.Inspect(ctx, k); err != nil || info.Locked() {
					t.Errorf("after a batch on an ended context, %q: %+v (%v); want free", k, info, err)
				}
			}
		})
	}
	if rel {
		t.Run("ReleaseBatchAnswersEachGrant", func(t *testing.T) {
			g1 := rawAcquire(t, ctx, b, s.key(t, "r1"), ttl)
			g2 := rawAcquire(t, ctx, b, s.key(t, "r2"), ttl)
			g3 := rawAcquire(t, ctx, b, s.key(t, "r3"), ttl)
			stale := g2
			stale.Token++
			errs, err := br.ReleaseBatch(ctx, []driver.Grant{g3, stale, g1})
			if err != nil || len(errs) != 3 {
				t.Fatalf("ReleaseBatch = %v, %v; want 3 answers", errs, err)
			}
			if errs[0] != nil || errs[2] != nil {
				t.Errorf("current grants: %v, %v; want nil", errs[0], errs[2])
			}
			if !errors.Is(errs[1], driver.ErrNotHeld) {
				t.Errorf("stale grant: %v; want ErrNotHeld", errs[1])
			}
			for _, g := range []driver.Grant{g1, g3} {
				if info, err := b.Inspect(ctx, g.Key); err != nil || info.Locked() {
					t.Errorf("%q after its release in a batch: %+v (%v)", g.Key, info, err)
				}
			}
			if info, err := b.Inspect(ctx, g2.Key); err != nil || info.Owner != g2.Owner {
				t.Errorf("a stale release in a batch freed %q: %+v (%v)", g2.Key, info, err)
			}
		})
	}
	t.Run("ClientCoalescesPrivateKeys", func(t *testing.T) {
		inner, err := s.h.Open(t.Context())
		if err != nil {
			t.Fatalf("Harness.Open: %v", err)
		}
		cb := &countingBatcher{Backend: inner}
		var bk driver.Backend = cb
		switch {
		case acq && rel:
			bk = struct {
				*countingBatcher
				driver.BatchAcquirer
				driver.BatchReleaser
			}{cb, cb.acquirer(), cb.releaser()}
		case acq:
			bk = struct {
				*countingBatcher
				driver.BatchAcquirer
			}{cb, cb.acquirer()}
		default:
			bk = struct {
				*countingBatcher
				driver.BatchReleaser
			}{cb, cb.releaser()}
		}
		c, err := fencelock.New(bk, s.options())
		if err != nil {
			inner.Close()
			t.Fatal(err)
		}
		defer c.Close()
		const workers = 16
		for round := 0; round < 200 && cb.formed() == 0; round++ {
			var wg sync.WaitGroup
			for w := range workers {
				key := s.key(t, "w"+string(rune('a'+w)))
				wg.Go(func() {
					for range 4 {
						l, err := c.TryAcquire(ctx, key)
						if err != nil {
							t.Errorf("TryAcquire(%q): %v", key, err)
							return
						}
						if l.Key() != key {
							t.Errorf("TryAcquire(%q) returned a lease on %q", key, l.Key())
						}
						if info, err := c.Inspect(ctx, key); err != nil || info.Owner != l.Owner() || info.Token != l.Token() {
							t.Errorf("%q: the store has %+v (%v); the lease is %s, token %d", key, info, err, l.Owner(), l.Token())
						}
						if err := l.Release(ctx); err != nil {
							t.Errorf("Release(%q): %v", key, err)
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
		}
		if cb.formed() == 0 {
			t.Error("16 goroutines on private keys through one Client never formed a batch of two or more: the engine does not coalesce on this backend")
		}
	})
}

// countingBatcher passes a backend's batch capabilities through and
// counts the batches of two or more it is sent.
type countingBatcher struct {
	driver.Backend
	batches atomic.Int64
}

func (c *countingBatcher) formed() int64 { return c.batches.Load() }

type countedAcquirer struct{ c *countingBatcher }

func (c *countingBatcher) acquirer() driver.BatchAcquirer { return countedAcquirer{c} }

func (a countedAcquirer) AcquireBatch(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	if len(reqs) >= 2 {
		a.c.batches.Add(1)
	}
	return a.c.Backend.(driver.BatchAcquirer).AcquireBatch(ctx, reqs)
}

type countedReleaser struct{ c *countingBatcher }

func (c *countingBatcher) releaser() driver.BatchReleaser { return countedReleaser{c} }

func (r countedReleaser) ReleaseBatch(ctx context.Context, gs []driver.Grant) ([]error, error) {
	if len(gs) >= 2 {
		r.c.batches.Add(1)
	}
	return r.c.Backend.(driver.BatchReleaser).ReleaseBatch(ctx, gs)
}
