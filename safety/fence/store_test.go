package fence

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fencelock/fencelock"
)

// ruleStore is a Store that applies fencelock.Fence's rule; admitAll
// accepts every write (a resource whose check was left out).
type ruleStore struct {
	f        fencelock.Fence
	admitAll bool
	fail     error
}

func (r *ruleStore) Write(_ context.Context, key, lease string, token uint64) (bool, error) {
	if r.fail != nil {
		return false, r.fail
	}
	err := r.f.Check(key, fencelock.Token(token), lease)
	switch {
	case r.admitAll || err == nil:
		return true, nil
	case errors.Is(err, fencelock.ErrStaleToken):
		return false, nil
	default:
		return false, err
	}
}

// steps of TestRule's kind: a fresh lease, the same lease again, a stale
// token, an equal token from another lease.
var storeSteps = []attempt{
	{"k", "a", 5, true, ReasonNewer},
	{"k", "a", 5, true, ReasonSameLease},
	{"k", "b", 4, false, ReasonStale},
	{"k", "c", 5, false, ReasonEqualOtherLease},
	{"k", "d", 6, true, ReasonNewer},
}

// A store that applies fencelock.Fence's rule agrees with the server's
// rule on every write: the log is the one the server alone would write,
// and StoreFaults is empty.
func TestStoreAgreeingWithRuleDecides(t *testing.T) {
	s, c := start(t, true)
	s.SetStore(&ruleStore{})
	run(t, c, storeSteps)
	if f := s.StoreFaults(); len(f) != 0 {
		t.Fatalf("StoreFaults = %q, want none", f)
	}
}

// A store that accepts a stale write decides: the write is logged as
// accepted (so the checker's P1 sees it), and StoreFaults names it.
func TestStoreAcceptingStaleWriteIsLoggedAndReported(t *testing.T) {
	s, c := start(t, true)
	s.SetStore(&ruleStore{admitAll: true})
	d, err := c.Write(context.Background(), "k", "a", "p", 5)
	if err != nil || !d.Accepted {
		t.Fatalf("first write: %+v, %v", d, err)
	}
	d, err = c.Write(context.Background(), "k", "b", "p", 4)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Accepted || d.Reason != ReasonStale {
		t.Fatalf("stale write: %+v; want accepted by the store, reason %q", d, ReasonStale)
	}
	if ev := s.Log()[1]; !ev.Accepted {
		t.Fatalf("logged %+v; want the store's acceptance", ev)
	}
	f := s.StoreFaults()
	if len(f) != 1 || !strings.Contains(f[0], "accepted") || !strings.Contains(f[0], "lease b") {
		t.Fatalf("StoreFaults = %q; want the stale write of lease b", f)
	}
}

// A store that cannot be asked refuses (a write nobody applied did not
// land) and is reported.
func TestStoreFailureRefusesAndIsReported(t *testing.T) {
	s, c := start(t, true)
	s.SetStore(&ruleStore{fail: errors.New("connection refused")})
	d, err := c.Write(context.Background(), "k", "a", "p", 5)
	if err != nil || d.Accepted {
		t.Fatalf("write: %+v, %v; want refused", d, err)
	}
	if f := s.StoreFaults(); len(f) != 1 || !strings.Contains(f[0], "connection refused") {
		t.Fatalf("StoreFaults = %q; want the failure", f)
	}
}

// With fencing off (the negative control) the store is not asked.
func TestStoreNotAskedWithFencingOff(t *testing.T) {
	s, c := start(t, false)
	s.SetStore(&ruleStore{fail: errors.New("asked")})
	if d, err := c.Write(context.Background(), "k", "a", "p", 5); err != nil || !d.Accepted {
		t.Fatalf("write: %+v, %v", d, err)
	}
	if f := s.StoreFaults(); len(f) != 0 {
		t.Fatalf("StoreFaults = %q; the store was asked with fencing off", f)
	}
}
