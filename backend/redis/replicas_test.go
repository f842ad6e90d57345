package redis_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
)

// openHA opens a backend on the redisha cluster (a primary, one replica,
// a Sentinel) under a fresh prefix, with the URL parameters params
// (e.g. "wait_replicas=1").
func openHA(t *testing.T, prefix, params string) *fencelockredis.Backend {
	t.Helper()
	u := withPrefix(testenv.URL(t, "FENCELOCK_TEST_REDISHA"), prefix)
	if params != "" {
		u += "&" + params
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := fencelockredis.Open(ctx, u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func failoverOf(t *testing.T, b *fencelockredis.Backend) driver.Measurement {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := b.Guarantees(ctx)
	if err != nil {
		t.Fatalf("Guarantees: %v", err)
	}
	return m[driver.Failover]
}

// TestReplicaAckedGrantsMeetFailover: with wait_replicas=1 on a primary
// with one replica, grants and renewals succeed, Describe is FailoverSafe
// without a replication warning, and the failover guarantee is met; the
// default (no waiting) leaves it unmet with the asynchronous-replication
// warning.
func TestReplicaAckedGrantsMeetFailover(t *testing.T) {
	prefix := uniquePrefix(t)
	b := openHA(t, prefix, "wait_replicas=1")
	d := b.Describe()
	if !d.FailoverSafe || strings.Contains(strings.Join(d.Warnings, "\n"), "replica") {
		t.Errorf("Describe: FailoverSafe %v, warnings %q; want safe, no replica warning", d.FailoverSafe, d.Warnings)
	}
	if m := failoverOf(t, b); !m.Met || !strings.Contains(m.Observed, "WAIT") {
		t.Errorf("failover = %+v; want met, the WAIT observed", m)
	}
	ctx := t.Context()
	g, err := b.Acquire(ctx, driver.AcquireRequest{Key: "acked", Owner: "o1", TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: 5 * time.Second}); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	rs, err := b.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: 5 * time.Second})
	if err != nil || rs[0].Err != nil {
		t.Fatalf("RenewBatch: %v %+v", err, rs)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatalf("Release: %v", err)
	}

	plain := openHA(t, prefix, "")
	if d := plain.Describe(); d.FailoverSafe || !strings.Contains(strings.Join(d.Warnings, "\n"), "replication is asynchronous") {
		t.Errorf("without wait_replicas: FailoverSafe %v, warnings %q; want unsafe, the asynchronous-replication warning", d.FailoverSafe, d.Warnings)
	}
	if m := failoverOf(t, plain); m.Met || !strings.Contains(m.Fix, "wait_replicas") {
		t.Errorf("without wait_replicas: failover = %+v; want unmet, fixed by wait_replicas", m)
	}
}

// TestUnackedGrantIsRefusedAndRemoved: with wait_replicas=2 and one
// replica, WAIT cannot be satisfied: Acquire fails with a
// *ReplicaAckError (1 of 2 acknowledged) matching ErrReplicasNotAcked,
// and the record it wrote is gone (the key is free); a renewal of a grant
// made without waiting is refused the same way and the record stays.
// Describe warns that every grant will be refused.
func TestUnackedGrantIsRefusedAndRemoved(t *testing.T) {
	prefix := uniquePrefix(t)
	b := openHA(t, prefix, "wait_replicas=2&wait_timeout=50ms")
	if d := b.Describe(); d.FailoverSafe || !strings.Contains(strings.Join(d.Warnings, "\n"), "wait_replicas=2 but only 1 replicas") {
		t.Errorf("Describe: FailoverSafe %v, warnings %q; want the too-many-replicas warning", d.FailoverSafe, d.Warnings)
	}
	if m := failoverOf(t, b); m.Met {
		t.Errorf("failover met with wait_replicas above the connected replicas: %+v", m)
	}
	ctx := t.Context()
	_, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o1", TTL: 10 * time.Second})
	var ae *fencelockredis.ReplicaAckError
	if !errors.Is(err, fencelockredis.ErrReplicasNotAcked) || !errors.As(err, &ae) || ae.Acked != 1 || ae.Want != 2 || ae.Op != "acquire" || ae.Cleanup != nil {
		t.Fatalf("Acquire: %v (%+v); want a *ReplicaAckError, 1 of 2, its record removed", err, ae)
	}
	if !strings.Contains(err.Error(), "wait_replicas") {
		t.Errorf("error %q does not say what to change", err)
	}
	plain := openHA(t, prefix, "")
	if info, err := plain.Inspect(ctx, "k"); err != nil || info.Locked() {
		t.Fatalf("after the refused grant: %+v, %v; want the key free", info, err)
	}
	g, err := plain.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o2", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Renew(ctx, g, driver.RenewRequest{TTL: 10 * time.Second})
	if !errors.As(err, &ae) || ae.Op != "renew" {
		t.Fatalf("Renew: %v; want a *ReplicaAckError for the renewal", err)
	}
	if info, err := plain.Inspect(ctx, "k"); err != nil || info.Owner != "o2" || info.Token != g.Token {
		t.Errorf("after the refused renewal: %+v, %v; want the grant's record kept", info, err)
	}
	rs, err := b.RenewBatch(ctx, []driver.Grant{g}, driver.RenewRequest{TTL: 10 * time.Second})
	if err != nil || !errors.Is(rs[0].Err, fencelockredis.ErrReplicasNotAcked) {
		t.Errorf("RenewBatch: %v %+v; want ErrReplicasNotAcked", err, rs)
	}
}

// TestGrantRefusedWhileReplicaPaused: with wait_replicas=1, a grant made
// while the replica is paused (SIGSTOP) is refused and removed; after it
// resumes grants succeed again. It runs only on a cluster this test
// environment started (it pauses a member).
func TestGrantRefusedWhileReplicaPaused(t *testing.T) {
	const name = "redisha"
	prefix := uniquePrefix(t)
	b := openHA(t, prefix, "wait_replicas=1&wait_timeout=100ms")
	e, err := testenv.FromEnv()
	if err != nil || !e.Owns(name, os.Getenv(testenv.EnvVar(name))) {
		t.Skip("redisha was not started by this test environment: its members are not paused")
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	primary, err := e.Leader(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	replica := map[string]string{"1": "2", "2": "1"}[primary]
	if err := e.PauseMember(ctx, name, replica); err != nil {
		t.Fatal(err)
	}
	_, aerr := b.Acquire(ctx, driver.AcquireRequest{Key: "p", Owner: "o1", TTL: 10 * time.Second})
	if err := e.ResumeMember(ctx, name, replica); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(aerr, fencelockredis.ErrReplicasNotAcked) {
		t.Fatalf("Acquire with the replica paused: %v; want ErrReplicasNotAcked", aerr)
	}
	if info, err := b.Inspect(ctx, "p"); err != nil || info.Locked() {
		t.Fatalf("after the refused grant: %+v, %v; want the key free", info, err)
	}
	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "p", Owner: "o2", TTL: 10 * time.Second}); err != nil {
		t.Fatalf("Acquire after the replica resumed: %v", err)
	}
}

// TestWaitReplicasOptionsValidated: a negative wait_replicas or a bad
// wait_timeout is an *InvalidOptionError before anything is dialled.
func TestWaitReplicasOptionsValidated(t *testing.T) {
	for _, q := range []string{"wait_replicas=-1", "wait_replicas=x", "wait_timeout=soon", "wait_timeout=-1s"} {
		_, err := fencelockredis.Open(t.Context(), "redis://127.0.0.1:1/0?"+q)
		if !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("%s: %v; want ErrInvalidOption", q, err)
		}
	}
}
