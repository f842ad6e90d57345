// Package conformance is the test suite every fencelock backend passes.
//
// A backend's test calls Run with a Harness that opens connections to a
// real store; each case is named after the invariant it proves and, when it
// fails, explains the rule. Cases that need a capability the backend lacks
// (force-release, token rotation, a store restart hook) are skipped with
// the capability's name, never silently passed.
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Harness{
//			Open: func(ctx context.Context) (driver.Backend, error) { return mybackend.Open(ctx, dsn) },
//			TTL:  time.Second,
//		})
//	}
//
// Third-party backends use it the same way. Keys live under a random
// prefix, so runs can share a store.
package conformance

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// Harness tells the suite how to reach the store under test.
type Harness struct {
	// Open returns a new connection to the store: a separate backend value,
	// as a separate process would have. Required. The suite closes what it
	// opens.
	Open func(ctx context.Context) (driver.Backend, error)

	// TTL is the lease TTL the suite asks for. The store may grant another
	// (driver.Grant.TTL: etcd rounds up to whole seconds, ZooKeeper
	// negotiates a session timeout of 2..20 × tickTime): every case that
	// waits for a crashed holder's key to expire waits for the TTL the
	// store granted, never for this one. Default 1s.
	TTL time.Duration

	// Slack is how late a timed event may be observed and still pass
	// (scheduling, round trips, a store's expiry sweep). Default TTL/2 plus
	// 250ms. For a wait on the store's expiry of a grant whose TTL is
	// longer than TTL, it grows in proportion (Slack × granted/TTL).
	Slack time.Duration

	// Crash, if set, makes the backend b behave as if its process died:
	// nothing is released and no keep-alive is sent any more. The default
	// just stops using b, which is right for record stores (PostgreSQL,
	// Redis, MongoDB) but not for a session store whose client library
	// keeps its session alive by itself.
	Crash func(b driver.Backend)

	// Restart, if set, crashes the store (kill -9) and starts it again with
	// its data, returning once it accepts connections again. It enables the
	// case that checks fencing tokens across a store restart.
	Restart func(ctx context.Context) error

	// Leases is how many leases the many-leases case holds at once.
	// Default 1000.
	Leases int
}

func (h *Harness) defaults() {
	if h.TTL == 0 {
		h.TTL = time.Second
	}
	if h.Slack == 0 {
		h.Slack = h.TTL/2 + 250*time.Millisecond
	}
	if h.Leases == 0 {
		h.Leases = 1000
	}
}

// Run runs every conformance case against the harness's store.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil {
		t.Fatal("conformance: Harness.Open is required")
	}
	h.defaults()
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	s := &suite{h: h, prefix: "conformance-" + hex.EncodeToString(rnd[:]) + "/"}
	s.reportCapabilities(t)
	runCases(t, s, cases)
}

type testCase struct {
	name string
	rule string
	run  func(t *testing.T, s *suite)
}

var cases = []testCase{
	{"BadInputRejectedAndNothingStored", "empty, oversized, non-UTF-8 and control-character keys, an empty owner, and TTLs out of range in Acquire and Renew, are rejected by the backend itself with typed errors (ErrInvalidKey, ErrInvalidOption), and nothing is stored.", testBadInput},
	{"OddKeysRoundTrip", "any valid key (spaces, slashes, dots, braces, percent signs, non-ASCII) is stored and reported back exactly, and distinct keys never collide.", testOddKeys},
	{"MutualExclusion", "at any instant at most one holder per key: many clients hammering one key never overlap, and a counter they increment under the lock ends exact.", testMutualExclusion},
	{"FencingTokensIncrease", "a key's tokens strictly increase across holders, release and re-acquire, takeover after expiry and force-release.", testTokensIncrease},
	{"TokenRotationIncreases", "a renewal that rotates the token returns a higher token for the same holder, and later holders get higher ones still.", testRotation},
	{"FencingAcrossStoreRestart", "tokens keep increasing after the store is killed and restarted with its data.", testRestart},
	{"CrashedHolderFreedWithinTTL", "a holder that dies without releasing frees its key within the TTL the store granted (Grant.TTL, else the one asked for) plus slack, and not before that TTL has passed.", testCrashRelease},
	{"RenewalKeepsLeaseAlive", "a renewed lease stays held across many TTLs and nobody else can acquire it meanwhile.", testRenewal},
	{"LossSignalledWithinBound", "when the store no longer has the holder's record, the holder's Done closes and Err reports ErrLeaseLost within one renewal interval plus slack.", testLossSignalled},
	{"OwnerCheckedReleaseAndRenew", "only the current holder, with its own token, can release or renew; a stale or forged grant gets ErrNotHeld and changes nothing.", testOwnerChecked},
	{"CancelledWaitLeavesNothing", "an Acquire whose context ends while waiting returns the context's error and leaves no record or queue entry: the next contender gets the key at once.", testCancelledWait},
	{"WaiterWokenOnRelease", "a waiting Acquire gets the key promptly once the holder releases it.", testWaiterWoken},
	{"InspectAndListAgree", "Inspect and List report exactly the held keys, with the holders' owners and tokens, and nothing after release.", testInspectList},
	{"CloseReleasesEverything", "Client.Close releases every lease it holds, ends them (Done closed), and makes the keys available at once.", testClose},
	{"ObserverSeesLifecycle", "the engine reports the same events on every backend: acquired → renewed… → released; a blocking acquire that finds the key held reports waiting, and its acquired event is marked contended; a taken lease ends with lost (cause ErrNotHeld).", testObserver},
	{"TokenFloorHolds", "a TokenFloorer reports the highest token it issued per key, and after RaiseFloor every new token of that key (or of every key, for a global floor) is above the floor; a held lock keeps its token; raising to a lower floor changes nothing; a bad key is rejected; and while contenders take a key in turn (queued or polling, rotating), raises from other connections and high-water reads never let a token fall at or below a floor raised before its acquire began, and HighWater is never below a token issued before it was called.", testTokenFloor},
	{"MetadataStoredAndHolderOnly", "a metadata payload (any bytes, up to driver.MaxMetadataLen; empty reads back as nil) is stored by Acquire and reported by Inspect and List; only the current holder's Renew with SetMetadata replaces it (a stale or forged grant gets ErrNotHeld and changes nothing); a Renew without SetMetadata, RenewBatch and rotation keep it; a same-owner re-Acquire replaces it; Release and ForceRelease drop it; an oversized payload is refused with an *InvalidOptionError and nothing is stored.", testMetadata},
	{"ManyLeasesOneClient", "one client can hold many leases at once and keep all of them alive through renewals.", testManyLeases},
	{"Semaphore", "recipe.Semaphore, generic over every backend (each permit a lease on a slot key), through the store: at most N holders, cancelled waits leave nothing, a different N is refused, Holders lists every holder, crashed holders' permits return within TTL (subtests, each with its own rule).", testSemaphore},
	{"ReadWrite", readWriteRule, testReadWrite},
	{"MultiKey", multiKeyRule, testMultiKey},
	{"LockDelay", lockDelayRule, testLockDelay},
	{"Options", "per-call options are honoured through the store: WithTTL, WithMinHold, WithMetadata and WithLabel (subtests, each with its own rule).", testOptions},
	{"Election", electionRule, testElection},
	{"Batching", batchRule, testBatch},
}

type suite struct {
	h      Harness
	prefix string
	n      atomic.Int64
}

// key returns a fresh key for a case.
func (s *suite) key(t *testing.T, name string) string {
	return fmt.Sprintf("%s%s/%d/%s", s.prefix, strings.ReplaceAll(t.Name(), "/", "."), s.n.Add(1), name)
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// backend opens a raw backend, closed at the end of the test.
func (s *suite) backend(t *testing.T) driver.Backend {
	t.Helper()
	b, err := s.h.Open(t.Context())
	if err != nil {
		t.Fatalf("Harness.Open: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func (s *suite) options() *fencelock.Options {
	return &fencelock.Options{
		TTL:            s.h.TTL,
		MinBackoff:     2 * time.Millisecond,
		MaxBackoff:     max(s.h.TTL/8, 10*time.Millisecond),
		ReleaseTimeout: 10 * time.Second,
	}
}

// client opens a backend and a Client on it, closed at the end of the test.
func (s *suite) client(t *testing.T) *fencelock.Client {
	t.Helper()
	return s.clientWith(t, s.options())
}

func (s *suite) clientWith(t *testing.T, o *fencelock.Options) *fencelock.Client {
	t.Helper()
	b, err := s.h.Open(t.Context())
	if err != nil {
		t.Fatalf("Harness.Open: %v", err)
	}
	c, err := fencelock.New(b, o)
	if err != nil {
		b.Close()
		t.Fatalf("fencelock.New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Client.Close: %v", err)
		}
	})
	return c
}

// runCases runs each case as a subtest and, if it fails, logs its rule.
func runCases(t *testing.T, s *suite, cases []testCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Helper()
			defer func() {
				if t.Failed() {
					t.Logf("rule: %s", c.rule)
				}
			}()
			c.run(t, s)
		})
	}
}

func (s *suite) reportCapabilities(t *testing.T) {
	b, err := s.h.Open(t.Context())
	if err != nil {
		t.Fatalf("Harness.Open: %v", err)
	}
	defer b.Close()
	caps := Capabilities(b)
	var have, lack []string
	for _, c := range caps {
		if c.Present {
			have = append(have, c.Name)
		} else {
			lack = append(lack, c.Name)
		}
	}
	t.Logf("backend capabilities: %s; lacks: %s", strings.Join(have, ", "), strings.Join(lack, ", "))
	if d, ok := b.(driver.Describer); ok {
		desc := d.Describe()
		t.Logf("backend %q: fencing: %s (scope %s); clock: %s; liveness: %s; failover-safe %v: %s; loss detection: %s",
			desc.Name, desc.Fencing, desc.Scope, desc.Clock, desc.Liveness, desc.FailoverSafe, desc.Failover, desc.LossDetection)
		if desc.Name == "" || (desc.Scope != driver.ScopeKey && desc.Scope != driver.ScopeStore) || desc.Failover == "" || desc.LossDetection == "" {
			t.Errorf("Describe() = %+v: Name, Scope (driver.ScopeKey or ScopeStore), Failover and LossDetection are required: the safety report puts these claims beside its measurements", desc)
		}
		for _, w := range desc.Warnings {
			t.Logf("backend warning: %s", w)
		}
	}
}

// Capability is one optional interface of package driver.
type Capability struct {
	// Name is the interface's name, e.g. "Waiter".
	Name string
	// Present reports whether the backend implements it.
	Present bool
}

// Capabilities reports which optional driver interfaces b implements.
func Capabilities(b driver.Backend) []Capability {
	_, waiter := b.(driver.Waiter)
	_, watcher := driver.Watches(b)
	_, batch := b.(driver.BatchRenewer)
	_, loss := b.(driver.LossNotifier)
	_, force := b.(driver.ForceReleaser)
	_, desc := b.(driver.Describer)
	_, floor := b.(driver.TokenFloorer)
	_, bacq := b.(driver.BatchAcquirer)
	_, brel := b.(driver.BatchReleaser)
	return []Capability{
		{"Waiter", waiter}, {"Watcher", watcher}, {"BatchRenewer", batch},
		{"LossNotifier", loss}, {"ForceReleaser", force}, {"Describer", desc},
		{"TokenFloorer", floor}, {"BatchAcquirer", bacq}, {"BatchReleaser", brel},
	}
}

func requireForce(t *testing.T, b driver.Backend) driver.ForceReleaser {
	t.Helper()
	f, ok := b.(driver.ForceReleaser)
	if !ok {
		t.Skip("capability ForceReleaser not implemented by this backend: case not run")
	}
	return f
}

// crash makes b stop as a dead process would.
func (s *suite) crash(b driver.Backend) {
	if s.h.Crash != nil {
		s.h.Crash(b)
	}
}

// rawAcquire acquires key directly on b (no engine, so no renewals).
func rawAcquire(t *testing.T, ctx context.Context, b driver.Backend, key string, ttl time.Duration) driver.Grant {
	t.Helper()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Owner: "conformance-" + randHex(), TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	if g.Token == 0 {
		t.Fatalf("Acquire(%q) returned token 0; tokens start at 1", key)
	}
	return g
}

func randHex() string {
	var b [6]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// grantedTTL returns the TTL the store granted g: g.TTL when the backend
// reported one (it does when it differs from the request), else requested.
func grantedTTL(g driver.Grant, requested time.Duration) time.Duration {
	if g.TTL > 0 {
		return g.TTL
	}
	return requested
}

// expiryBound returns how long after it was granted the store may keep the
// record of g, asked for with TTL requested, once its holder has died: the
// granted TTL plus slack. Cases that wait for a crash release or an expiry
// wait this long, never the requested TTL plus slack: a store that granted
// more (ZooKeeper with tickTime 2000 turns 3s into 4s) keeps the record
// longer, and rightly so.
func (s *suite) expiryBound(g driver.Grant, requested time.Duration) time.Duration {
	ttl := grantedTTL(g, requested)
	slack := s.h.Slack
	if ttl > requested {
		slack = time.Duration(float64(slack) * float64(ttl) / float64(requested))
	}
	return ttl + slack
}

// patient is the per-call option of a waiter whose own lease is not what
// a case measures (the waiter for a crashed holder's key, say): a TTL of
// five times the suite's, so a store answer delayed by a loaded machine
// (an fsync stalled for most of a second) is not refused as a late grant
// (ErrLocalExpiry) while the store did free the key in time.
func (s *suite) patient() fencelock.AcquireOption {
	return fencelock.WithTTL(5 * s.h.TTL)
}

// waitFree tries key with c, every 10ms, until it gets it, failing t at
// deadline. It returns the lease and when it got it.
func (s *suite) waitFree(t *testing.T, ctx context.Context, c *fencelock.Client, key string, deadline time.Time) (*fencelock.Lease, time.Time) {
	t.Helper()
	for {
		l, err := c.TryAcquire(ctx, key, s.patient())
		if err == nil {
			return l, time.Now()
		}
		if !errors.Is(err, fencelock.ErrNotAcquired) {
			t.Fatalf("TryAcquire(%q): %v", key, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q still held at the deadline: %v", key, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("context ended: %v", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func checkEmpty(t *testing.T, ctx context.Context, c *fencelock.Client, prefix string) {
	t.Helper()
	infos, err := c.List(ctx, prefix)
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	if len(infos) != 0 {
		t.Fatalf("List(%q) = %v; want nothing stored", prefix, infos)
	}
}

func mustRelease(t *testing.T, l *fencelock.Lease) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release(%q): %v", l.Key(), err)
	}
}

var _ = sync.Mutex{}
