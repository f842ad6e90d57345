//go:build unix

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/internal/faultproxy"
	"github.com/fencelock/fencelock/internal/testenv"
	"github.com/fencelock/fencelock/recipe"
)

// childWatch follows a command run in a fifo-* child mode through its FIFO:
// ready is closed once it runs under the lock, and dead then receives the
// time the kernel closed its end, that is, the time it died.
type childWatch struct {
	ready chan struct{}
	dead  chan time.Time
}

func watchChild(t *testing.T, fifo string) *childWatch {
	t.Helper()
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	w := &childWatch{ready: make(chan struct{}), dead: make(chan time.Time, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.Open(fifo) // blocks until the child opens its end
		if err != nil {
			return
		}
		defer f.Close()
		r := bufio.NewReader(f)
		if _, err := r.ReadString('\n'); err != nil {
			return
		}
		close(w.ready)
		io.Copy(io.Discard, r)
		w.dead <- time.Now()
	}()
	t.Cleanup(func() {
		// Unblock the open if the child never came.
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-done
	})
	return w
}

// resolvedOptions returns the engine's options for a TTL, defaults filled
// in: the quantities the command's timing follows from.
func resolvedOptions(t *testing.T, ttl time.Duration) fencelock.Options {
	t.Helper()
	c, err := fencelock.New(memory.New(), &fencelock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.Options()
}

// partitionRun is what one run of `fencelock run` cut off from its store
// went through, timed by the test's clock.
type partitionRun struct {
	cutOff  time.Time // the proxy went dark
	death   time.Time // COMMAND's end of the FIFO closed
	granted time.Time // the next holder's Acquire returned
	exited  time.Time // fencelock exited
	code    int
	stderr  string
}

// runPartitioned starts `fencelock run --ttl TTL` through a proxy to the
// store at rawURL with COMMAND in the given fifo-* mode, starts a second
// client waiting for the key on a direct connection, cuts the proxy off,
// and records when COMMAND died, when the waiter got the lock and when
// fencelock exited.
func runPartitioned(t *testing.T, rawURL, mode string, ttl time.Duration) partitionRun {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	// The proxy's blackhole forwards nothing in either direction and closes
	// nothing, as a network partition would, while the store itself stays
	// up for everyone else.
	p, err := faultproxy.Listen(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	via := *u
	via.Host = p.Addr()
	var rnd [6]byte
	rand.Read(rnd[:])
	key := "fencelock-cli-test-" + hex.EncodeToString(rnd[:]) + "/partition"

	dir := t.TempDir()
	fifo := filepath.Join(dir, "child")
	w := watchChild(t, fifo)
	cmd := exec.Command(fencelockBin, "run", "--url", via.String(), "--ttl", ttl.String(), key, "--", self(t))
	cmd.Env = append(os.Environ(), "FENCELOCK_TEST_CHILD="+mode, "OUT="+fifo)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan time.Time, 1)
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		exited <- time.Now()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	select {
	case <-w.ready:
	case at := <-exited:
		t.Fatalf("fencelock exited at %v before its command ran: %v\n%s", at, waitErr, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("the command did not start within 60s\n%s", stderr.String())
	}

	// The next holder waits on a direct connection.
	ctx, cancel := context.WithTimeout(context.Background(), 20*ttl)
	defer cancel()
	next, err := fencelock.Open(ctx, rawURL, &fencelock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	granted := make(chan time.Time, 1)
	go func() {
		l, err := next.Acquire(ctx, key)
		if err != nil {
			t.Errorf("the next holder: %v", err)
			granted <- time.Time{}
			return
		}
		granted <- time.Now()
		l.Release(context.Background())
	}()

	var r partitionRun
	r.cutOff = time.Now()
	p.SetMode(faultproxy.Blackhole)
	deadline := time.After(20 * ttl)
	for r.death.IsZero() || r.granted.IsZero() || r.exited.IsZero() {
		select {
		case r.death = <-w.dead:
		case r.granted = <-granted:
			if r.granted.IsZero() {
				t.FailNow()
			}
		case r.exited = <-exited:
			r.code = exitCode(t, waitErr)
		case <-deadline:
			t.Fatalf("after %v: command dead %v, next holder granted %v, fencelock exited %v\n%s",
				20*ttl, !r.death.IsZero(), !r.granted.IsZero(), !r.exited.IsZero(), stderr.String())
		}
	}
	r.stderr = stderr.String()
	t.Logf("after the cut-off: command dead at +%v, next holder granted at +%v, fencelock exited at +%v (status %d)",
		r.death.Sub(r.cutOff).Round(time.Millisecond), r.granted.Sub(r.cutOff).Round(time.Millisecond),
		r.exited.Sub(r.cutOff).Round(time.Millisecond), r.code)
	return r
}

// TestCommandDeadBeforeNextHolder: a COMMAND that ignores SIGTERM, run by
// a fencelock cut off from its store (a real store, a real process
// boundary), is dead before another client is granted the lock, on every
// run: SIGTERM when the lease enters its danger zone, SIGKILL before its
// local validity ends, which is before the store frees the key.
func TestCommandDeadBeforeNextHolder(t *testing.T) {
	rawURL := testenv.URL(t, "FENCELOCK_TEST_REDIS")
	const ttl = 3 * time.Second
	for i := range 3 {
		r := runPartitioned(t, rawURL, "fifo-ignore", ttl)
		if gap := r.granted.Sub(r.death); gap <= 0 {
			t.Errorf("run %d: the next holder got the lock %v before the old command died\n%s", i, -gap, r.stderr)
		}
		if r.code != exitLeaseLost {
			t.Errorf("run %d: fencelock exit %d; want %d\n%s", i, r.code, exitLeaseLost, r.stderr)
		}
		if !strings.Contains(r.stderr, "danger zone") || !strings.Contains(r.stderr, "SIGKILL") {
			t.Errorf("run %d: stderr does not tell of the danger zone and the SIGKILL:\n%s", i, r.stderr)
		}
	}
}

// TestExitPromptOnceCommandEndsUnreachable: when COMMAND ends (here at the
// danger zone's SIGTERM) while the store is unreachable, fencelock waits
// on the store no longer than the lease's remaining local validity (at
// most one RenewInterval in the danger zone) plus Margin to close, not
// ReleaseTimeout or a client library's own timeouts.
func TestExitPromptOnceCommandEndsUnreachable(t *testing.T) {
	rawURL := testenv.URL(t, "FENCELOCK_TEST_REDIS")
	const ttl = 3 * time.Second
	o := resolvedOptions(t, ttl)
	r := runPartitioned(t, rawURL, "fifo-trap", ttl)
	bound := o.RenewInterval + 2*o.Margin
	if d := r.exited.Sub(r.death); d > bound {
		t.Errorf("fencelock exited %v after its command; want at most RenewInterval + 2×Margin = %v\n%s", d, bound, r.stderr)
	}
	if r.code != exitLeaseLost {
		t.Errorf("fencelock exit %d; want %d\n%s", r.code, exitLeaseLost, r.stderr)
	}
}

// TestRunMinHold: a command that finishes inside --min-hold leaves the key
// held until the hold ends (counted from the grant), and free from then on;
// fencelock itself exits as soon as the command does on a store that keeps
// the record by its TTL (the file backend).
func TestRunMinHold(t *testing.T) {
	f := newFixture(t)
	const hold = 3 * time.Second
	begin := time.Now()
	_, stderr, code := f.run("run", "--min-hold", hold.String(), "cron/job", "--", "true")
	exited := time.Now()
	if code != 0 {
		t.Fatalf("run --min-hold: exit %d\n%s", code, stderr)
	}
	if exited.Sub(begin) >= hold {
		t.Errorf("run --min-hold on the file backend took %v: it should exit when COMMAND does", exited.Sub(begin))
	}
	for {
		_, stderr, code = f.run("run", "--no-wait", "cron/job", "--", "true")
		now := time.Now()
		if code == 0 {
			if now.Sub(begin) < hold {
				t.Fatalf("key acquired %v after the first run began, inside its %v minimum hold", now.Sub(begin), hold)
			}
			if late := now.Sub(exited); late > hold+2*time.Second {
				t.Errorf("key free only %v after the first run exited; want about its %v minimum hold", late, hold)
			}
			break
		}
		if code != exitNotAcquired {
			t.Fatalf("run --no-wait: exit %d\n%s", code, stderr)
		}
		if now.Sub(exited) > hold+5*time.Second {
			t.Fatalf("key still held %v after a run with a %v minimum hold exited\n%s", now.Sub(exited), hold, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, stderr, code := f.run("run", "--min-hold", "-1s", "k", "--", "true"); code != 64 {
		t.Errorf("run --min-hold -1s: exit %d; want 64\n%s", code, stderr)
	}
	if _, stderr, code := f.run("run", "--min-hold", "25h", "k", "--", "true"); code != 64 {
		t.Errorf("run --min-hold 25h: exit %d; want 64\n%s", code, stderr)
	}
}

// TestRunMinHoldSessionStore: on etcd, whose locks end with the client's
// session, a COMMAND that finishes inside --min-hold keeps fencelock
// running (and renewing) until the hold ends; another run is refused
// meanwhile, and gets the key once the hold is over.
func TestRunMinHoldSessionStore(t *testing.T) {
	rawURL := testenv.URL(t, "FENCELOCK_TEST_ETCD")
	f := newFixture(t)
	f.url = rawURL
	key := "min-hold/" + hex.EncodeToString([]byte(t.Name()))[:8] + randSuffix(t)
	const hold = 4 * time.Second
	begin := time.Now()
	first := f.cmd("", "", "run", "--ttl", "2s", "--min-hold", hold.String(), key, "--", "true")
	var stderr bytes.Buffer
	first.Stderr = &stderr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan time.Time, 1)
	go func() {
		_ = first.Wait()
		exited <- time.Now()
	}()
	// The hold outlives COMMAND and the 2s TTL: still refused at 3s.
	time.Sleep(3 * time.Second)
	if _, se, code := f.run("run", "--no-wait", key, "--", "true"); code != exitNotAcquired {
		t.Fatalf("run --no-wait 3s into a 4s minimum hold on etcd: exit %d; want %d\n%s", code, exitNotAcquired, se)
	}
	at := <-exited
	if first.ProcessState.ExitCode() != 0 {
		t.Fatalf("run --min-hold: exit %d\n%s", first.ProcessState.ExitCode(), stderr.String())
	}
	if d := at.Sub(begin); d < hold {
		t.Errorf("fencelock exited %v after it began, inside its %v minimum hold: on etcd closing the client frees the key", d, hold)
	}
	if _, se, code := f.run("run", "--no-wait", key, "--", "true"); code != 0 {
		t.Errorf("run --no-wait after the minimum hold: exit %d; want 0\n%s", code, se)
	}
}

func randSuffix(t *testing.T) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// TestRunPermits: with --permits N, at most N runs of KEY hold a permit at
// once (nested runs, each holding its permit while the next tries), each
// with its own slot key in FENCELOCK_KEY; a run with another N is refused
// (64); bad --permits values are usage errors.
func TestRunPermits(t *testing.T) {
	f := newFixture(t)
	inner := `echo "$FENCELOCK_KEY"; exec "$0" run --permits 2 --no-wait pool -- true`
	middle := `echo "$FENCELOCK_KEY"; exec "$0" run --permits 2 --no-wait pool -- sh -c '` + inner + `' "$0"`
	stdout, stderr, code := f.run("run", "--permits", "2", "pool", "--", "sh", "-c", middle, fencelockBin)
	if code != exitNotAcquired {
		t.Errorf("a third run while two hold the 2 permits: exit %d; want %d\n%s", code, exitNotAcquired, stderr)
	}
	keys := strings.Fields(stdout)
	if len(keys) != 2 || keys[0] == keys[1] || !strings.HasPrefix(keys[0], "pool/.permit/") || !strings.HasPrefix(keys[1], "pool/.permit/") {
		t.Errorf("FENCELOCK_KEY of the two holders: %q; want two distinct slot keys pool/.permit/I", stdout)
	}
	if !strings.Contains(stderr, "all 2 permits") {
		t.Errorf("stderr does not say the permits are all held:\n%s", stderr)
	}
	_, stderr, code = f.run("run", "--permits", "2", "pool", "--", fencelockBin, "run", "--permits", "3", "--no-wait", "pool", "--", "true")
	if code != exitUsage || !strings.Contains(stderr, "permits") {
		t.Errorf("a run with 3 permits while one holds a permit of 2: exit %d; want %d\n%s", code, exitUsage, stderr)
	}
	if _, stderr, code := f.run("run", "--permits", "1", "--no-wait", "pool", "--", "true"); code != 0 {
		t.Errorf("run --permits 1 after every holder exited: exit %d; want 0 (nothing left behind)\n%s", code, stderr)
	}
	// --summary reports the permit's lease.
	_, stderr, code = f.run("run", "--permits", "3", "pool", "--", fencelockBin, "run", "--permits", "3", "--summary", "pool", "--", "true")
	if code != 0 || !strings.Contains(stderr, "end=released") {
		t.Errorf("run --permits 3 --summary: exit %d; want 0 and end=released\n%s", code, stderr)
	}
	for _, bad := range [][]string{{"--permits", "0"}, {"--permits", "-1"}, {"--permits", "257"}, {"--permits", "2", strings.Repeat("k", 510)}} {
		args := append(append([]string{"run"}, bad...), "--", "true")
		if len(bad) == 2 {
			args = append(append([]string{"run"}, bad...), "k", "--", "true")
		}
		if _, stderr, code := f.run(args...); code != exitUsage {
			t.Errorf("run %v: exit %d; want %d\n%s", bad, code, exitUsage, stderr)
		}
	}
}

// TestRunShared: --shared runs of KEY hold read grants at once (nested
// runs), none while a writer holds the read-write lock KEY; COMMAND gets
// KEY and the grant's gate token, above the writer's before it; a plain
// run KEY is not exclusive against it; bad combinations are usage errors.
func TestRunShared(t *testing.T) {
	f := newFixture(t)
	inner := `echo "$FENCELOCK_KEY $FENCELOCK_TOKEN"; exec "$0" run --shared --no-wait catalog -- sh -c 'echo "$FENCELOCK_KEY $FENCELOCK_TOKEN"'`
	stdout, stderr, code := f.run("run", "--shared", "catalog", "--", "sh", "-c", inner, fencelockBin)
	if code != 0 {
		t.Fatalf("a --shared run inside another: exit %d; want 0 (readers share)\n%s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "catalog ") || !strings.HasPrefix(lines[1], "catalog ") {
		t.Fatalf("FENCELOCK_KEY and FENCELOCK_TOKEN of the two readers: %q; want KEY and a token each", stdout)
	}
	// A plain run of KEY uses KEY itself: not exclusive against readers.
	if _, stderr, code := f.run("run", "--shared", "catalog", "--", fencelockBin, "run", "--no-wait", "catalog", "--", "true"); code != 0 {
		t.Errorf("a plain run inside a --shared run: exit %d; want 0 (different keys)\n%s", code, stderr)
	}

	ctx := t.Context()
	c, err := fencelock.Open(ctx, f.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rw, err := recipe.NewRWLock(c, "catalog")
	if err != nil {
		t.Fatal(err)
	}
	w, err := rw.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := f.run("run", "--shared", "--no-wait", "catalog", "--", "true"); code != exitNotAcquired {
		t.Errorf("--shared --no-wait while a writer holds: exit %d; want %d\n%s", code, exitNotAcquired, stderr)
	}
	wtok := w.Token()
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = f.run("run", "--shared", "catalog", "--", "sh", "-c", `echo "$FENCELOCK_TOKEN"`)
	tok, perr := strconv.ParseUint(strings.TrimSpace(stdout), 10, 64)
	if code != 0 || perr != nil || fencelock.Token(tok) <= wtok {
		t.Errorf("--shared after the writer: exit %d, token %q; want a token above the writer's %d\n%s", code, stdout, wtok, stderr)
	}
	for _, bad := range [][]string{{"--shared", "--permits", "2", "k"}, {"--shared", strings.Repeat("k", 510)}} {
		args := append(append([]string{"run"}, bad...), "--", "true")
		if _, stderr, code := f.run(args...); code != exitUsage {
			t.Errorf("run %v: exit %d; want %d\n%s", bad, code, exitUsage, stderr)
		}
	}
}
