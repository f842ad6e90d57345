//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package file_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/file"
)

const helperEnv = "FENCELOCK_FILE_TEST_HELPER"

// TestAcrossProcesses re-runs this test binary as several helper processes
// that increment a counter in a plain file under one lock. Each increment is
// a read, a pause and a write, so any overlap of two holders loses an
// increment; the counter must end exact, and the fencing tokens the holders
// saw must be distinct.
func TestAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const procs, rounds = 3, 15
	dir := t.TempDir()
	work := t.TempDir()
	counter := filepath.Join(work, "counter")
	if err := os.WriteFile(counter, []byte("0"), 0o644); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
		cmd.Env = append(os.Environ(),
			helperEnv+"=1", "HELPER_DIR="+dir, "HELPER_COUNTER="+counter,
			"HELPER_TOKENS="+filepath.Join(work, fmt.Sprintf("tokens.%d", i)),
			"HELPER_ROUNDS="+strconv.Itoa(rounds))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper process: %v", err)
		}
	}
	data, err := os.ReadFile(counter)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(data)); got != strconv.Itoa(procs*rounds) {
		t.Fatalf("counter = %s; want %d: increments were lost, so two processes held the lock at once", got, procs*rounds)
	}
	seen := map[string]bool{}
	for i := range procs {
		data, err := os.ReadFile(filepath.Join(work, fmt.Sprintf("tokens.%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		var prev uint64
		for _, f := range strings.Fields(string(data)) {
			if seen[f] {
				t.Errorf("token %s was issued twice", f)
			}
			seen[f] = true
			n, _ := strconv.ParseUint(f, 10, 64)
			if n <= prev {
				t.Errorf("process %d saw token %d after %d", i, n, prev)
			}
			prev = n
		}
	}
	if len(seen) != procs*rounds {
		t.Errorf("%d distinct tokens; want %d", len(seen), procs*rounds)
	}
}

// TestHelperProcess is the body of TestAcrossProcesses's helper processes;
// run directly, it does nothing.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for TestAcrossProcesses")
	}
	b, err := file.New(context.Background(), &file.Options{Dir: os.Getenv("HELPER_DIR")})
	if err != nil {
		t.Fatal(err)
	}
	c, err := fencelock.New(b, &fencelock.Options{TTL: 5 * time.Second, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rounds, _ := strconv.Atoi(os.Getenv("HELPER_ROUNDS"))
	counter := os.Getenv("HELPER_COUNTER")
	tokens, err := os.OpenFile(os.Getenv("HELPER_TOKENS"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer tokens.Close()
	for range rounds {
		l, err := c.Acquire(ctx, "shared/counter")
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(counter)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // widen the window for an overlapping holder
		if err := os.WriteFile(counter, []byte(strconv.Itoa(n+1)), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(tokens, uint64(l.Token()))
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPreviousBootExpired: a record written under another boot's clock (or
// another clock) belongs to a process that no longer exists, so the key is
// free, and the next token is still higher than the old one.
func TestRecordOfAnotherBootIsExpired(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	b, err := file.New(ctx, &file.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := fencelock.New(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryAcquire(ctx, "boot")
	if err != nil {
		t.Fatal(err)
	}
	old := l.Token()
	// Rewrite the record as if by a previous boot, far from expiry.
	matches, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(matches) != 1 {
		t.Fatalf("state files: %v", matches)
	}
	data, _ := os.ReadFile(matches[0])
	s := string(data)
	i := strings.Index(s, `"expires":`)
	j := strings.Index(s, `"clock":"`)
	if i < 0 || j < 0 {
		t.Fatalf("unexpected state file %s", s)
	}
	s = s[:i] + `"expires":9000000000000000000,"clock":"monotonic/another-boot"}` + "\n"
	if err := os.WriteFile(matches[0], []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	c2, err := fencelock.New(mustNew(t, dir), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	l2, err := c2.TryAcquire(ctx, "boot")
	if err != nil {
		t.Fatalf("TryAcquire over a record of another boot: %v", err)
	}
	if l2.Token() <= old {
		t.Fatalf("token %d not above %d", l2.Token(), old)
	}
	if err := l.Release(ctx); !errors.Is(err, fencelock.ErrNotHeld) {
		t.Fatalf("old holder's Release = %v; want ErrNotHeld", err)
	}
}

// TestDamagedStateFile: a state file that does not parse (a power failure
// mid-write) reads as a free key, and tokens continue above the old ones
// through the wall-clock floor.
func TestDamagedStateFile(t *testing.T) {
	dir := t.TempDir()
	c, err := fencelock.New(mustNew(t, dir), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, "damaged")
	if err != nil {
		t.Fatal(err)
	}
	old := l.Token()
	matches, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if err := os.WriteFile(matches[0], []byte(`{"key":"dama`), 0o644); err != nil {
		t.Fatal(err)
	}
	c2, err := fencelock.New(mustNew(t, dir), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	l2, err := c2.TryAcquire(ctx, "damaged")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= old {
		t.Fatalf("token %d not above %d", l2.Token(), old)
	}
}

func TestDefaultDirMustBePrivate(t *testing.T) {
	rt := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", rt)
	if got, want := file.DefaultDir(), filepath.Join(rt, "fencelock"); got != want {
		t.Fatalf("DefaultDir() = %q; want %q", got, want)
	}
	b, err := file.New(context.Background(), nil)
	if err != nil {
		t.Fatalf("New(nil): %v", err)
	}
	b.Close()
	if err := os.Chmod(filepath.Join(rt, "fencelock"), 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := file.New(context.Background(), nil); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Fatalf("New(nil) on a world-writable default dir = %v; want ErrInvalidOption", err)
	}
	os.Remove(filepath.Join(rt, "fencelock"))
	if err := os.Symlink(t.TempDir(), filepath.Join(rt, "fencelock")); err != nil {
		t.Fatal(err)
	}
	if _, err := file.New(context.Background(), nil); !errors.Is(err, fencelock.ErrInvalidOption) {
		t.Fatalf("New(nil) on a symlinked default dir = %v; want ErrInvalidOption", err)
	}
}

func TestOpenURL(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for _, u := range []string{"file://" + dir, "file://localhost" + dir, "file://" + dir + "?sync=false", "FILE://" + dir + "?ttl=2s"} {
		c, err := fencelock.Open(ctx, u, nil)
		if err != nil {
			t.Errorf("Open(%q): %v", u, err)
			continue
		}
		if d := c.Describe(); d.Name != "file" {
			t.Errorf("Open(%q) backend %q", u, d.Name)
		}
		c.Close()
	}
	for _, u := range []string{"file://otherhost/x", "file://" + dir + "?tabel=x", "file://user:secret@/x", "file://" + dir + "?sync=maybe"} {
		_, err := fencelock.Open(ctx, u, nil)
		if !errors.Is(err, fencelock.ErrInvalidOption) {
			t.Errorf("Open(%q) = %v; want ErrInvalidOption", u, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q) error shows the password: %v", u, err)
		}
	}
	// Without fencelock.Open's lower-casing, too: schemes are
	// case-insensitive in every backend.
	b, err := file.Open(ctx, "FILE://"+dir)
	if err != nil {
		t.Fatalf("file.Open(FILE://…): %v", err)
	}
	b.Close()
}

func mustNew(t *testing.T, dir string) *file.Backend {
	t.Helper()
	b, err := file.New(context.Background(), &file.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNewWithEndedContext: New checks its context before it touches the
// disk, as the other backends' constructors do.
func TestNewWithEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := filepath.Join(t.TempDir(), "locks")
	if _, err := file.New(ctx, &file.Options{Dir: dir}); !errors.Is(err, context.Canceled) {
		t.Fatalf("New with an ended context = %v; want context.Canceled", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("New with an ended context created %s (stat: %v)", dir, err)
	}
}
