package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/internal/pause"
)

// running reports whether pid runs. A zombie whose threads have all
// ended holds no ports or files, so it counts as gone; but a killed Go
// server's main thread can be a zombie while its other threads still exit,
// and they hold the files (a listening port) until the last one ends.
func running(pid int) bool {
	p, err := pause.Read(pid)
	if err != nil {
		return false
	}
	if !p.Gone() {
		return true
	}
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	return err == nil && len(tasks) > 1
}

// readPID returns the PID in a pid file ("PID STARTTIME") if that process
// runs and started at STARTTIME: only then is it the server testenv
// started, not a reused PID.
func readPID(file string) (int, bool) {
	f := strings.Fields(readTrimmed(file))
	if len(f) != 2 {
		return 0, false
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return 0, false
	}
	p, err := pause.Read(pid)
	if err != nil || p.Gone() || p.Start != start {
		return 0, false
	}
	return pid, true
}

// freezeTree stops (SIGSTOP) root and every process of its tree, and
// returns the tree once no process in it can fork any more. A crash kills
// the tree it froze: killing a live tree races the server's forks (a
// PostgreSQL postmaster forks a backend per connection), and a child
// forked after the snapshot would outlive the kill, holding the shared
// memory that keeps the restarted server from starting.
func freezeTree(root int) []int {
	_ = syscall.Kill(root, syscall.SIGSTOP)
	waitStopped(root)
	tree := pause.Tree(root)
	for {
		pause.Signal(tree, syscall.SIGSTOP)
		for _, p := range tree {
			waitStopped(p)
		}
		again := pause.Tree(root)
		if len(again) == len(tree) {
			return again
		}
		tree = again
	}
}

// waitStopped waits, briefly (1s), until pid is stopped or gone.
func waitStopped(pid int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = pause.WaitStopped(ctx, pid)
}

// pollInterval is how often a wait for a process or a server polls: there
// is no event to wait for when a process that is not our child exits or
// stops, or when a server starts to answer.
const pollInterval = 50 * time.Millisecond

// waitGone waits until none of pids runs, at most d.
func waitGone(d time.Duration, pids []int) bool {
	deadline := time.Now().Add(d)
	for {
		alive := false
		for _, p := range pids {
			if running(p) {
				alive = true
				break
			}
		}
		if !alive {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollInterval)
	}
}

// spawnSpec is one server process to start.
type spawnSpec struct {
	argv    []string
	dir     string // working dir, and where the pid file goes
	log     string // stdout and stderr are appended here
	cred    *syscall.Credential
	pidFile string
}

// spawn starts a server in a session and process group of its own, stdin
// from /dev/null, stdout and stderr appended to its log, and records its
// PID and start time in its pid file. The server is not this process's
// child: a short-lived /bin/sh starts it in the background with setsid(1)
// and exits, so the server belongs to init (or the nearest subreaper), as
// a daemon would, and a test that started it leaves no goroutine waiting
// for it.
func spawn(s spawnSpec) (int, error) {
	logf, err := os.OpenFile(s.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "\n===== testenv %s: starting: %s\n", time.Now().Format("2006-01-02 15:04:05"), strings.Join(redactArgs(s.argv), " "))
	setsid, err := exec.LookPath("setsid")
	if err != nil {
		return 0, fmt.Errorf("setsid (util-linux) not found: %w", err)
	}
	// The shell is a session leader, so its background job is not a group
	// leader and setsid execs the server without forking: $! is its PID.
	cmd := exec.Command("/bin/sh", "-c", `"$@" </dev/null >&3 2>&3 3>&- & echo $!`, "sh", setsid)
	cmd.Args = append(cmd.Args, s.argv...)
	cmd.Dir = s.dir
	cmd.ExtraFiles = []*os.File{logf}
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: s.cred}
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("starting %s: %w", filepath.Base(s.argv[0]), err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("starting %s: no PID (%q)", filepath.Base(s.argv[0]), out)
	}
	var start uint64
	if p, err := pause.Read(pid); err == nil {
		start = p.Start
	}
	if err := os.WriteFile(s.pidFile, fmt.Appendf(nil, "%d %d\n", pid, start), 0o644); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return 0, err
	}
	return pid, nil
}

// pauseTree sends SIGSTOP (stop) or SIGCONT to the process tree of the
// server in pidFile until every process is stopped (running again), and
// returns then. A process forked meanwhile is caught too: the tree is read
// again each round.
func pauseTree(ctx context.Context, pidFile string, stop bool) error {
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	var pending []int
	for range 100 {
		pid, ok := readPID(pidFile)
		if !ok {
			return ErrNotRunning
		}
		pending = pending[:0]
		for _, p := range pause.Tree(pid) {
			pi, err := pause.Read(p)
			if err != nil || pi.Gone() || pi.Stopped() == stop {
				continue
			}
			pending = append(pending, p)
		}
		if len(pending) == 0 {
			return nil
		}
		pause.Signal(pending, sig)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollInterval):
		}
	}
	return fmt.Errorf("testenv: processes %v still not %s after 5s", pending, map[bool]string{true: "stopped", false: "running"}[stop])
}
