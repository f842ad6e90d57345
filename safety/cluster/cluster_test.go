package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pause"
	"github.com/fencelock/fencelock/safety/cluster"

	_ "github.com/fencelock/fencelock/safety/backends" // etcd://, zk://, redis+sentinel://
)

// startEnv, when "1", lets these tests start a cluster themselves (with
// cluster.Up, in a state dir of their own) when its variable is not set.
const startEnv = "FENCELOCK_SAFETY_START_CLUSTERS"

// clusterUnderTest returns the Testenv and URL of the named cluster: the one
// named by its variable (FENCELOCK_TEST_ETCD3, ...) when the safety runner
// or a developer started it with `scripts/testenv up etcd3 ...`, else one the
// test starts if FENCELOCK_SAFETY_START_CLUSTERS=1. Otherwise the test is
// skipped, but fails under CI=true: in CI a missing server is an error.
func clusterUnderTest(t *testing.T, name string) (*cluster.Testenv, string) {
	t.Helper()
	v := cluster.EnvVar(name)
	if url := os.Getenv(v); url != "" {
		te, err := cluster.FromEnv()
		if err != nil {
			t.Fatalf("%s is set but its state dir is not: %v (only a cluster that testenv started can have members killed)", v, err)
		}
		return te, url
	}
	if os.Getenv(startEnv) == "1" {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		te, err := cluster.Up(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := te.Down(ctx); err != nil {
				t.Errorf("down: %v", err)
			}
		})
		if te.URL(name) == "" {
			t.Fatalf("cluster.Up(%s) did not start it (see its messages above)", name)
		}
		return te, te.URL(name)
	}
	if ci := os.Getenv("CI"); ci == "true" || ci == "1" {
		t.Fatalf("%s is not set: under CI the clusters must be running (out=$(scripts/testenv up %s) && eval \"$out\", or %s=1)", v, name, startEnv)
	}
	t.Skipf("%s is not set: start the cluster with out=$(scripts/testenv up %s) && eval \"$out\", or set %s=1", v, name, startEnv)
	return nil, ""
}

var clusters = []string{cluster.Etcd3, cluster.ZooKeeper3, cluster.RedisHA, cluster.NATS3}

// TestLeaderKilledNewLeaderServes kills the leader (primary) of each cluster
// with SIGKILL and checks that another member becomes leader, that a client
// of the cluster's URL opened before the kill acquires a lock again through
// the survivors, and that the killed member comes back with its data.
func TestLeaderKilledNewLeaderServes(t *testing.T) {
	for _, name := range clusters {
		t.Run(name, func(t *testing.T) {
			te, url := clusterUnderTest(t, name)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			client, err := fencelock.Open(ctx, url, &fencelock.Options{TTL: 5 * time.Second})
			if err != nil {
				t.Fatalf("open %s: %v", url, err)
			}
			defer client.Close()
			key := fmt.Sprintf("safety-cluster-test/%s/%d", name, time.Now().UnixNano())
			acquireRelease(ctx, t, client, key, "before the kill")

			old, err := te.Leader(ctx, name)
			if err != nil {
				t.Fatalf("leader: %v", err)
			}
			if err := te.Kill(ctx, name, old); err != nil {
				t.Fatalf("kill leader %s: %v", old, err)
			}
			if _, err := te.MemberPID(ctx, name, old); !errors.Is(err, cluster.ErrNotRunning) {
				t.Fatalf("member %s after kill: pid error %v, want ErrNotRunning", old, err)
			}
			killed := time.Now()
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			next, err := te.WaitLeader(wctx, name, old)
			wcancel()
			if err != nil {
				t.Fatalf("after killing leader %s: %v", old, err)
			}
			t.Logf("leader %s killed; member %s leads after %v", old, next, time.Since(killed).Round(time.Millisecond))

			acquireRelease(ctx, t, client, key, "after the failover")

			if err := te.Start(ctx, name, old); err != nil {
				t.Fatalf("start %s again: %v", old, err)
			}
			ms, err := te.Members(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				if m.State != cluster.Running || m.PID <= 0 {
					t.Errorf("member %+v: want running with a PID after the restart", m)
				}
			}
			acquireRelease(ctx, t, client, key, "after the restart")
		})
	}
}

// acquireRelease acquires key through client within 30 s and releases it.
func acquireRelease(ctx context.Context, t *testing.T, client *fencelock.Client, key, when string) {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := client.Acquire(actx, key)
	if err != nil {
		t.Fatalf("acquire %s: %v", when, err)
	}
	if err := l.Release(actx); err != nil {
		t.Fatalf("release %s: %v", when, err)
	}
}

// TestPauseMember pauses a follower (replica) with SIGSTOP and checks that
// its process really is stopped and reported paused, that the cluster keeps
// its leader, and that resuming makes the process run again.
func TestPauseMember(t *testing.T) {
	for _, name := range clusters {
		t.Run(name, func(t *testing.T) {
			te, _ := clusterUnderTest(t, name)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			leader, err := te.WaitLeader(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			ms, err := te.Members(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			var victim cluster.Member
			for _, m := range ms {
				if m.ID != leader && m.ID != "sentinel" {
					victim = m
					break
				}
			}
			if victim.ID == "" {
				t.Fatalf("no follower among %+v (leader %s)", ms, leader)
			}
			if err := te.PauseMember(ctx, name, victim.ID); err != nil {
				t.Fatal(err)
			}
			paused := true
			defer func() {
				if paused {
					_ = te.ResumeMember(context.WithoutCancel(ctx), name, victim.ID)
				}
			}()
			if st := procState(t, victim.PID); st != 'T' && st != 't' {
				t.Errorf("member %s (pid %d) is in state %c after PauseMember, want T", victim.ID, victim.PID, st)
			}
			if got := memberState(ctx, t, te, name, victim.ID); got != cluster.Paused {
				t.Errorf("Members reports %s for the paused member %s", got, victim.ID)
			}
			if got, err := te.Leader(ctx, name); err != nil || got != leader {
				t.Errorf("leader with follower %s paused: %q, %v; want %s", victim.ID, got, err, leader)
			}
			if err := te.PauseMember(ctx, name, victim.ID); err != nil {
				t.Errorf("pausing a paused member: %v", err)
			}
			if err := te.ResumeMember(ctx, name, victim.ID); err != nil {
				t.Fatal(err)
			}
			paused = false
			if st := procState(t, victim.PID); st == 'T' || st == 't' {
				t.Errorf("member %s (pid %d) still stopped after ResumeMember", victim.ID, victim.PID)
			}
			if got := memberState(ctx, t, te, name, victim.ID); got != cluster.Running {
				t.Errorf("Members reports %s for the resumed member %s", got, victim.ID)
			}
			if err := te.ResumeMember(ctx, name, victim.ID); err != nil {
				t.Errorf("resuming a running member: %v", err)
			}
		})
	}
}

// procState returns the state letter of process pid from /proc.
func procState(t *testing.T, pid int) byte {
	t.Helper()
	st, err := pause.Read(pid)
	if err != nil {
		t.Fatal(err)
	}
	return st.State
}

func memberState(ctx context.Context, t *testing.T, te *cluster.Testenv, name, id string) cluster.State {
	t.Helper()
	ms, err := te.Members(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.ID == id {
			return m.State
		}
	}
	t.Fatalf("no member %s in %+v", id, ms)
	return ""
}
