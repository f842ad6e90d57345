package clustertest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	_ "github.com/fencelock/fencelock/backend/redis"
	"github.com/fencelock/fencelock/internal/testenv"
	gocronlock "github.com/fencelock/fencelock/kit/gocron"
	"github.com/go-co-op/gocron/v2"
	"github.com/redis/go-redis/v9"
)

// A child is one scheduler instance: the test binary re-executed with
// childEnv set to its mode ("locker" or "elector"). It runs a real gocron
// scheduler whose one job fires at every wall-clock second and records
// its run in Redis: INCR runKey(tick) and RPUSH logKey "tick pid", where
// tick is the second the run started in. It runs until its stdin
// closes (the parent ended it or died) or childLife passes.
const (
	childEnv  = "GOCRONLOCK_CLUSTER_CHILD"
	runEnv    = "GOCRONLOCK_CLUSTER_RUN"
	childLife = 90 * time.Second
	leaseTTL  = time.Second
)

func runKey(run string, tick int64) string {
	return "gocronlock-test:" + run + ":runs:" + strconv.FormatInt(tick, 10)
}
func logKey(run string) string { return "gocronlock-test:" + run + ":log" }

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		if err := child(mode, os.Getenv(runEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func child(mode, run string) error {
	ctx, cancel := context.WithTimeout(context.Background(), childLife)
	defer cancel()
	url := os.Getenv("FENCELOCK_TEST_REDIS")
	c, err := fencelock.Open(ctx, url, &fencelock.Options{TTL: leaseTTL})
	if err != nil {
		return err
	}
	defer c.Close()
	opt, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()

	var so gocron.SchedulerOption
	switch mode {
	case "locker":
		// Ticks a second apart; instances fire each within milliseconds
		// of the others: half a second of minimum hold lies between.
		so = gocron.WithDistributedLocker(gocronlock.NewLocker(c, &gocronlock.LockerOptions{
			Prefix: "gocronlock-test/" + run + "/", MinHold: 500 * time.Millisecond,
		}))
	case "elector":
		e, err := gocronlock.NewElector(c, "gocronlock-test/"+run+"/leader", nil)
		if err != nil {
			return err
		}
		defer e.Close()
		so = gocron.WithDistributedElector(e)
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	s, err := gocron.NewScheduler(so)
	if err != nil {
		return err
	}
	pid := strconv.Itoa(os.Getpid())
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
		// The cron fires at each second; the run belongs to the second it
		// fired in, however late the lock or the store let it start
		// (within the second).
		tick := time.Now().Truncate(time.Second).Unix()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rdb.Incr(rctx, runKey(run, tick))
		rdb.RPush(rctx, logKey(run), strconv.FormatInt(tick, 10)+" "+pid)
	}), gocron.WithName("tick"))
	if err != nil {
		return err
	}
	s.Start()
	fmt.Println("ready")
	stdin := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdin)
	}()
	select {
	case <-stdin:
	case <-ctx.Done():
	}
	return s.Shutdown()
}

type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// start starts n children in mode and waits until each has started its
// scheduler. They end when the test does.
func start(t *testing.T, mode, run string, n int) []*proc {
	t.Helper()
	var ps []*proc
	for range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+mode, runEnv+"="+run)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &proc{cmd: cmd, stdin: stdin}
		t.Cleanup(func() { p.stop() })
		ps = append(ps, p)
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "ready\n" {
			t.Fatalf("child %d: %q, %v", cmd.Process.Pid, line, err)
		}
	}
	return ps
}

func (p *proc) pid() string { return strconv.Itoa(p.cmd.Process.Pid) }

// stop ends the child: it closes stdin (the child shuts its scheduler
// down and resigns) and waits, killing it after a bound.
func (p *proc) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.stdin.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

type run struct {
	tick int64
	pid  string
}

func newRun(t *testing.T) (string, *redis.Client) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.URL(t, "FENCELOCK_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, _ := rdb.Keys(ctx, "gocronlock-test:"+id+":*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	})
	return id, rdb
}

// runs returns the runs recorded so far, in order.
func runs(t *testing.T, rdb *redis.Client, id string) []run {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	lines, err := rdb.LRange(ctx, logKey(id), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var rs []run
	for _, l := range lines {
		f := strings.Fields(l)
		tick, _ := strconv.ParseInt(f[0], 10, 64)
		rs = append(rs, run{tick, f[1]})
	}
	return rs
}

// waitRuns waits, within bound, until pred holds of the recorded runs,
// checking at each run (the job's own pace: one a second).
func waitRuns(t *testing.T, rdb *redis.Client, id string, bound time.Duration, what string, pred func([]run) bool) []run {
	t.Helper()
	deadline := time.Now().Add(bound)
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	for {
		rs := runs(t, rdb, id)
		if pred(rs) {
			return rs
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s did not happen; runs %v", bound, what, rs)
		}
		// BLPOP-free wait for the next run: the log grows once a second.
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// onceEach checks that no tick ran more than once across the cluster, and
// that every tick from the first to the last recorded one ran, except
// those handover says may have run nowhere (nil: none).
func onceEach(t *testing.T, rdb *redis.Client, id string, rs []run, handover func(tick int64) bool) {
	t.Helper()
	per := map[int64][]string{}
	for _, r := range rs {
		per[r.tick] = append(per[r.tick], r.pid)
	}
	ticks := slices.Sorted(func(yield func(int64) bool) {
		for k := range per {
			if !yield(k) {
				return
			}
		}
	})
	for _, tick := range ticks {
		if pids := per[tick]; len(pids) > 1 {
			t.Errorf("tick %d ran %d times, by pids %v", tick, len(pids), pids)
		}
		n, err := rdb.Get(t.Context(), runKey(id, tick)).Int()
		if err != nil || n != len(per[tick]) {
			t.Errorf("tick %d: counter %d (%v), log %d", tick, n, err, len(per[tick]))
		}
	}
	for i := 1; i < len(ticks); i++ {
		for gap := ticks[i-1] + 1; gap < ticks[i]; gap++ {
			if handover == nil || !handover(gap) {
				t.Errorf("tick %d ran nowhere", gap)
			}
		}
	}
}

func distinctTicks(rs []run) int {
	seen := map[int64]bool{}
	for _, r := range rs {
		seen[r.tick] = true
	}
	return len(seen)
}

// Three schedulers with the Locker run a job every second: each tick's
// run happens exactly once across them.
func TestLockerRunsEachTickOnceAcrossProcesses(t *testing.T) {
	id, rdb := newRun(t)
	ps := start(t, "locker", id, 3)
	rs := waitRuns(t, rdb, id, 30*time.Second, "eight ticks", func(rs []run) bool { return distinctTicks(rs) >= 8 })
	for _, p := range ps {
		p.stop()
	}
	rs = runs(t, rdb, id)
	onceEach(t, rdb, id, rs, nil)
	t.Logf("%d runs over %d ticks", len(rs), distinctTicks(rs))
}

// Two schedulers with the Elector: only the leader runs the job. When the
// leader is paused (SIGSTOP) past its lease's TTL, the other takes over
// and runs every tick once; the paused one, resumed, runs no job again
// while the other leads.
func TestElectorPausedLeaderStopsRunningJobs(t *testing.T) {
	id, rdb := newRun(t)
	ps := start(t, "elector", id, 2)
	rs := waitRuns(t, rdb, id, 20*time.Second, "three ticks", func(rs []run) bool { return distinctTicks(rs) >= 3 })
	leader := rs[len(rs)-1].pid
	var paused, other *proc
	for _, p := range ps {
		if p.pid() == leader {
			paused = p
		} else {
			other = p
		}
	}
	if paused == nil || other == nil {
		t.Fatalf("leader pid %s is none of the children's", leader)
	}
	if err := paused.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now().Unix()
	// The other instance takes over once the paused one's lease expires.
	waitRuns(t, rdb, id, 20*time.Second, "two ticks run by the other instance", func(rs []run) bool {
		n := 0
		for _, r := range rs {
			if r.pid == other.pid() {
				n++
			}
		}
		return n >= 2
	})
	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := len(runs(t, rdb, id))
	// Three more ticks after the resume, while the other instance leads.
	waitRuns(t, rdb, id, 20*time.Second, "three ticks after the resume", func(rs []run) bool { return len(rs) >= resumed+3 })
	for _, p := range ps {
		p.stop()
	}
	rs = runs(t, rdb, id)
	for _, r := range rs {
		if r.pid == paused.pid() && r.tick > stoppedAt+1 {
			t.Errorf("the paused leader (pid %s) ran tick %d after it was paused at %d and lost its lease", r.pid, r.tick, stoppedAt)
		}
	}
	// Between the pause and the other instance's first run, nobody is
	// leader: its lease has to expire first, and those ticks may run
	// nowhere (an elector trades them for never running one twice).
	tookOver := int64(math.MaxInt64)
	for _, r := range rs {
		if r.pid == other.pid() && r.tick >= stoppedAt && r.tick < tookOver {
			tookOver = r.tick
		}
	}
	onceEach(t, rdb, id, rs, func(tick int64) bool { return tick >= stoppedAt-1 && tick < tookOver })
}
