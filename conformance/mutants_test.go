package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
)

// A suite that cannot fail is worth nothing. Each mutant below breaks one
// invariant of a correct backend (the memory backend, capabilities hidden
// so that nothing rescues it); the suite must fail it, in the case named.

type mutant struct {
	name     string
	wantFail string // the conformance case that must catch it
	wrap     func(s *memory.Store) driver.Backend
}

var mutants = []mutant{
	{"tokens-go-backwards", "FencingTokensIncrease", func(s *memory.Store) driver.Backend { return backwards{plain(s.Backend())} }},
	{"no-exclusion", "MutualExclusion", func(s *memory.Store) driver.Backend { return noExclusion{plain(s.Backend()), s} }},
	{"release-without-owner-check", "OwnerCheckedReleaseAndRenew", func(s *memory.Store) driver.Backend { return anyRelease{plain(s.Backend()), s} }},
	{"never-expires", "CrashedHolderFreedWithinTTL", func(s *memory.Store) driver.Backend { return immortal{plain(s.Backend())} }},
	{"metadata-set-without-holder-check", "MetadataStoredAndHolderOnly", func(s *memory.Store) driver.Backend { return anyMetadata{plain(s.Backend())} }},
	{"store-ttl-shorter-than-granted", "Options", func(s *memory.Store) driver.Backend { return shortLived{plain(s.Backend())} }},
	{"metadata-dropped-on-rotation", "MetadataStoredAndHolderOnly", func(s *memory.Store) driver.Backend { return rotationDropsMetadata{plain(s.Backend())} }},
	{"lock-delay-ignored", "LockDelay", func(s *memory.Store) driver.Backend { return noLockDelay{plain(s.Backend())} }},
	{"release-keeps-lock-delay", "LockDelay", func(s *memory.Store) driver.Backend { return releaseByExpiry{plain(s.Backend()), s} }},
	{"lock-delay-refused-untyped", "LockDelay", func(s *memory.Store) driver.Backend { return refuseLockDelay{plain(s.Backend()), false} }},
}

// sound are backends the suite must pass: a backend that refuses a lock
// delay with the typed error does what the driver asks.
var sound = []mutant{
	{"lock-delay-refused-typed", "LockDelay", func(s *memory.Store) driver.Backend { return refuseLockDelay{plain(s.Backend()), true} }},
}

// refuseLockDelay refuses a positive lock delay: with the typed
// driver.LockDelayUnsupported, or with a bare error matching
// ErrUnsupported that names nothing.
type refuseLockDelay struct {
	driver.Backend
	typed bool
}

func (b refuseLockDelay) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckAcquire(r); err != nil || r.LockDelay == 0 {
		return b.Backend.Acquire(ctx, r)
	}
	if b.typed {
		return driver.Grant{}, driver.LockDelayUnsupported("refusing")
	}
	return driver.Grant{}, fmt.Errorf("no lock delay here: %w", driver.ErrUnsupported)
}

// noLockDelay accepts a lock delay and ignores it.
type noLockDelay struct{ driver.Backend }

func (b noLockDelay) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	r.LockDelay = 0
	return b.Backend.Acquire(ctx, r)
}

// releaseByExpiry releases by expiring the record, as if the holder had
// crashed: the lock delay then follows a clean release too.
type releaseByExpiry struct {
	driver.Backend
	s *memory.Store
}

func (b releaseByExpiry) Release(ctx context.Context, g driver.Grant) error {
	info, err := b.Backend.Inspect(ctx, g.Key)
	if err != nil {
		return err
	}
	if info.Owner != g.Owner || info.Token != g.Token {
		return driver.ErrNotHeld
	}
	b.s.Expire(g.Key)
	return nil
}

// backwards issues tokens that decrease.
type backwards struct{ driver.Backend }

const top = 1 << 40

func flip(t driver.Token) driver.Token {
	if t == 0 {
		return 0
	}
	return top - t
}

func (b backwards) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	g, err := b.Backend.Acquire(ctx, r)
	g.Token = flip(g.Token)
	return g, err
}
func (b backwards) Renew(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error) {
	g.Token = flip(g.Token)
	g, err := b.Backend.Renew(ctx, g, r)
	g.Token = flip(g.Token)
	return g, err
}
func (b backwards) Release(ctx context.Context, g driver.Grant) error {
	g.Token = flip(g.Token)
	return b.Backend.Release(ctx, g)
}
func (b backwards) Inspect(ctx context.Context, key string) (driver.Info, error) {
	i, err := b.Backend.Inspect(ctx, key)
	i.Token = flip(i.Token)
	return i, err
}
func (b backwards) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	is, err := b.Backend.List(ctx, prefix)
	for k := range is {
		is[k].Token = flip(is[k].Token)
	}
	return is, err
}

// noExclusion takes the key from its holder instead of refusing.
type noExclusion struct {
	driver.Backend
	s *memory.Store
}

func (b noExclusion) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	g, err := b.Backend.Acquire(ctx, r)
	if err == nil {
		return g, nil
	}
	b.s.Expire(r.Key)
	return b.Backend.Acquire(ctx, r)
}

// anyRelease releases whoever holds the key.
type anyRelease struct {
	driver.Backend
	s *memory.Store
}

func (b anyRelease) Release(ctx context.Context, g driver.Grant) error {
	if _, err := b.s.Backend().ForceRelease(ctx, g.Key); err != nil {
		return err
	}
	return nil
}

// immortal ignores the TTL.
type immortal struct{ driver.Backend }

func (b immortal) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	if r.TTL > 0 {
		r.TTL = time.Hour
	}
	return b.Backend.Acquire(ctx, r)
}

// shortLived keeps every record at most a second (the harness's TTL),
// whatever TTL it reports in its grants: a store that applies a shorter
// TTL than it grants. PerCallTTLHonoured's long lease is lost while it is
// renewed at a third of the TTL it was told.
type shortLived struct{ driver.Backend }

const shortLife = time.Second

func (b shortLived) Acquire(ctx context.Context, r driver.AcquireRequest) (driver.Grant, error) {
	asked := r.TTL
	r.TTL = min(r.TTL, shortLife)
	g, err := b.Backend.Acquire(ctx, r)
	if err == nil {
		g.TTL = asked
	}
	return g, err
}

func (b shortLived) Renew(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error) {
	asked := r.TTL
	r.TTL = min(r.TTL, shortLife)
	ng, err := b.Backend.Renew(ctx, g, r)
	if err == nil {
		ng.TTL = asked
	}
	return ng, err
}

// anyMetadata lets any grant set the metadata: refused, it sets it as the
// current holder.
type anyMetadata struct{ driver.Backend }

func (b anyMetadata) Renew(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error) {
	ng, err := b.Backend.Renew(ctx, g, r)
	if errors.Is(err, driver.ErrNotHeld) && r.SetMetadata {
		if info, ierr := b.Backend.Inspect(ctx, g.Key); ierr == nil && info.Locked() {
			_, _ = b.Backend.Renew(ctx, driver.Grant{Key: g.Key, Owner: info.Owner, Token: info.Token}, driver.RenewRequest{TTL: r.TTL, SetMetadata: true, Metadata: r.Metadata})
		}
	}
	return ng, err
}

// rotationDropsMetadata loses the metadata when it rotates the token.
type rotationDropsMetadata struct{ driver.Backend }

func (b rotationDropsMetadata) Renew(ctx context.Context, g driver.Grant, r driver.RenewRequest) (driver.Grant, error) {
	ng, err := b.Backend.Renew(ctx, g, r)
	if err == nil && r.Rotate {
		return b.Backend.Renew(ctx, ng, driver.RenewRequest{TTL: r.TTL, SetMetadata: true})
	}
	return ng, err
}

// TestHelperMutantSuite runs the suite on the mutant named by the
// environment; it is the child process of TestSuiteCatchesBrokenBackends.
func TestHelperMutantSuite(t *testing.T) {
	name := os.Getenv("FENCELOCK_CONFORMANCE_MUTANT")
	if name == "" {
		t.Skip("helper process for TestSuiteCatchesBrokenBackends")
	}
	for _, m := range append(mutants, sound...) {
		if m.name == name {
			store := memory.NewStore()
			conformance.Run(t, conformance.Harness{
				Open:   func(context.Context) (driver.Backend, error) { return m.wrap(store), nil },
				Leases: 10,
			})
			return
		}
	}
	t.Fatalf("unknown mutant %q", name)
}

func TestSuiteCatchesBrokenBackends(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite once per mutant")
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperMutantSuite$/^"+m.wantFail+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "FENCELOCK_CONFORMANCE_MUTANT="+m.name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a backend whose %s; output:\n%s", m.name, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestHelperMutantSuite/"+m.wantFail) {
				t.Fatalf("mutant %s was not caught by case %s; output:\n%s", m.name, m.wantFail, out)
			}
			if !strings.Contains(string(out), "rule:") {
				t.Errorf("failing case did not explain its rule; output:\n%s", out)
			}
		})
	}
}

// TestSuitePassesSoundBackends runs the named case on each sound backend:
// the suite must pass it (a refused lock delay, typed, is a skip).
func TestSuitePassesSoundBackends(t *testing.T) {
	for _, m := range sound {
		t.Run(m.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperMutantSuite$/^"+m.wantFail+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "FENCELOCK_CONFORMANCE_MUTANT="+m.name)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the suite failed a sound backend (%s): %v; output:\n%s", m.name, err, out)
			}
			if !strings.Contains(string(out), "--- SKIP: TestHelperMutantSuite/"+m.wantFail) {
				t.Errorf("case %s was not skipped with the typed refusal; output:\n%s", m.wantFail, out)
			}
		})
	}
}
