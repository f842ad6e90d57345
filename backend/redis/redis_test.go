package redis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	fencelockredis "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/testenv"
)

// open returns a backend on the test server under a fresh prefix, and a
// plain go-redis client to look at what it stored.
func open(t *testing.T) (*fencelockredis.Backend, *goredis.Client) {
	t.Helper()
	opt, err := goredis.ParseURL(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	b, err := fencelockredis.New(t.Context(), rdb, &fencelockredis.Options{Prefix: uniquePrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, rdb
}

func acquire(t *testing.T, b driver.Backend, key, owner string, ttl time.Duration) driver.Grant {
	t.Helper()
	g, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: key, Owner: owner, TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return g
}

// TestScriptReloadAfterFlush: SCRIPT FLUSH (as after a restart or a
// failover to a server that never saw the scripts) costs one EVAL, for
// single calls and for pipelines (RenewBatch, List) alike.
func TestScriptReloadAfterFlush(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	flush := func() {
		t.Helper()
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	g := acquire(t, b, "k1", "o1", time.Minute)
	flush()
	g2, err := b.Renew(ctx, g, driver.RenewRequest{TTL: time.Minute, Rotate: true})
	if err != nil || g2.Token <= g.Token {
		t.Fatalf("Renew after SCRIPT FLUSH = %+v, %v", g2, err)
	}
	h := acquire(t, b, "k2", "o2", time.Minute)
	flush()
	res, err := b.RenewBatch(ctx, []driver.Grant{g2, h, g}, driver.RenewRequest{TTL: time.Minute})
	if err != nil {
		t.Fatalf("RenewBatch after SCRIPT FLUSH: %v", err)
	}
	if res[0].Err != nil || res[1].Err != nil || !errors.Is(res[2].Err, driver.ErrNotHeld) {
		t.Fatalf("RenewBatch after SCRIPT FLUSH = %+v; want ok, ok, ErrNotHeld (pre-rotation token)", res)
	}
	flush()
	infos, err := b.List(ctx, "")
	if err != nil || len(infos) != 2 {
		t.Fatalf("List after SCRIPT FLUSH = %+v, %v", infos, err)
	}
	flush()
	if info, err := b.Inspect(ctx, "k1"); err != nil || info.Token != g2.Token {
		t.Fatalf("Inspect after SCRIPT FLUSH = %+v, %v", info, err)
	}
	flush()
	if _, err := b.ForceRelease(ctx, "k2"); err != nil {
		t.Fatal(err)
	}
	flush()
	if err := b.Release(ctx, g2); err != nil {
		t.Fatalf("Release after SCRIPT FLUSH: %v", err)
	}
}

// TestCounterSurvivesLockExpiry: the lock record expires, the counter does
// not, and the next holder's token is higher.
func TestCounterSurvivesLockExpiry(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	g := acquire(t, b, "expiring", "o1", 50*time.Millisecond)
	lockKeys, _ := rdb.Keys(ctx, "{"+b.Prefix()+":expiring}:*").Result()
	if len(lockKeys) != 2 {
		t.Fatalf("keys stored for one lock: %q; want the lock record and the counter", lockKeys)
	}
	lock, counter := "{"+b.Prefix()+":expiring}:lock", "{"+b.Prefix()+":expiring}:token"
	if ttl := rdb.PTTL(ctx, counter).Val(); ttl != -1 {
		t.Fatalf("counter PTTL = %v; want -1 (no expiry)", ttl)
	}
	deadline := time.Now().Add(5 * time.Second)
	for rdb.Exists(ctx, lock).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("lock record did not expire")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n, err := rdb.Get(ctx, counter).Uint64(); err != nil || n != uint64(g.Token) {
		t.Fatalf("counter after lock expiry = %d, %v; want %d", n, err, g.Token)
	}
	if _, err := b.Renew(ctx, g, driver.RenewRequest{TTL: time.Second}); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Renew of an expired lock = %v; want ErrNotHeld", err)
	}
	if rdb.Exists(ctx, lock).Val() != 0 {
		t.Fatal("Renew of an expired lock recreated it")
	}
	g2 := acquire(t, b, "expiring", "o2", time.Second)
	if g2.Token <= g.Token {
		t.Fatalf("token after expiry %d not above %d", g2.Token, g.Token)
	}
}

// TestWrongOwnerReleaseChangesNothing: a release or renewal with the
// wrong owner or token leaves the lock, its TTL and the counter as they
// were, and wakes no waiter.
func TestWrongOwnerReleaseChangesNothing(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	g := acquire(t, b, "mine", "owner-a", time.Minute)
	lock, counter := "{"+b.Prefix()+":mine}:lock", "{"+b.Prefix()+":mine}:token"
	before := rdb.Get(ctx, lock).Val()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	woken, err := b.Watch(wctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	// Drop the short TTL so a wrong renewal would show.
	if err := rdb.PExpire(ctx, lock, 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []driver.Grant{
		{Key: "mine", Owner: "owner-b", Token: g.Token},
		{Key: "mine", Owner: "owner-a", Token: g.Token + 1},
		{Key: "mine", Owner: "owner-a", Token: g.Token - 1},
		{Key: "mine", Owner: "", Token: g.Token},
	} {
		if err := b.Release(ctx, bad); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Release(%+v) = %v; want ErrNotHeld", bad, err)
		}
		if _, err := b.Renew(ctx, bad, driver.RenewRequest{TTL: time.Hour, Rotate: true}); !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("Renew(%+v) = %v; want ErrNotHeld", bad, err)
		}
	}
	if after := rdb.Get(ctx, lock).Val(); after != before || before == "" {
		t.Errorf("lock changed: %v -> %v", before, after)
	}
	if ttl := rdb.PTTL(ctx, lock).Val(); ttl > 30*time.Second || ttl < 20*time.Second {
		t.Errorf("lock PTTL = %v after wrong renewals; want ≤ 30s as set", ttl)
	}
	if n, _ := rdb.Get(ctx, counter).Uint64(); n != uint64(g.Token) {
		t.Errorf("counter = %d; want %d (a wrong rotation must not INCR)", n, g.Token)
	}
	select {
	case <-woken:
		t.Error("a refused release woke a waiter")
	case <-time.After(200 * time.Millisecond):
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Error("the holder's release woke no waiter")
	}
}

// TestKeysOnTheServer: odd keys are stored under escaped, hash-tagged
// names and List finds exactly the ones with a prefix, glob characters
// and all.
func TestKeysOnTheServer(t *testing.T) {
	b, rdb := open(t)
	ctx := t.Context()
	keys := []string{"a{b}c", "a*", "a?", "a[x]", `a\`, "a%7B", "ab", "b"}
	for _, k := range keys {
		acquire(t, b, k, "o", time.Minute)
	}
	names := rdb.Keys(ctx, "*"+b.Prefix()+"*:lock").Val()
	want := "{" + b.Prefix() + ":a%7Bb%7Dc}:lock"
	found := false
	for _, n := range names {
		found = found || n == want
	}
	if !found {
		t.Errorf("lock names %q lack %q", names, want)
	}
	for prefix, n := range map[string]int{"a": 7, "a*": 1, "a?": 1, "a[": 1, `a\`: 1, "a%": 1, "a{": 1, "": 8, "c": 0} {
		infos, err := b.List(ctx, prefix)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != n {
			t.Errorf("List(%q) = %v; want %d keys", prefix, infos, n)
		}
		for _, in := range infos {
			if !strings.HasPrefix(in.Key, prefix) || in.Owner != "o" || in.Token == 0 || in.Remaining <= 0 {
				t.Errorf("List(%q) entry %+v", prefix, in)
			}
		}
	}
}

// TestWakeOne: a release wakes one of a process's waiters, not all.
func TestWakeOne(t *testing.T) {
	b, _ := open(t)
	ctx := t.Context()
	g := acquire(t, b, "herd", "holder", time.Minute)
	var chans []<-chan struct{}
	for range 4 {
		ch, err := b.Watch(ctx, "herd")
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	select {
	case <-chans[0]:
	case <-time.After(5 * time.Second):
		t.Fatal("the longest waiter was not woken")
	}
	time.Sleep(100 * time.Millisecond)
	for i, ch := range chans[1:] {
		select {
		case <-ch:
			t.Errorf("waiter %d woken too", i+1)
		default:
		}
	}
}

// TestCloseEndsEverything: Close ends Watch channels and the pub/sub
// goroutine, leaves a caller's client open, and later calls get ErrClosed.
func TestCloseEndsEverything(t *testing.T) {
	opt, err := goredis.ParseURL(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	b, err := fencelockredis.New(ctx, rdb, &fencelockredis.Options{Prefix: uniquePrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := fencelock.New(b, &fencelock.Options{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := b.Watch(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	default:
		t.Error("lease not ended by Close")
	}
	// The channel is closed (after at most one pending wake-up).
	for range 2 {
		select {
		case _, ok := <-ch:
			if !ok {
				goto closed
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Watch channel not closed by Close")
		}
	}
	t.Fatal("Watch channel not closed by Close")
closed:
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Errorf("the caller's client was closed: %v", err)
	}
	if _, err := b.Inspect(ctx, "held"); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Inspect after Close = %v; want ErrClosed", err)
	}
}

// TestWatchClosedOnConnectionLoss: when the pub/sub connection dies, Watch
// channels close (the engine falls back to polling) and a later Watch
// works on a new connection.
func TestWatchClosedOnConnectionLoss(t *testing.T) {
	opt, err := goredis.ParseURL(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	name := uniquePrefix(t)
	opt.ClientName = name // to find this test's connections in CLIENT LIST
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	ctx := t.Context()
	b, err := fencelockredis.New(ctx, rdb, &fencelockredis.Options{Prefix: name})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ch, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	admin := goredis.NewClient(&goredis.Options{Addr: opt.Addr, DB: opt.DB, Username: opt.Username, Password: opt.Password})
	defer admin.Close()
	killed := 0
	for _, line := range strings.Split(admin.ClientList(ctx).Val(), "\n") {
		if !strings.Contains(line, " name="+name+" ") || strings.Contains(line, " sub=0 ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok && admin.ClientKillByFilter(ctx, "ID", id).Err() == nil {
				killed++
			}
		}
	}
	if killed == 0 {
		t.Fatal("no pub/sub connection found in CLIENT LIST")
	}
	select {
	case _, ok := <-ch:
		if ok {
			if _, ok := <-ch; ok {
				t.Fatal("channel not closed")
			}
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Watch channel not closed after its connection was killed")
	}
	g := acquire(t, b, "k", "o", time.Minute)
	ch2, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch2:
	case <-time.After(5 * time.Second):
		t.Fatal("Watch after reconnect not woken")
	}
}

// TestTestenvServerHasNoWarnings: the test server started by
// scripts/testenv (AOF, appendfsync always, noeviction, no replicas) is
// described without warnings.
func TestTestenvServerHasNoWarnings(t *testing.T) {
	if os.Getenv("FENCELOCK_TESTENV_STATE") == "" {
		t.Skip("not a scripts/testenv server")
	}
	b, _ := open(t)
	if w := b.Describe().Warnings; len(w) != 0 {
		t.Errorf("warnings for a durable server: %q", w)
	}
}

// ---- private servers: settings the shared test server does not have ----

type server struct {
	t    *testing.T
	bin  string
	args []string
	dir  string
	port int
	cmd  *exec.Cmd
}

// startServer runs a private redis-server with extra config lines on a
// free loopback port, stopped (by PID) at the end of the test.
func startServer(t *testing.T, conf ...string) *server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if testenv.IsCI() {
			t.Fatal("redis-server not on PATH: under CI every server must be installed (scripts/install-servers)")
		}
		t.Skip("redis-server not on PATH: private-server case not run")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	cfg := strings.Join(append([]string{
		"port " + strconv.Itoa(port), "bind 127.0.0.1", "dir " + dir, "daemonize no", "logfile " + filepath.Join(dir, "log"),
	}, conf...), "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "redis.conf"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, bin: bin, args: []string{filepath.Join(dir, "redis.conf")}, dir: dir, port: port}
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *server) start() {
	s.t.Helper()
	if err := s.startErr(); err != nil {
		s.t.Fatal(err)
	}
}

// startErr starts the server and waits until it answers PING.
func (s *server) startErr() error {
	s.cmd = exec.Command(s.bin, s.args...)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: s.addr(), MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(20 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
			return fmt.Errorf("private redis-server did not start:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// kill is kill -9.
func (s *server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }
func (s *server) url() string  { return "redis://" + s.addr() + "/0" }

func hasWarning(ws []string, sub string) bool {
	for _, w := range ws {
		if strings.Contains(w, sub) {
			return true
		}
	}
	return false
}

// TestRestartWithoutPersistenceLosesTokens shows what the conformance
// suite's restart case would find on a Redis without persistence: after a
// kill -9 and restart the counter is gone and tokens start again from 1.
// The backend said so beforehand.
func TestRestartWithoutPersistenceLosesTokens(t *testing.T) {
	s := startServer(t, `save ""`, "appendonly no")
	ctx := t.Context()
	b, err := fencelockredis.Open(ctx, s.url())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if w := b.Describe().Warnings; !hasWarning(w, "no persistence") {
		t.Errorf("warnings %q do not mention the missing persistence", w)
	}
	var last driver.Token
	for range 3 {
		g := acquire(t, b, "k", "o", time.Minute)
		last = g.Token
		if err := b.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	s.kill()
	s.start()
	var g driver.Grant
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err = b.Acquire(ctx, driver.AcquireRequest{Key: "k", Owner: "o2", TTL: time.Minute})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if g.Token > last {
		t.Fatalf("token %d after restart is above %d: persistence was not off?", g.Token, last)
	}
	t.Logf("without persistence the token went from %d to %d across a restart, as the warning said", last, g.Token)
}

func TestWarnings(t *testing.T) {
	for _, tc := range []struct {
		name string
		conf []string
		want []string
	}{
		{"eviction", []string{"appendonly yes", "appendfsync always", "maxmemory 100mb", "maxmemory-policy allkeys-lru"}, []string{"allkeys-lru"}},
		{"volatile", []string{"appendonly yes", "appendfsync always", "maxmemory-policy volatile-ttl"}, []string{"volatile-ttl"}},
		{"everysec", []string{"appendonly yes", "appendfsync everysec"}, []string{"appendfsync everysec"}},
		{"rdb", []string{"appendonly no", "save 60 1"}, []string{"RDB snapshots only"}},
		{"config disabled", []string{`rename-command CONFIG ""`}, []string{"could not read the server's configuration"}},
		{"durable", []string{"appendonly yes", "appendfsync always", `save ""`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, tc.conf...)
			b, err := fencelockredis.Open(t.Context(), s.url())
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			ws := b.Describe().Warnings
			for _, w := range tc.want {
				if !hasWarning(ws, w) {
					t.Errorf("warnings %q lack %q", ws, w)
				}
			}
			if tc.want == nil && len(ws) != 0 {
				t.Errorf("warnings for a durable server: %q", ws)
			}
		})
	}
}

// TestReplicaWarning: a primary with a connected replica is reported as
// asynchronously replicated.
func TestReplicaWarning(t *testing.T) {
	primary := startServer(t, "appendonly yes", "appendfsync always")
	startServer(t, "replicaof 127.0.0.1 "+strconv.Itoa(primary.port))
	rdb := goredis.NewClient(&goredis.Options{Addr: primary.addr()})
	defer rdb.Close()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(rdb.Info(t.Context(), "replication").Val(), "connected_slaves:1") {
		if time.Now().After(deadline) {
			t.Fatal("replica did not connect")
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, err := fencelockredis.New(t.Context(), rdb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ws := b.Describe().Warnings; !hasWarning(ws, "replication is asynchronous") {
		t.Errorf("warnings %q lack the replication warning", ws)
	}
}
