package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestFromEnvWithoutState(t *testing.T) {
	t.Setenv(StateEnv, "")
	if _, err := FromEnv(); !errors.Is(err, ErrNoState) {
		t.Fatalf("FromEnv without %s: %v, want ErrNoState", StateEnv, err)
	}
	var te Testenv
	if err := te.Kill(context.Background(), Etcd3, "1"); !errors.Is(err, ErrNoState) {
		t.Fatalf("Kill on a Testenv without state dir: %v, want ErrNoState", err)
	}
}

func TestEnvVar(t *testing.T) {
	if got := EnvVar(ZooKeeper3); got != "FENCELOCK_TEST_ZOOKEEPER3" {
		t.Errorf("EnvVar(ZooKeeper3) = %s", got)
	}
}

// TestPauseResumeServer starts a Redis server of its own (a shared one may
// serve other tests meanwhile), pauses it and checks that its process is
// stopped and answers no PING, then resumes it and checks that it answers
// again.
func TestPauseResumeServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	te, err := Up(ctx, "redis")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := te.Down(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("down: %v", err)
		}
	}()
	url := te.URL("redis")
	if url == "" {
		if ci := os.Getenv("CI"); ci == "true" || ci == "1" {
			t.Fatal("Up(redis) started nothing")
		}
		t.Skip("Up(redis) could not start a server here")
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "redis://"), "/0")

	pid, err := te.PID(ctx, "redis")
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(addr, 2*time.Second); err != nil {
		t.Fatalf("running server: %v", err)
	}
	if err := te.Pause(ctx, "redis"); err != nil {
		t.Fatal(err)
	}
	if st := state(t, pid); st != 'T' {
		t.Errorf("paused server pid %d in state %c, want T", pid, st)
	}
	if err := ping(addr, 300*time.Millisecond); err == nil {
		t.Error("a paused server answered PING")
	}
	if err := te.Pause(ctx, "redis"); err != nil {
		t.Errorf("pausing a paused server: %v", err)
	}
	if err := te.Resume(ctx, "redis"); err != nil {
		t.Fatal(err)
	}
	if st := state(t, pid); st == 'T' {
		t.Errorf("resumed server pid %d still stopped", pid)
	}
	if err := ping(addr, 2*time.Second); err != nil {
		t.Errorf("resumed server: %v", err)
	}
	if err := te.Resume(ctx, "redis"); err != nil {
		t.Errorf("resuming a running server: %v", err)
	}
	if _, err := te.PID(ctx, "postgres"); !errors.Is(err, ErrNotStarted) {
		t.Errorf("PID of a server this state dir never started: %v, want ErrNotStarted", err)
	}
}

// ping sends PING to a Redis server and waits up to d for +PONG.
func ping(addr string, d time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if string(buf[:n]) != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", buf[:n])
	}
	return nil
}

func state(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return s[i+2]
}

// TestPartitionCutsAFollowerOffItsQuorum starts a ZooKeeper ensemble
// whose peer links go through proxies, partitions a follower, and checks
// what the follower-partitioned cell relies on: the follower stops
// serving once it gives up on its leader (it still accepts its clients'
// connections), while the other two keep a leader; after Heal the
// follower rejoins.
func TestPartitionCutsAFollowerOffItsQuorum(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	te, err := UpWithPeerLinks(ctx, ZooKeeper3)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := te.Down(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("down: %v", err)
		}
	}()
	if te.URL(ZooKeeper3) == "" {
		if ci := os.Getenv("CI"); ci == "true" || ci == "1" {
			t.Fatal("UpWithPeerLinks(zookeeper3) started nothing")
		}
		t.Skip("UpWithPeerLinks(zookeeper3) could not start an ensemble here")
	}
	if !te.Partitionable(ZooKeeper3) {
		t.Fatal("an ensemble started by UpWithPeerLinks is not partitionable")
	}
	leader, err := te.WaitLeader(ctx, ZooKeeper3)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := te.Members(ctx, ZooKeeper3)
	if err != nil {
		t.Fatal(err)
	}
	var f Member
	for _, m := range ms {
		if m.ID != leader {
			f = m
			break
		}
	}
	if err := te.Partition(ctx, ZooKeeper3, f.ID); err != nil {
		t.Fatal(err)
	}
	// The follower gives up on its leader after syncLimit × tickTime (1 s).
	start := time.Now()
	for zkMode(f.Addr) == "follower" {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("member %s still follows 20s after its partition", f.ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("member %s stopped following %v after its partition", f.ID, time.Since(start).Round(time.Millisecond))
	if got, err := te.Leader(ctx, ZooKeeper3); err != nil || got != leader {
		t.Errorf("leader during the partition: %q, %v; want %s (the majority keeps it)", got, err, leader)
	}
	if err := te.Heal(ctx, ZooKeeper3, f.ID); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := te.WaitReady(wctx, ZooKeeper3); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
	if err := (&Testenv{}).Partition(ctx, ZooKeeper3, "1"); !errors.Is(err, ErrNoPeerLinks) {
		t.Errorf("Partition of a cluster without peer proxies: %v, want ErrNoPeerLinks", err)
	}
}

// zkMode asks a ZooKeeper node's srvr command for its mode ("" if it does
// not say, e.g. while it is not serving).
func zkMode(addr string) string {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return ""
	}
	b := make([]byte, 4096)
	var out []byte
	for {
		n, err := c.Read(b)
		out = append(out, b[:n]...)
		if err != nil {
			break
		}
	}
	for _, l := range strings.Split(string(out), "\n") {
		if m, ok := strings.CutPrefix(l, "Mode: "); ok {
			return strings.TrimSpace(m)
		}
	}
	return ""
}
