package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencelock/fencelock/conformance"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
)

// The tests of this file run on scripts/testenv's rediscluster: three
// masters with a replica each (FENCELOCK_TEST_REDISCLUSTER).
const redisClusterName = "rediscluster"

// TestConformanceCluster runs the suite through a ClusterClient on the
// three-master Cluster, where keys of different slots live on different
// nodes: batch renewals split by node, the release channel's
// subscription on another node than the lock, List over every master.
// The restart case runs on the one-node Cluster (TestClusterConformance).
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	url := withPrefix(testenv.URL(t, "FENCELOCK_TEST_REDISCLUSTER"), uniquePrefix(t))
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Backend, error) {
			return fencelockredis.Open(ctx, url)
		},
		TTL:    time.Second,
		Leases: 200,
	})
}

// clusterEnv returns the Cluster's URL and the testenv state that started
// it (to move its slots); it skips (fails under CI) when the Cluster is
// not one testenv started.
func clusterEnv(t *testing.T) (string, *testenv.Env) {
	t.Helper()
	url := testenv.URL(t, "FENCELOCK_TEST_REDISCLUSTER")
	e, err := testenv.FromEnv()
	if err == nil && !e.Owns(redisClusterName, url) {
		err = errors.New("FENCELOCK_TEST_REDISCLUSTER is not the rediscluster of FENCELOCK_TESTENV_STATE")
	}
	if err != nil {
		if testenv.IsCI() {
			t.Fatalf("moving slots needs the rediscluster testenv started: %v", err)
		}
		t.Skipf("moving slots needs the rediscluster testenv started: %v", err)
	}
	return url, e
}

// TestLocksSurviveSlotMigration moves the slots of held keys to another
// master, live (SETSLOT IMPORTING/MIGRATING, MIGRATE key by key with
// pauses, SETSLOT NODE), while their holder renews every 50 ms and a
// contender tries to take them: the scripts meet ASK, MOVED and TRYAGAIN
// (a script whose lock key has moved while its counter has not). The
// holder keeps every lock (no renewal refused as not held), the
// contender never acquires a held key, every call returns within its
// bound, and after the migration the holder renews on the new master and
// the next grant's token is higher. With and without wait_replicas.
func TestLocksSurviveSlotMigration(t *testing.T) {
	base, e := clusterEnv(t)
	for _, tc := range []struct{ name, params string }{
		{"default", ""},
		{"wait_replicas", "&wait_replicas=1&wait_timeout=500ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			prefix := uniquePrefix(t)
			url := withPrefix(base, prefix) + tc.params
			holder, err := fencelockredis.Open(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Close()
			contender, err := fencelockredis.Open(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer contender.Close()

			const ttl = 2 * time.Second
			const bound = time.Second // each call's deadline
			keys := []string{"m1", "m2", "m3"}
			grants := make([]driver.Grant, len(keys))
			for i, k := range keys {
				if grants[i], err = holder.Acquire(ctx, driver.AcquireRequest{Key: k, Owner: "holder", TTL: ttl}); err != nil {
					t.Fatalf("Acquire(%s): %v", k, err)
				}
			}
			var (
				mu       sync.Mutex
				errs     = map[string]int{}
				failures []string
			)
			note := func(what string, err error, took time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs[what+": "+firstWord(err)]++
				}
				if took > bound+250*time.Millisecond {
					failures = append(failures, fmt.Sprintf("%s took %v, past its %v deadline", what, took, bound))
				}
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var renewals atomic.Int64
			for i := range keys {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(50 * time.Millisecond):
						}
						cctx, cancel := context.WithTimeout(ctx, bound)
						began := time.Now()
						g, err := holder.Renew(cctx, grants[i], driver.RenewRequest{TTL: ttl})
						cancel()
						note("renew", err, time.Since(began))
						switch {
						case err == nil:
							mu.Lock()
							grants[i] = g
							mu.Unlock()
							renewals.Add(1)
						case errors.Is(err, driver.ErrNotHeld):
							mu.Lock()
							failures = append(failures, fmt.Sprintf("renewal of %s refused as not held: %v", keys[i], err))
							mu.Unlock()
							return
						}
					}
				})
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(30 * time.Millisecond):
						}
						cctx, cancel := context.WithTimeout(ctx, bound)
						began := time.Now()
						g, err := contender.Acquire(cctx, driver.AcquireRequest{Key: keys[i], Owner: "contender", TTL: ttl})
						cancel()
						if errors.Is(err, driver.ErrNotAcquired) {
							err = nil
						} else if err == nil {
							mu.Lock()
							failures = append(failures, fmt.Sprintf("contender acquired held key %s (token %d)", keys[i], g.Token))
							mu.Unlock()
						}
						note("acquire", err, time.Since(began))
					}
				})
			}
			masters, err := e.Masters(ctx, redisClusterName)
			if err != nil || len(masters) < 2 {
				t.Fatalf("masters %v: %v", masters, err)
			}
			for _, k := range keys {
				slot, err := e.SlotOf(ctx, redisClusterName, "{"+prefix+":"+k+"}:lock")
				if err != nil {
					t.Fatal(err)
				}
				from, err := e.SlotMaster(ctx, redisClusterName, slot)
				if err != nil {
					t.Fatal(err)
				}
				to := masters[0]
				if to == from {
					to = masters[1]
				}
				if _, err := e.MigrateSlot(ctx, redisClusterName, slot, to, 150*time.Millisecond); err != nil {
					t.Fatalf("moving slot %d of %s: %v", slot, k, err)
				}
			}
			// Renewals go on on the new masters.
			before := renewals.Load()
			deadline := time.Now().Add(5 * time.Second)
			for renewals.Load() < before+int64(3*len(keys)) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			t.Logf("errors during the migration: %v; %d renewals", errs, renewals.Load())
			for _, f := range failures {
				t.Error(f)
			}
			if renewals.Load() < before+int64(3*len(keys)) {
				t.Errorf("renewals after the migration: %d, want %d", renewals.Load()-before, 3*len(keys))
			}
			for i, k := range keys {
				if err := holder.Release(ctx, grants[i]); err != nil {
					t.Fatalf("Release(%s) after the migration: %v", k, err)
				}
				g, err := contender.Acquire(ctx, driver.AcquireRequest{Key: k, Owner: "contender", TTL: ttl})
				if err != nil {
					t.Fatalf("Acquire(%s) after the migration: %v", k, err)
				}
				if g.Token <= grants[i].Token {
					t.Errorf("%s: token %d after the migration, not above the holder's %d: the counter did not move with the lock", k, g.Token, grants[i].Token)
				}
			}
		})
	}
}

// firstWord is an error's kind for counting: its first word (TRYAGAIN,
// ASK, MOVED, CLUSTERDOWN, context …).
func firstWord(err error) string {
	s := err.Error()
	for i, r := range s {
		if r == ' ' {
			return s[:i]
		}
	}
	return s
}
