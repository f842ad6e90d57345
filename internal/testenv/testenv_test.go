package testenv

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/pause"
)

// newState makes a state dir for a test, removed (with a check that no
// process of it is left) at its end.
func newState(t *testing.T) *Env {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, marker), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	e.StopTimeout = 5 * time.Second
	return e
}

func TestFreePortsAreDistinctAndListenable(t *testing.T) {
	e := newState(t)
	var mu sync.Mutex
	seen := map[int]bool{}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			p, err := FreePort(e.State)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[p] {
				t.Errorf("port %d handed out twice", p)
			}
			seen[p] = true
		})
	}
	wg.Wait()
	for p := range seen {
		if p < portMin || p > portMax {
			t.Errorf("port %d outside %d-%d", p, portMin, portMax)
		}
		l, err := net.Listen("tcp", hostPort(p))
		if err != nil {
			t.Errorf("port %d is not free: %v", p, err)
			continue
		}
		l.Close()
	}
	b, err := os.ReadFile(filepath.Join(e.State, ".ports"))
	if err != nil || len(strings.Fields(string(b))) != 20 {
		t.Errorf(".ports holds %q, %v; want the 20 ports", b, err)
	}
}

func TestFreePortSkipsAListeningPort(t *testing.T) {
	e := newState(t)
	// Every port but one of the range is "handed out"; the one left is
	// taken by a listener, so FreePort must fail rather than return it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	if taken < portMin || taken > portMax {
		t.Skipf("the kernel gave port %d, outside the range", taken)
	}
	var b strings.Builder
	for p := portMin; p <= portMax; p++ {
		if p != taken {
			b.WriteString(strconv.Itoa(p) + "\n")
		}
	}
	if err := os.WriteFile(filepath.Join(e.State, ".ports"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := FreePort(e.State); err == nil {
		t.Fatalf("FreePort returned %d; the only port left is in use (%d)", p, taken)
	}
}

// sleeper is a fake server: a shell that forks a child, so that the
// process tree has more than the root.
func sleeperSpec(dir string) spawnSpec {
	return spawnSpec{
		argv:    []string{"/bin/sh", "-c", "sleep 300 & wait"},
		dir:     dir,
		log:     filepath.Join(dir, "sleeper.log"),
		pidFile: filepath.Join(dir, "pid"),
	}
}

func waitTree(t *testing.T, pid, n int) []int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		tree := pause.Tree(pid)
		if len(tree) >= n {
			return tree
		}
		if time.Now().After(deadline) {
			t.Fatalf("process tree of %d: %v, want %d processes", pid, tree, n)
		}
		time.Sleep(pollInterval)
	}
}

func TestSpawnStopLeavesNoProcess(t *testing.T) {
	e := newState(t)
	u := &unit{e: e, srv: &server{name: "sleeper"}, dir: e.State}
	pid, err := spawn(sleeperSpec(e.State))
	if err != nil {
		t.Fatal(err)
	}
	tree := waitTree(t, pid, 2)
	if got, ok := u.pid(""); !ok || got != pid {
		t.Fatalf("pid file names %d, %v; want %d", got, ok, pid)
	}
	p, _ := pause.Read(pid)
	if p.PGRP != pid {
		t.Errorf("process group %d, want its own (%d)", p.PGRP, pid)
	}
	e.stopAll(graceful, u)
	for _, q := range tree {
		if running(q) {
			t.Errorf("process %d of the tree %v still runs after stop", q, tree)
		}
	}
	if fileExists(u.pidFile("")) {
		t.Error("pid file left after stop")
	}
}

func TestCrashKillsTheWholeTree(t *testing.T) {
	e := newState(t)
	u := &unit{e: e, srv: &server{name: "sleeper"}, dir: e.State}
	pid, err := spawn(sleeperSpec(e.State))
	if err != nil {
		t.Fatal(err)
	}
	tree := waitTree(t, pid, 2)
	e.stopAll(crash, u)
	for _, q := range tree {
		if running(q) {
			t.Errorf("process %d still runs after kill -9", q)
		}
	}
}

// A pid file whose start time does not match names another process (a
// reused PID): it must not be touched.
func TestStalePIDFileIsNotTouched(t *testing.T) {
	e := newState(t)
	u := &unit{e: e, srv: &server{name: "sleeper"}, dir: e.State}
	pid, err := spawn(sleeperSpec(e.State))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(-pid, syscall.SIGKILL)
	p, _ := pause.Read(pid)
	if err := os.WriteFile(u.pidFile(""), []byte(strconv.Itoa(pid)+" "+strconv.FormatUint(p.Start+1, 10)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := u.pid(""); ok {
		t.Fatal("a pid file with another start time counts as running")
	}
	e.stopAll(crash, u)
	if !running(pid) {
		t.Fatal("stop killed a process whose start time did not match the pid file")
	}
}

func TestPauseResume(t *testing.T) {
	e := newState(t)
	u := &unit{e: e, srv: &server{name: "sleeper"}, dir: e.State}
	pid, err := spawn(sleeperSpec(e.State))
	if err != nil {
		t.Fatal(err)
	}
	defer e.stopAll(crash, u)
	tree := waitTree(t, pid, 2)
	ctx := context.Background()
	for range 2 { // idempotent
		if err := pauseTree(ctx, u.pidFile(""), true); err != nil {
			t.Fatal(err)
		}
		for _, q := range tree {
			if p, _ := pause.Read(q); !p.Stopped() {
				t.Errorf("process %d in state %c after pause", q, p.State)
			}
		}
		if st, _ := u.state(""); st != Paused {
			t.Errorf("state %s after pause", st)
		}
	}
	for range 2 {
		if err := pauseTree(ctx, u.pidFile(""), false); err != nil {
			t.Fatal(err)
		}
		for _, q := range tree {
			if p, _ := pause.Read(q); p.Stopped() {
				t.Errorf("process %d still stopped after resume", q)
			}
		}
		if st, _ := u.state(""); st != Running {
			t.Errorf("state %s after resume", st)
		}
	}
	// A paused server can still be stopped gracefully.
	if err := pauseTree(ctx, u.pidFile(""), true); err != nil {
		t.Fatal(err)
	}
	e.stopAll(graceful, u)
	for _, q := range tree {
		if running(q) {
			t.Errorf("paused process %d survived the stop", q)
		}
	}
	if err := pauseTree(ctx, u.pidFile(""), true); !errors.Is(err, ErrNotRunning) {
		t.Errorf("pausing a stopped server: %v, want ErrNotRunning", err)
	}
}

func TestExportsRoundTrip(t *testing.T) {
	vars := []Var{
		{StateEnv, "/tmp/fencelock-testenv.123"},
		{"FENCELOCK_TEST_POSTGRES", "postgres://fencelock@127.0.0.1:5432/fencelock?sslmode=disable"},
		{"FENCELOCK_TEST_ETCD3", "etcd://127.0.0.1:1,127.0.0.1:2"},
		{"FENCELOCK_TEST_ODD", `it's a "b" $c \d`},
		{"FENCELOCK_TEST_EMPTY", ""},
	}
	var b bytes.Buffer
	if err := WriteExports(&b, vars); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "export FENCELOCK_TESTENV_STATE='/tmp/fencelock-testenv.123'\n") {
		t.Errorf("first line: %q", b.String())
	}
	got, err := ParseExports(&b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(vars) {
		t.Fatalf("ParseExports = %v, want %v", got, vars)
	}
	for i := range vars {
		if got[i] != vars[i] {
			t.Errorf("variable %d: %+v, want %+v", i, got[i], vars[i])
		}
	}
	for _, bad := range []string{"testenv: a message", "export X='open", "export 1X='a'", "X='a'"} {
		if _, err := ParseExports(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseExports accepted %q", bad)
		}
	}
}

func TestSavedVarsRoundTripAndOldFormat(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "env")
	want := map[string]string{"PG_PORT": "15432", "ETCD_INITIAL_CLUSTER": "m1=http://127.0.0.1:1,m2=http://127.0.0.1:2", "Q": "a'b c"}
	if err := storeVars(f, want); err != nil {
		t.Fatal(err)
	}
	got, err := loadVars(f)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// What scripts/testenv wrote with printf %q.
	if err := os.WriteFile(f, []byte("ZK_JAVA=/usr/bin/java\nX=a\\ b\\'c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = loadVars(f)
	if err != nil || got["ZK_JAVA"] != "/usr/bin/java" || got["X"] != "a b'c" {
		t.Errorf("old env file: %v, %v", got, err)
	}
}

func TestEnvVar(t *testing.T) {
	for name, want := range map[string]string{
		"postgres":        "FENCELOCK_TEST_POSTGRES",
		"zookeeper-stock": "FENCELOCK_TEST_ZOOKEEPER_STOCK",
		"mongo-pg":        "FENCELOCK_TEST_MONGO_PG",
		"etcd3":           "FENCELOCK_TEST_ETCD3",
	} {
		if got := EnvVar(name); got != want {
			t.Errorf("EnvVar(%s) = %s, want %s", name, got, want)
		}
	}
	for _, n := range Names() {
		if _, ok := servers[n]; !ok {
			t.Errorf("name %s has no server", n)
		}
	}
}

func TestOpenAndRestartNeedAState(t *testing.T) {
	if _, err := Open(t.TempDir()); !errors.Is(err, ErrNoState) {
		t.Errorf("Open of a dir without the marker: %v, want ErrNoState", err)
	}
	t.Setenv(StateEnv, "")
	if Restart("redis") != nil {
		t.Error("Restart without a state dir is not nil")
	}
	e := newState(t)
	t.Setenv(StateEnv, e.State)
	t.Setenv("FENCELOCK_TEST_REDIS", "redis://db.example:6379/0")
	if Restart("redis") != nil {
		t.Error("Restart of a server the state dir does not own is not nil")
	}
	if err := e.Restart(context.Background(), "redis"); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Restart of a server never started: %v, want ErrNotStarted", err)
	}
	if err := e.Restart(context.Background(), "nosuch"); !errors.Is(err, ErrUnknown) {
		t.Errorf("Restart of an unknown name: %v, want ErrUnknown", err)
	}
}

func TestRedactArgs(t *testing.T) {
	got := strings.Join(redactArgs([]string{"bin", "-postgresql-url=postgres://u:secret@h/db", "postgres://u:secret@h/db", "-port", "1"}), " ")
	if strings.Contains(got, "secret") {
		t.Errorf("redactArgs left the password: %s", got)
	}
}

// TestUpRestartDownRedis starts a Redis server of its own, checks that a
// write survives Restart (kill -9, AOF replay) and that Down leaves no
// process and no state dir.
func TestUpRestartDownRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	t.Setenv("TMPDIR", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var log bytes.Buffer
	e, vars, err := Up(ctx, Config{CI: IsCI(), Log: &log}, "redis")
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	down := func() {
		if _, err := e.Down(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("down: %v", err)
		}
	}
	url := e.URL("redis")
	if url == "" {
		down()
		if IsCI() {
			t.Fatalf("Up(redis) started nothing\n%s", log.String())
		}
		t.Skipf("Up(redis) could not start a server here\n%s", log.String())
	}
	if len(vars) < 2 || vars[0].Name != StateEnv || vars[len(vars)-1] != (Var{"FENCELOCK_TEST_REDIS", url}) {
		down()
		t.Fatalf("Up exported %v", vars)
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "redis://"), "/0")
	pid, err := e.PID("redis")
	if err != nil {
		down()
		t.Fatal(err)
	}
	tree := pause.Tree(pid)
	if _, err := redisDo(ctx, addr, "SET", "testenv-key", "v1"); err != nil {
		t.Error(err)
	}
	if err := e.Restart(ctx, "redis"); err != nil {
		t.Error(err)
	}
	if running(pid) {
		t.Errorf("old server %d still runs after Restart", pid)
	}
	if v, err := redisDo(ctx, addr, "GET", "testenv-key"); err != nil || v != "v1" {
		t.Errorf("after Restart: GET = %v, %v; want v1", v, err)
	}
	pid2, err := e.PID("redis")
	if err != nil {
		t.Error(err)
	}
	state := e.State
	down()
	for _, p := range append(tree, pid2) {
		if running(p) {
			t.Errorf("process %d still runs after Down", p)
		}
	}
	if fileExists(state) {
		t.Errorf("state dir %s left after Down", state)
	}
}
