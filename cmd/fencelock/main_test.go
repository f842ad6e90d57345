//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The tests build the fencelock binary once and run it as a user would,
// against the file backend in a temporary directory. The commands they
// run under the lock are this test binary again, in a child mode chosen by
// the FENCELOCK_TEST_CHILD environment variable.

var fencelockBin string

func TestMain(m *testing.M) {
	if mode := os.Getenv("FENCELOCK_TEST_CHILD"); mode != "" {
		os.Exit(child(mode))
	}
	dir, err := os.MkdirTemp("", "fencelock-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fencelockBin = filepath.Join(dir, "fencelock")
	out, err := exec.Command("go", "build", "-o", fencelockBin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// child is the command run under the lock.
//
//	barrier:  write "token entered" to $OUT/PID, wait until $N such files are
//	          in $OUT, then write the time it leaves to $OUT/PID.saw
//	interval: append "start end token" (UnixNano) to $OUT, sleeping in between
//	trap:     write $OUT.ready, wait for SIGTERM (write $OUT "terminated", exit 42)
//	ignore:   ignore SIGTERM, write $OUT.ready, sleep
//	fifo-ignore, fifo-trap: open the FIFO $OUT for writing and write its
//	          token on it (the reader's EOF is then this process's death);
//	          ignore SIGTERM and sleep, or exit 42 on SIGTERM
func child(mode string) int {
	out := os.Getenv("OUT")
	switch mode {
	case "fifo-ignore", "fifo-trap":
		sig := make(chan os.Signal, 1)
		if mode == "fifo-ignore" {
			signal.Ignore(syscall.SIGTERM)
		} else {
			signal.Notify(sig, syscall.SIGTERM)
		}
		f, err := os.OpenFile(out, os.O_WRONLY, 0)
		if err != nil {
			return 1
		}
		fmt.Fprintf(f, "%s\n", os.Getenv("FENCELOCK_TOKEN"))
		select {
		case <-sig:
			return 42
		case <-time.After(time.Minute):
			f.Close()
			return 2
		}
	case "barrier":
		// Arrive (a file named by the pid, holding the token), then wait
		// until $N runs have arrived, each still inside its run: that is
		// the overlap, proved from the runs' own records.
		n, _ := strconv.Atoi(os.Getenv("N"))
		me := filepath.Join(out, strconv.Itoa(os.Getpid()))
		entered := time.Now().UnixNano()
		if err := os.WriteFile(me, []byte(os.Getenv("FENCELOCK_TOKEN")+" "+strconv.FormatInt(entered, 10)), 0o644); err != nil {
			return 1
		}
		deadline := time.Now().Add(45 * time.Second)
		for time.Now().Before(deadline) {
			ents, err := os.ReadDir(out)
			if err != nil {
				return 1
			}
			arrived := 0
			for _, e := range ents {
				if !strings.HasSuffix(e.Name(), ".saw") {
					arrived++
				}
			}
			if arrived >= n {
				return writeErr(os.WriteFile(me+".saw", []byte(strconv.FormatInt(time.Now().UnixNano(), 10)), 0o644))
			}
			time.Sleep(10 * time.Millisecond) // polls the directory: the event is other processes' files
		}
		return 2
	case "interval":
		start := time.Now().UnixNano()
		time.Sleep(100 * time.Millisecond)
		end := time.Now().UnixNano()
		f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return 1
		}
		defer f.Close()
		fmt.Fprintf(f, "%d %d %s\n", start, end, os.Getenv("FENCELOCK_TOKEN"))
		return 0
	case "ignore":
		signal.Ignore(syscall.SIGTERM)
		if err := writeReady(out, "ignoring SIGTERM"); err != nil {
			return 1
		}
		time.Sleep(time.Minute)
		return 2
	case "trap":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		info := os.Getenv("FENCELOCK_KEY") + " " + os.Getenv("FENCELOCK_TOKEN")
		if err := writeReady(out, info); err != nil {
			return 1
		}
		select {
		case s := <-sig:
			os.WriteFile(out, []byte(s.String()), 0o644)
			return 42
		case <-time.After(time.Minute):
			return 2
		}
	}
	return 3
}

// writeReady writes $OUT.ready atomically (a temporary file, renamed):
// the test reads it as soon as it exists, and os.WriteFile creates the
// file before it writes the contents (CI once read it empty).
func writeReady(out, info string) error {
	tmp := out + ".ready.tmp"
	if err := os.WriteFile(tmp, []byte(info), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out+".ready")
}

type fixture struct {
	t   *testing.T
	url string
	dir string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("the file backend needs a Unix system")
	}
	d := t.TempDir()
	return &fixture{t: t, url: "file://" + filepath.Join(d, "locks"), dir: d}
}

// cmd returns a fencelock command; childMode, if set, is what the test
// binary does when fencelock runs it.
func (f *fixture) cmd(childMode, out string, args ...string) *exec.Cmd {
	cmd := exec.Command(fencelockBin, args...)
	cmd.Env = append(os.Environ(), "FENCELOCK_URL="+f.url, "FENCELOCK_TEST_CHILD="+childMode, "OUT="+out)
	return cmd
}

func self(t *testing.T) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// run runs fencelock to completion and returns its output and exit status.
func (f *fixture) run(args ...string) (stdout, stderr string, code int) {
	f.t.Helper()
	cmd := f.cmd("", "", args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		f.t.Fatalf("fencelock %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

func waitFile(t *testing.T, path string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if b, err := os.ReadFile(path); err == nil {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within %v", path, d)
		}
		time.Sleep(20 * time.Millisecond) // polling a file another process writes
	}
}

// waitExit waits for cmd with a generous bound and returns its status.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return exitCode(t, err)
	case <-time.After(d):
		cmd.Process.Kill()
		t.Fatalf("fencelock did not exit within %v", d)
		return -1
	}
}

func TestConcurrentRunsNeverOverlap(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "intervals")
	const procs, rounds = 3, 4
	var wg sync.WaitGroup
	errs := make(chan string, procs*rounds)
	for range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				cmd := f.cmd("interval", out, "run", "--ttl", "5s", "shared", "--", self(t))
				if b, err := cmd.CombinedOutput(); err != nil {
					errs <- fmt.Sprintf("fencelock run: %v\n%s", err, b)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	type span struct {
		start, end int64
		token      uint64
	}
	var spans []span
	fh, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		var s span
		if _, err := fmt.Sscanf(sc.Text(), "%d %d %d", &s.start, &s.end, &s.token); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		spans = append(spans, s)
	}
	if len(spans) != procs*rounds {
		t.Fatalf("%d runs recorded; want %d", len(spans), procs*rounds)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	for i := 1; i < len(spans); i++ {
		p, s := spans[i-1], spans[i]
		if s.start < p.end {
			t.Errorf("runs overlap: [%d, %d] (token %d) and [%d, %d] (token %d)", p.start, p.end, p.token, s.start, s.end, s.token)
		}
		if s.token <= p.token {
			t.Errorf("token went from %d to %d between consecutive holders", p.token, s.token)
		}
	}
}

// holder starts `fencelock run` with the trap child and waits until the
// child runs; it returns the command and the child's "KEY TOKEN".
func (f *fixture) holder(key, out string, extra ...string) (*exec.Cmd, string) {
	f.t.Helper()
	args := append([]string{"run"}, extra...)
	args = append(args, key, "--", self(f.t))
	cmd := f.cmd("trap", out, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		cmd.Process.Kill()
		if f.t.Failed() {
			f.t.Logf("holder's stderr:\n%s", stderr.String())
		}
	})
	info := waitFile(f.t, out+".ready", 30*time.Second)
	return cmd, info
}

func TestNoWaitWhenHeld(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "trap")
	h, _ := f.holder("busy", out)
	_, stderr, code := f.run("run", "--no-wait", "busy", "--", "true")
	if code != exitNotAcquired {
		t.Fatalf("run --no-wait on a held key: exit %d; want %d\n%s", code, exitNotAcquired, stderr)
	}
	if !strings.Contains(stderr, "held by") {
		t.Errorf("stderr does not name the holder: %q", stderr)
	}
	_, stderr, code = f.run("run", "--timeout", "200ms", "busy", "--", "true")
	if code != exitNotAcquired || !strings.Contains(stderr, "--timeout") {
		t.Fatalf("run --timeout on a held key: exit %d; want %d\n%s", code, exitNotAcquired, stderr)
	}
	h.Process.Signal(syscall.SIGTERM)
	waitExit(t, h, 30*time.Second)
}

func TestSignalForwardedAndLockReleased(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "trap")
	h, info := f.holder("sig", out)
	if !strings.HasPrefix(info, "sig ") {
		t.Fatalf("child saw FENCELOCK_KEY/TOKEN %q", info)
	}
	if err := h.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, h, 30*time.Second); code != 42 {
		t.Fatalf("fencelock exit %d; want the child's 42", code)
	}
	if got := waitFile(t, out, time.Second); got != "terminated" {
		t.Fatalf("child's marker = %q; want %q (the signal was not forwarded)", got, "terminated")
	}
	if _, _, code := f.run("status", "sig"); code != exitFree {
		t.Fatalf("status after fencelock exited: exit %d; want %d (free): the lock was not released", code, exitFree)
	}
}

// TestLeaseLossKillsChild: after a definite loss (release --force) the
// next holder may have the lock already, so COMMAND gets SIGKILL at once,
// with no grace period in which it could handle a SIGTERM, and fencelock
// exits 79.
func TestLeaseLossKillsChild(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "trap")
	h, _ := f.holder("lost", out, "--ttl", "3s")
	stdout, stderr, code := f.run("release", "--force", "lost")
	if code != 0 || !strings.Contains(stdout, "removed the lock") {
		t.Fatalf("release --force: exit %d\n%s%s", code, stdout, stderr)
	}
	if code := waitExit(t, h, 30*time.Second); code != exitLeaseLost {
		t.Fatalf("fencelock exit %d after its lease was taken; want %d", code, exitLeaseLost)
	}
	if got, err := os.ReadFile(out); err == nil {
		t.Fatalf("child's marker = %q: it was given time to handle SIGTERM after the loss; want SIGKILL at once", got)
	}
}

func TestListAndStatusJSON(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "trap")
	h, info := f.holder("jobs/a", out)
	tok, _ := strconv.ParseUint(strings.Fields(info)[1], 10, 64)
	stdout, stderr, code := f.run("list", "--json", "jobs/")
	if code != 0 {
		t.Fatalf("list --json: exit %d: %s", code, stderr)
	}
	var locks []lockJSON
	if err := json.Unmarshal([]byte(stdout), &locks); err != nil {
		t.Fatalf("list --json output does not parse: %v\n%s", err, stdout)
	}
	if len(locks) != 1 || locks[0].Key != "jobs/a" || !locks[0].Held || locks[0].Token != tok || locks[0].Owner == "" {
		t.Fatalf("list --json = %+v; want jobs/a held with token %d", locks, tok)
	}
	stdout, _, code = f.run("status", "jobs/a", "--json")
	var st lockJSON
	if err := json.Unmarshal([]byte(stdout), &st); err != nil || code != 0 || st.Token != tok {
		t.Fatalf("status --json = %q (exit %d, %v); want token %d", stdout, code, err, tok)
	}
	stdout, _, _ = f.run("list", "--json", "nothing/")
	if strings.TrimSpace(stdout) != "[]" {
		t.Fatalf("list --json of nothing = %q; want []", stdout)
	}
	h.Process.Signal(syscall.SIGTERM)
	waitExit(t, h, 30*time.Second)
}

func TestExitStatuses(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "k", "--", "sh", "-c", "exit 7"}, 7, ""},
		{[]string{"run", "k", "--", "sh", "-c", "kill -TERM $$"}, 128 + 15, ""},
		{[]string{"run", "k", "--", filepath.Join(f.dir, "missing")}, exitNotFound, "no such file"},
		{[]string{"run", "k"}, exitUsage, "missing COMMAND"},
		{[]string{"run", "--no-wait", "--timeout", "1s", "k", "--", "true"}, exitUsage, "--no-wait"},
		{[]string{"run", "--ttl", "0", "k", "--", "true"}, exitUsage, `invalid --ttl "0": shorter than 1s`},
		{[]string{"run", "--ttl", "10ms", "k", "--", "true"}, exitUsage, `invalid --ttl "10ms": shorter than 1s`},
		{[]string{"run", "--ttl", "5", "k", "--", "true"}, exitUsage, "did you mean 5s?"},
		{[]string{"run", "--url", "file://" + f.dir + "/locks?ttl=0", "k", "--", "true"}, exitUsage, `"ttl" "0": shorter than 1s`},
		{[]string{"run", "k", "--no-wait", "true"}, exitUsage, "--no-wait after k looks like a flag"},
		{[]string{"run", "k", "--no-wait", "--", "sh", "-c", "exit 3"}, 3, ""},
		{[]string{"run", "k", "--no-wait", "extra", "--", "true"}, exitUsage, `unexpected "extra"`},
		{[]string{"run", "--ttl", "3s", "--grace", "4s", "k", "--", "true"}, exitUsage, "--grace 4s is longer than the lease's danger zone leaves"},
		{[]string{"run", "--url", "file://" + f.dir + "/locks?ttl=3s", "--grace", "801ms", "k", "--", "true"}, exitUsage, "within 800ms"},
		{[]string{"run", "--bogus", "k", "--", "true"}, exitUsage, "bogus"},
		{[]string{"run", "", "--", "true"}, exitUsage, "invalid key"},
		{[]string{"release", "k"}, exitUsage, "--force"},
		{[]string{"status"}, exitUsage, "KEY"},
		{[]string{"nonsense"}, exitUsage, "unknown command"},
		{[]string{"stauts"}, exitUsage, `did you mean "status"?`},
		{[]string{"help", "lsit"}, exitUsage, `did you mean "list"?`},
		{[]string{}, exitUsage, "Usage:"},
		{[]string{"status", "--url", "file://" + f.dir + "/absent/x", "k"}, exitUnavailable, "no such directory"},
		{[]string{"list", "--url", "file://" + f.dir + "/absent/x"}, exitUnavailable, "no such directory"},
		{[]string{"run", "--url", "postgress://u:s3cret@db/app", "k", "--", "true"}, exitUsage, "did you mean postgres://?"},
		{[]string{"run", "--url", "zookeeper://h:2181", "k", "--", "true"}, exitUsage, "did you mean zk://?"},
		{[]string{"status", "--url", "app:s3cret@db:5432/app", "k"}, exitUsage, "has no scheme"},
		{[]string{"run", "--url", "nosuch://user:s3cret@host/x", "k", "--", "true"}, exitUsage, "known schemes: "},
		{[]string{"status", "--url", "file://remotehost/x", "k"}, exitUsage, "localhost"},
	} {
		_, stderr, code := f.run(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("fencelock %q: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.want)
		}
		if strings.Contains(stderr, "s3cret") {
			t.Errorf("fencelock %q printed the password: %q", tc.args, stderr)
		}
	}
	// Read-only commands create nothing, not even the directory they were
	// pointed at.
	if _, err := os.Stat(filepath.Join(f.dir, "absent")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("status/list on a missing directory created it: stat = %v", err)
	}
}

func TestHelpForEveryCommand(t *testing.T) {
	f := newFixture(t)
	for _, c := range []string{"run", "status", "list", "release", "doctor", "safety", "demo", "version"} {
		stdout, stderr, code := f.run(c, "--help")
		if code != 0 || !strings.Contains(stdout, "Usage: fencelock "+c) || !strings.Contains(stdout, "Example") {
			t.Errorf("fencelock %s --help: exit %d, stdout %q, stderr %q", c, code, stdout, stderr)
		}
	}
	stdout, _, code := f.run("--help")
	if code != 0 || !strings.Contains(stdout, "Commands:") {
		t.Errorf("fencelock --help: exit %d: %q", code, stdout)
	}
	stdout, _, code = f.run("version")
	if code != 0 || !strings.Contains(stdout, "file") {
		t.Errorf("fencelock version: exit %d: %q (want the file backend listed)", code, stdout)
	}
}

func TestDemo(t *testing.T) {
	f := newFixture(t)
	stdout, stderr, code := f.run("demo")
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{"token 1", "token 2", "REJECTED", "stale fencing token 1"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("demo output lacks %q:\n%s", want, stdout)
		}
	}
}

// TestREADMECommand runs the README's first command from the repository
// root, as a fresh checkout would: go run ./cmd/fencelock, no server, no
// URL (the default lock directory, here in a private XDG_RUNTIME_DIR).
func TestREADMECommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds with go run")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Skip("not inside the fencelock repository")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./cmd/fencelock", "run", "readme-demo", "--", "echo", "hi")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+t.TempDir(), "FENCELOCK_URL=")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hi" {
		t.Fatalf("go run ./cmd/fencelock run readme-demo -- echo hi: %v\n%s", err, out)
	}
}

// TestInterruptWhileWaiting: a signal to a fencelock that is still waiting
// for the lock ends the wait with 128+N and leaves nothing behind.
func TestInterruptWhileWaiting(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "trap")
	h, _ := f.holder("wait", out)
	w := f.cmd("", "", "run", "wait", "--", "true")
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // let it start waiting; nothing observable to await
	w.Process.Signal(syscall.SIGINT)
	if code := waitExit(t, w, 30*time.Second); code != 128+int(syscall.SIGINT) {
		t.Fatalf("waiting fencelock interrupted: exit %d; want %d", code, 128+int(syscall.SIGINT))
	}
	h.Process.Signal(syscall.SIGTERM)
	waitExit(t, h, 30*time.Second)
	if _, _, code := f.run("status", "wait"); code != exitFree {
		t.Fatalf("status after both exited: exit %d; want %d (free)", code, exitFree)
	}
}

// TestReleasedWhenCommandCannotStart: the lock is released when COMMAND
// cannot be started.
func TestReleasedWhenCommandCannotStart(t *testing.T) {
	f := newFixture(t)
	if _, _, code := f.run("run", "nostart", "--", filepath.Join(f.dir, "missing")); code != exitNotFound {
		t.Fatalf("exit %d; want %d", code, exitNotFound)
	}
	if _, _, code := f.run("status", "nostart"); code != exitFree {
		t.Fatalf("status: exit %d; want %d (free)", code, exitFree)
	}
}

// TestLeaseLossEscalatesToSIGKILL: a command that ignores SIGTERM is killed
// after a lost lease, and its children (its process group) with it.
func TestLeaseLossEscalatesToSIGKILL(t *testing.T) {
	f := newFixture(t)
	out := filepath.Join(f.dir, "ignore")
	pidFile := filepath.Join(f.dir, "grandchild.pid")
	// sh starts a grandchild (sleep) and then runs the test binary, which
	// ignores SIGTERM.
	script := fmt.Sprintf("sleep 120 & echo $! > %s; exec %s", pidFile, self(t))
	cmd := f.cmd("ignore", out, "run", "--ttl", "3s", "stubborn", "--", "sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	waitFile(t, out+".ready", 30*time.Second)
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, pidFile, 10*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := f.run("release", "--force", "stubborn"); code != 0 {
		t.Fatalf("release --force: exit %d: %s", code, stderr)
	}
	if code := waitExit(t, cmd, 30*time.Second); code != exitLeaseLost {
		t.Fatalf("fencelock exit %d; want %d", code, exitLeaseLost)
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the command's child %d survived the lost lease", pid)
		}
		time.Sleep(20 * time.Millisecond) // waiting for another process to die
	}
}

// TestUnreachableBackend: a store that does not answer fails fast with its
// host:port (and the timeout, where it was the timeout that ended the
// attempt), exit 69, no password, and no client-library log noise.
func TestUnreachableBackend(t *testing.T) {
	f := newFixture(t)
	stdout, _, _ := f.run("version")
	for _, tc := range []struct{ url, want string }{
		// Nothing listens on port 1: each backend is refused at once (etcd
		// and zookeeper too, no longer after --connect-timeout), and the
		// message says what to check.
		{"redis://:s3cret@127.0.0.1:1/0", "check that the server runs at 127.0.0.1:1"},
		{"postgres://u:s3cret@127.0.0.1:1/db", "check that the server runs at 127.0.0.1:1"},
		{"etcd://127.0.0.1:1", "check that the server runs at 127.0.0.1:1"},
		{"zk://127.0.0.1:1", "check that the server runs at 127.0.0.1:1"},
		{"mongodb://u:s3cret@127.0.0.1:1/db", "127.0.0.1:1"},
	} {
		scheme, _, _ := strings.Cut(tc.url, "://")
		if !strings.Contains(stdout, " "+scheme+",") && !strings.HasSuffix(strings.TrimSpace(stdout), " "+scheme) {
			t.Logf("%s backend not linked: skipped", scheme)
			continue
		}
		start := time.Now()
		_, stderr, code := f.run("status", "--connect-timeout", "1s", "--url", tc.url, "k")
		if code != exitUnavailable || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "127.0.0.1:1") {
			t.Errorf("status on %s: exit %d, stderr %q; want exit %d naming %q", tc.url, code, stderr, exitUnavailable, tc.want)
		}
		if strings.Contains(stderr, "s3cret") {
			t.Errorf("status on %s printed the password: %q", tc.url, stderr)
		}
		if n := strings.Count(strings.TrimSpace(stderr), "\n"); n > 3 {
			t.Errorf("status on %s printed %d lines; want a short message:\n%s", tc.url, n+1, stderr)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("status on %s took %v with --connect-timeout 1s", tc.url, d)
		}
	}
}

// TestRunSummary: --summary prints one line on exit with the lease's
// events, for a clean release and for a lease taken away.
func TestRunSummary(t *testing.T) {
	f := newFixture(t)
	_, stderr, code := f.run("run", "--summary", "sum", "--", "true")
	if code != 0 || !strings.Contains(stderr, `fencelock run: summary key="sum" token=`) || !strings.Contains(stderr, "end=released") {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	out := filepath.Join(f.dir, "trap")
	h := f.cmd("trap", out, "run", "--ttl", "3s", "--summary", "sum-lost", "--", self(t))
	var e bytes.Buffer
	h.Stderr = &e
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Process.Kill() })
	waitFile(t, out+".ready", 30*time.Second)
	if _, stderr, code := f.run("release", "--force", "sum-lost"); code != 0 {
		t.Fatalf("release --force: exit %d\n%s", code, stderr)
	}
	if code := waitExit(t, h, 30*time.Second); code != exitLeaseLost {
		t.Fatalf("exit %d; want %d", code, exitLeaseLost)
	}
	if s := e.String(); !strings.Contains(s, "end=lost") || !strings.Contains(s, "not held") || strings.Contains(s, "held=0s") {
		t.Fatalf("summary after a lost lease:\n%s", s)
	}
}

func writeErr(err error) int {
	if err != nil {
		return 1
	}
	return 0
}
