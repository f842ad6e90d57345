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
