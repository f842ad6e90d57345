package postgres_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/postgres"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
)

// openHA opens a client on a PostgreSQL cluster of the test environment
// (postgresha or postgresha-sync) with a table of its own.
func openHA(t *testing.T, envVar string) (*fencelock.Client, string) {
	t.Helper()
	base := testenv.URL(t, envVar)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := withParams(t, base, "table", uniqueTable(t, base))
	c, err := fencelock.Open(ctx, url, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, url
}

func failover(t *testing.T, c *fencelock.Client) driver.Measurement {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := c.Backend().(driver.Guarantor).Guarantees(ctx)
	if err != nil {
		t.Fatalf("Guarantees: %v", err)
	}
	return m[driver.Failover]
}

// TestAsyncStandbyIsWarnedAndFailoverUnmet: on a primary with an
// asynchronous streaming standby (postgresha), Describe warns about the
// standby by name, is not FailoverSafe, and the failover guarantee is
// unmet with the standby's sync_state observed.
func TestAsyncStandbyIsWarnedAndFailoverUnmet(t *testing.T) {
	c, _ := openHA(t, "FENCELOCK_TEST_POSTGRESHA")
	d := c.Describe()
	if d.FailoverSafe {
		t.Error("Describe: FailoverSafe with an asynchronous standby")
	}
	if w := strings.Join(d.Warnings, "\n"); !strings.Contains(w, "asynchronous standby member") || !strings.Contains(w, "(async)") {
		t.Errorf("Describe warnings %q: want the asynchronous standby named", d.Warnings)
	}
	m := failover(t, c)
	if m.Met || !strings.Contains(m.Observed, "streaming, async") || !strings.Contains(m.Fix, "synchronous_standby_names") {
		t.Errorf("failover = %+v; want unmet, the async standby observed and the fix", m)
	}
}

// TestSyncStandbyMeetsFailover: with a synchronous standby and
// synchronous_commit = remote_apply (postgresha-sync), Describe has no
// standby warning and is FailoverSafe, and Open with require=failover
// succeeds.
func TestSyncStandbyMeetsFailover(t *testing.T) {
	c, url := openHA(t, "FENCELOCK_TEST_POSTGRESHA_SYNC")
	d := c.Describe()
	if !d.FailoverSafe || len(d.Warnings) != 0 {
		t.Errorf("Describe: FailoverSafe %v, warnings %q; want safe, none", d.FailoverSafe, d.Warnings)
	}
	m := failover(t, c)
	if !m.Met || !strings.Contains(m.Observed, "streaming, sync") || !strings.Contains(m.Observed, "synchronous_commit=remote_apply") {
		t.Errorf("failover = %+v; want met, the sync standby and remote_apply observed", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c2, err := fencelock.Open(ctx, withParams(t, url, "require", "failover,durable-tokens"), nil)
	if err != nil {
		t.Fatalf("Open with require=failover on a synchronous standby: %v", err)
	}
	c2.Close()
}

// TestSingleServerFailoverUnmetWithoutWarning: the plain test server has
// no standby: failover unmet ("no standby streams"), no standby warning.
func TestSingleServerFailoverUnmetWithoutWarning(t *testing.T) {
	c, _ := openHA(t, "FENCELOCK_TEST_POSTGRES")
	if d := c.Describe(); d.FailoverSafe || strings.Contains(strings.Join(d.Warnings, "\n"), "standby") {
		t.Errorf("Describe: FailoverSafe %v, warnings %q; want not safe, no standby warning", d.FailoverSafe, d.Warnings)
	}
	if m := failover(t, c); m.Met || !strings.Contains(m.Observed, "no standby streams") {
		t.Errorf("failover = %+v; want unmet, no standby observed", m)
	}
}

// TestSyncStandbyPromotedKeepsLockAndClientFollows kills the primary of
// postgresha-sync (kill -9), promotes the standby, and checks that the
// same client, through the URL's two hosts and
// target_session_attrs=read-write, reaches the new primary, which has the
// lock granted before the kill (its owner and token) and issues a higher
// token for the next grant. It runs only on a cluster this test
// environment started (it kills a member).
func TestSyncStandbyPromotedKeepsLockAndClientFollows(t *testing.T) {
	const name = "postgresha-sync"
	c, _ := openHA(t, "FENCELOCK_TEST_POSTGRESHA_SYNC")
	e, err := testenv.FromEnv()
	if err != nil || !e.Owns(name, os.Getenv(testenv.EnvVar(name))) {
		t.Skip("postgresha-sync was not started by this test environment: its members are not killed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	held, err := c.TryAcquire(ctx, "ha/held", fencelock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	primary, err := e.Leader(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	standby := map[string]string{"1": "2", "2": "1"}[primary]
	if err := e.KillMember(ctx, name, primary); err != nil {
		t.Fatal(err)
	}
	if err := e.Promote(ctx, name, standby); err != nil {
		t.Fatal(err)
	}
	// The old primary comes back as the new one's standby: commits wait
	// for it (remote_apply), so it must run before the next grant.
	if err := e.StartMember(ctx, name, primary); err != nil {
		t.Fatal(err)
	}
	var info fencelock.Info
	for {
		info, err = c.Inspect(ctx, "ha/held")
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // pooled connections to the dead primary fail once each
	}
	if err != nil {
		t.Fatalf("Inspect after the failover: %v", err)
	}
	if info.Owner != held.Owner() || info.Token != held.Token() {
		t.Fatalf("after the failover the lock is %+v; want owner %s, token %d", info, held.Owner(), held.Token())
	}
	var next *fencelock.Lease
	for {
		next, err = c.TryAcquire(ctx, "ha/next")
		if err == nil || errors.Is(err, fencelock.ErrNotAcquired) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("TryAcquire on the promoted standby: %v", err)
	}
	defer next.Release(context.Background())
	if next.Token() <= held.Token() {
		t.Errorf("token %d after the failover, not above %d granted before it", next.Token(), held.Token())
	}
}
