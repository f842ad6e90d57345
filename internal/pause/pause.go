// Package pause stops and continues processes for tests that freeze a
// store's server or a lock contender: it reads a process's state from
// /proc/PID/stat, waits until a process has stopped, finds a process's
// tree and signals it. It is shared by internal/testenv (which freezes a
// server's whole tree) and safety/proc (which pauses one contender and
// records it in a history).
//
// A process that is not this process's child gives no event when it stops,
// so WaitStopped polls /proc.
package pause

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrGone is returned by Read and WaitStopped for a process that has
// exited: no /proc entry, or a zombie. A PID seen gone may be reused; do
// not signal it again.
var ErrGone = errors.New("pause: process gone")

// Stat is what /proc/PID/stat says about a process.
type Stat struct {
	// State is the state letter: R, S, D, T (stopped), t (traced), Z
	// (zombie), X (dead), ...
	State byte
	// PPID is the parent's PID.
	PPID int
	// PGRP is the process group.
	PGRP int
	// Start is the start time in clock ticks after boot: with the PID, it
	// names one process even after its PID is reused.
	Start uint64
}

// Stopped reports whether the process is stopped (by SIGSTOP, or traced).
func (s Stat) Stopped() bool { return s.State == 'T' || s.State == 't' }

// Gone reports whether the process has exited (a zombie, or dead).
func (s Stat) Gone() bool { return s.State == 'Z' || s.State == 'X' }

// Read returns what /proc/PID/stat says about pid. Its error wraps
// ErrGone if there is no such process.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return Stat{}, fmt.Errorf("%w: pid %d", ErrGone, pid)
		}
		return Stat{}, fmt.Errorf("pause: %w", err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces and ')'
	if i < 0 {
		return Stat{}, fmt.Errorf("pause: cannot parse /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("pause: cannot parse /proc/%d/stat", pid)
	}
	st := Stat{State: f[0][0]}
	st.PPID, _ = strconv.Atoi(f[1])
	st.PGRP, _ = strconv.Atoi(f[2])
	st.Start, _ = strconv.ParseUint(f[19], 10, 64)
	return st, nil
}

// pollInterval is how often WaitStopped reads /proc.
const pollInterval = time.Millisecond

// WaitStopped waits until pid is stopped (after a SIGSTOP from anyone,
// itself included). It returns an error wrapping ErrGone if the process
// exits first, and ctx's error if ctx ends first.
func WaitStopped(ctx context.Context, pid int) error {
	for {
		st, err := Read(pid)
		if err != nil {
			return err
		}
		if st.Gone() {
			return fmt.Errorf("%w: pid %d is a zombie", ErrGone, pid)
		}
		if st.Stopped() {
			return nil
		}
		t := time.NewTimer(pollInterval) // polling /proc: no event to await
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Tree returns root, its descendants and the members of its process group
// (PostgreSQL's children call setsid themselves, so both are needed), root
// first. Processes that exit meanwhile may or may not be in it.
func Tree(root int) []int {
	kids := map[int][]int{}
	seen := map[int]bool{root: true}
	tree := []int{root}
	queue := []int{root}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, err := Read(pid)
		if err != nil {
			continue
		}
		kids[p.PPID] = append(kids[p.PPID], pid)
		if p.PGRP == root && !seen[pid] {
			seen[pid] = true
			tree = append(tree, pid)
			queue = append(queue, pid)
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, k := range kids[p] {
			if !seen[k] {
				seen[k] = true
				tree = append(tree, k)
				queue = append(queue, k)
			}
		}
	}
	return tree
}

// Signal sends sig to every process in pids, ignoring the ones gone.
func Signal(pids []int, sig syscall.Signal) {
	for _, p := range pids {
		_ = syscall.Kill(p, sig)
	}
}
