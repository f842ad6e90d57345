package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRunShared40Overlap: 40 concurrent `fencelock run --shared` processes
// on the embedded default backend (no URL: the file backend in
// $XDG_RUNTIME_DIR/fencelock) all hold read grants at once. Each command
// records when it entered and waits, inside its run, until 40 have
// entered, then records when it leaves: the overlap is proved from those
// records (every entry before every exit). With a cap below 40, the runs
// beyond it enter only after the first ones gave up.
func TestRunShared40Overlap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 40 processes")
	}
	const n = 40
	runtimeDir := t.TempDir()
	if err := os.Chmod(runtimeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	env := []string{"XDG_RUNTIME_DIR=" + runtimeDir, "FENCELOCK_TEST_CHILD=barrier", "OUT=" + out, "N=" + strconv.Itoa(n)}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCELOCK_URL=") {
			env = append(env, kv)
		}
	}
	var wg sync.WaitGroup
	errs := make([]string, n)
	for i := range n {
		wg.Go(func() {
			cmd := exec.Command(fencelockBin, "run", "--shared", "config", "--", self(t))
			cmd.Env = env
			if b, err := cmd.CombinedOutput(); err != nil {
				errs[i] = err.Error() + ": " + string(b)
			}
		})
	}
	wg.Wait()
	for i, e := range errs {
		if e != "" {
			t.Errorf("run %d: %s", i, e)
		}
	}
	saw, _ := filepath.Glob(filepath.Join(out, "*.saw"))
	if len(saw) != n {
		t.Fatalf("%d of %d --shared runs saw all %d inside at once; want every one", len(saw), n, n)
	}
	var lastIn, firstOut int64
	for _, f := range saw {
		b, err := os.ReadFile(f)
		out, perr := strconv.ParseInt(string(b), 10, 64)
		if err != nil || perr != nil {
			t.Fatalf("%s: %q", f, b)
		}
		rec, err := os.ReadFile(strings.TrimSuffix(f, ".saw"))
		tok, in, _ := strings.Cut(string(rec), " ")
		v, terr := strconv.ParseUint(tok, 10, 64)
		entered, ierr := strconv.ParseInt(in, 10, 64)
		if err != nil || terr != nil || ierr != nil || v == 0 {
			t.Fatalf("%s: %q; want a fencing token and the time it entered", f, rec)
		}
		lastIn = max(lastIn, entered)
		if firstOut == 0 || out < firstOut {
			firstOut = out
		}
	}
	if lastIn >= firstOut {
		t.Errorf("the last run entered %v after the first left; want all %d inside at once", time.Duration(lastIn-firstOut), n)
	}
	if _, err := os.Stat(filepath.Join(runtimeDir, "fencelock")); err != nil {
		t.Errorf("the runs did not use the default backend's directory: %v", err)
	}
}

// TestRunSeveralKeys: `fencelock run K1 K2 K3 -- COMMAND` holds every key
// and gives COMMAND each key's token; a run naming an overlapping set with
// --no-wait is refused and leaves its other keys free; duplicates and
// --shared/--permits with several keys are usage errors.
func TestRunSeveralKeys(t *testing.T) {
	f := newFixture(t)
	show := `echo "$FENCELOCK_KEYS|$FENCELOCK_KEY_1=$FENCELOCK_TOKEN_1|$FENCELOCK_KEY_2=$FENCELOCK_TOKEN_2|$FENCELOCK_KEY_3=$FENCELOCK_TOKEN_3|$FENCELOCK_KEY=$FENCELOCK_TOKEN"`
	stdout, stderr, code := f.run("run", "shard/2", "shard/0", "shard/1", "--", "sh", "-c", show)
	if code != 0 {
		t.Fatalf("run with three keys: exit %d\n%s", code, stderr)
	}
	first := map[string]uint64{}
	parts := strings.Split(strings.TrimSpace(stdout), "|")
	if len(parts) != 5 || parts[0] != "3" {
		t.Fatalf("COMMAND's environment: %q; want FENCELOCK_KEYS=3 and three keys", stdout)
	}
	for i, want := range []string{"shard/2", "shard/0", "shard/1", "shard/2"} {
		k, tok, _ := strings.Cut(parts[i+1], "=")
		v, err := strconv.ParseUint(tok, 10, 64)
		if k != want || err != nil || v == 0 {
			t.Errorf("COMMAND's key %d: %q; want %s with its token (keys in the order named, then FENCELOCK_KEY for the first)", i+1, parts[i+1], want)
		}
		first[k] = v
	}
	// Inside a run holding shard/0 and shard/1, a run of shard/1 and
	// shard/9 is refused and leaves shard/9 free.
	inner := `"$0" run --no-wait shard/9 shard/1 -- true; echo "inner $?"; "$0" run --no-wait shard/9 -- true; echo "alone $?"`
	stdout, stderr, code = f.run("run", "shard/0", "shard/1", "--", "sh", "-c", inner, fencelockBin)
	if code != 0 || !strings.Contains(stdout, "inner "+strconv.Itoa(exitNotAcquired)) || !strings.Contains(stdout, "alone 0") {
		t.Errorf("overlapping --no-wait run: exit %d, %q; want the inner run refused (%d) and shard/9 left free\n%s", code, stdout, exitNotAcquired, stderr)
	}
	stdout, _, _ = f.run("run", "shard/0", "shard/1", "--", "sh", "-c", `echo "$FENCELOCK_TOKEN_1 $FENCELOCK_TOKEN_2"`)
	toks := strings.Fields(stdout)
	for i, k := range []string{"shard/0", "shard/1"} {
		if v, err := strconv.ParseUint(toks[min(i, len(toks)-1)], 10, 64); len(toks) != 2 || err != nil || v <= first[k] {
			t.Errorf("tokens of a later grant of shard/0 and shard/1: %q; want each above its first grant's (%d)", stdout, first[k])
		}
	}
	for _, bad := range [][]string{{"a", "a"}, {"--shared", "a", "b"}, {"--permits", "2", "a", "b"}} {
		args := append(append([]string{"run"}, bad...), "--", "true")
		if _, stderr, code := f.run(args...); code != exitUsage {
			t.Errorf("run %v: exit %d; want %d\n%s", bad, code, exitUsage, stderr)
		}
	}
}
