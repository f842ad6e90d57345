package pause

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// startSleeper starts a shell with a child (a tree of two); it is killed
// and reaped when the test ends.
func startSleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "sleep 300 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		Signal(Tree(cmd.Process.Pid), syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd
}

// TestWaitStoppedReturnsOnceStopped: WaitStopped returns only once the
// kernel reports the process stopped, and a stopped process reads as
// stopped until SIGCONT.
func TestWaitStoppedReturnsOnceStopped(t *testing.T) {
	cmd := startSleeper(t)
	pid := cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := WaitStopped(ctx, pid); err != nil {
		t.Fatal(err)
	}
	if st, err := Read(pid); err != nil || !st.Stopped() {
		t.Fatalf("after WaitStopped: state %c, %v; want stopped", st.State, err)
	}
	Signal([]int{pid}, syscall.SIGCONT)
	if st, err := Read(pid); err != nil || st.Stopped() {
		t.Fatalf("after SIGCONT: state %c, %v; want running or sleeping", st.State, err)
	}
}

// TestWaitStoppedEndsWithContext: on a process nobody stops, WaitStopped
// returns the context's error.
func TestWaitStoppedEndsWithContext(t *testing.T) {
	cmd := startSleeper(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := WaitStopped(ctx, cmd.Process.Pid); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitStopped on a running process = %v; want the deadline", err)
	}
}

// TestGoneProcess: a process that exited reads as gone (a zombie before
// it is reaped, ErrGone after), and WaitStopped says ErrGone.
func TestGoneProcess(t *testing.T) {
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if _, err := Read(pid); err != nil && !errors.Is(err, ErrGone) {
		t.Fatalf("Read of a reaped process = %v; want ErrGone (or a reused PID)", err)
	}
	z := exec.Command("/bin/true")
	if err := z.Start(); err != nil {
		t.Fatal(err)
	}
	defer z.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Not reaped yet: a zombie once it exits.
	if err := WaitStopped(ctx, z.Process.Pid); !errors.Is(err, ErrGone) {
		t.Fatalf("WaitStopped on an exited child = %v; want ErrGone", err)
	}
}

// TestTreeHoldsDescendants: Tree has the root first and its child.
func TestTreeHoldsDescendants(t *testing.T) {
	cmd := startSleeper(t)
	pid := cmd.Process.Pid
	deadline := time.Now().Add(10 * time.Second)
	for {
		tree := Tree(pid)
		if len(tree) >= 2 {
			if tree[0] != pid {
				t.Fatalf("Tree(%d) = %v; want the root first", pid, tree)
			}
			for _, p := range tree[1:] {
				st, err := Read(p)
				if err == nil && st.PPID != pid && st.PGRP != pid {
					t.Errorf("process %d in Tree(%d) is neither its child nor in its group", p, pid)
				}
			}
			if slices.Contains(tree[1:], pid) {
				t.Errorf("Tree(%d) = %v lists the root twice", pid, tree)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Tree(%d) = %v after 10s; want the shell and its sleep", pid, tree)
		}
		time.Sleep(time.Millisecond) // the shell forks when it likes: polling /proc
	}
}
