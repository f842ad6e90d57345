package proc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/mono"
)

const childEnv = "PROC_TEST_CHILD"

// TestMain doubles as the child program: with PROC_TEST_CHILD set it
// writes a stray line and a hello event, then echoes every stdin line as
// an event until "exit N" or the end of stdin (mode "stubborn": it then
// keeps running).
func TestMain(m *testing.M) {
	if mode, ok := os.LookupEnv(childEnv); ok {
		child(mode)
		return
	}
	goleak.VerifyTestMain(m)
}

func child(mode string) {
	emit := func(note string) {
		fmt.Printf(`{"t":%d,"kind":"stale_op","note":%q}`+"\n", mono.Now(), note)
	}
	fmt.Println("a stray line that is not an event")
	emit("hello")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		line := sc.Text()
		var code int
		if _, err := fmt.Sscanf(line, `"exit %d"`, &code); err == nil {
			os.Exit(code)
		}
		emit(line)
	}
	switch mode {
	case "stubborn":
		select {}
	case "stuck":
		var mu sync.Mutex
		mu.Lock()
		go stuckOnLock(&mu)
		for {
			time.Sleep(time.Hour) // a timer pending: not a deadlock the runtime ends
		}
	}
	os.Exit(0)
}

// collector is a Sink that lets a test await events.
type collector struct {
	mu   sync.Mutex
	evs  []history.Event
	more chan struct{}
}

func newCollector() *collector { return &collector{more: make(chan struct{})} }

func (c *collector) sink(ev history.Event) {
	c.mu.Lock()
	c.evs = append(c.evs, ev)
	close(c.more)
	c.more = make(chan struct{})
	c.mu.Unlock()
}

func (c *collector) events() []history.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]history.Event(nil), c.evs...)
}

// await waits until an event matches, for at most d.
func (c *collector) await(t *testing.T, d time.Duration, what string, match func(history.Event) bool) history.Event {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		for _, ev := range c.evs {
			if match(ev) {
				c.mu.Unlock()
				return ev
			}
		}
		more := c.more
		c.mu.Unlock()
		select {
		case <-more:
		case <-deadline.C:
			t.Fatalf("no %s event within %v; got %+v", what, d, c.events())
		}
	}
}

func note(n string) func(history.Event) bool {
	return func(ev history.Event) bool { return ev.Note == n }
}

func kind(k history.Kind) func(history.Event) bool {
	return func(ev history.Event) bool { return ev.Kind == k }
}

func start(t *testing.T, mode string) (*Proc, *collector) {
	t.Helper()
	c := newCollector()
	p, err := Start(Spec{Name: "c1", Env: []string{childEnv + "=" + mode}}, c.sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Stop(ctx, nil)
	})
	c.await(t, 20*time.Second, "hello", note("hello"))
	return p, c
}

// TestEventsAndCommands: events arrive in order with the process's name,
// commands reach the process, a stray line goes to Stderr, and Stop ends
// the process cleanly.
func TestEventsAndCommands(t *testing.T) {
	p, c := start(t, "")
	if err := p.Send("ping"); err != nil {
		t.Fatal(err)
	}
	c.await(t, 10*time.Second, "echo", note(`"ping"`))
	for _, ev := range c.events() {
		if ev.Proc != "c1" {
			t.Fatalf("event without the process's name: %+v", ev)
		}
	}
	if !strings.Contains(p.Stderr(), "a stray line") {
		t.Fatalf("stray stdout line not kept: %q", p.Stderr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Send("late"); !errors.Is(err, ErrExited) {
		t.Fatalf("Send after exit: %v", err)
	}
}

// TestPauseResume: a paused process is stopped (kernel state T) and does
// not act on a command until resumed; Pause and Resume are recorded in
// that order around the delayed echo.
func TestPauseResume(t *testing.T) {
	p, c := start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := p.State(); err != nil || (st != 'T' && st != 't') {
		t.Fatalf("state after Pause: %c, %v", st, err)
	}
	if err := p.Send("while-paused"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // watching for an echo that must not come
	for _, ev := range c.events() {
		if ev.Note == `"while-paused"` {
			t.Fatal("a paused process answered")
		}
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	echo := c.await(t, 10*time.Second, "echo", note(`"while-paused"`))
	pause := c.await(t, time.Second, "pause", kind(history.Pause))
	resume := c.await(t, time.Second, "resume", kind(history.Resume))
	if !(pause.T < resume.T && resume.T < echo.T) {
		t.Fatalf("order: pause %d resume %d echo %d", pause.T, resume.T, echo.T)
	}
}

// TestKill: the Crash event is stamped after the process's last event,
// the process is reaped, and Wait reports no error for a kill.
func TestKill(t *testing.T) {
	p, c := start(t, "")
	if err := p.Send("before"); err != nil {
		t.Fatal(err)
	}
	before := c.await(t, 10*time.Second, "echo", note(`"before"`))
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	default:
		t.Fatal("Kill returned before the process was reaped")
	}
	crash := c.await(t, time.Second, "crash", kind(history.Crash))
	if crash.T <= before.T || crash.Proc != "c1" {
		t.Fatalf("crash %+v not after the last event %+v", crash, before)
	}
	if err := p.Wait(); err != nil {
		t.Fatalf("Wait after Kill: %v", err)
	}
	if err := p.Kill(); !errors.Is(err, ErrExited) {
		t.Fatalf("second Kill: %v", err)
	}
}

// TestKillPaused: a stopped process dies from SIGKILL too.
func TestKillPaused(t *testing.T) {
	p, _ := start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
}

// TestStopKillsStubborn: a process that does not exit when stdin ends is
// killed when Stop's context ends, and Stop says so.
func TestStopKillsStubborn(t *testing.T) {
	p, _ := start(t, "stubborn")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := p.Stop(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Stop of a stubborn process: %v", err)
	}
	<-p.Exited()
}

// stuckOnLock waits for mu for good (the child's "stuck" mode).
func stuckOnLock(mu *sync.Mutex) {
	mu.Lock()
}

// TestStopNamesWhatTheProcessWaitsFor: Stop of a Go process that does not
// stop in time says what its goroutines were waiting in (from its
// SIGQUIT dump): here the child's goroutine waiting for a lock for good.
func TestStopNamesWhatTheProcessWaitsFor(t *testing.T) {
	p, _ := start(t, "stuck")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := p.Stop(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "did not stop in time") {
		t.Fatalf("Stop of a stuck process: %v; want it killed", err)
	}
	if want := "proc.stuckOnLock"; !strings.Contains(err.Error(), want) {
		t.Errorf("Stop of a stuck process: %v; want it to name the goroutine's wait (%s)", err, want)
	}
}

func TestStuckGoroutines(t *testing.T) {
	dump := `SIGQUIT: quit
PC=0x47a1c1 m=0 sigcode=0

goroutine 0 gp=0x9a4f60 m=0 mp=0x9a5e60 [idle]:
runtime.futex(0x9a5fa0, 0x80, 0x0)
	/usr/local/go/src/runtime/sys_linux_amd64.s:557 +0x21 fp=0x7ffc sp=0x7ffc pc=0x47a1c1

goroutine 1 gp=0xc000002380 m=nil [chan receive]:
runtime.gopark(0x0?, 0x0?, 0x0?, 0x0?, 0x0?)
	/usr/local/go/src/runtime/proc.go:435 +0xce
github.com/fencelock/fencelock/safety/contender.Main({{0xc0000ac000, 0x3}, {0x0, 0x0}}, {0xa2b0c0, 0xc00005e020}, {0xa2b0e0, 0xc00005e028})
	/src/safety/contender/contender.go:305 +0x3a5

goroutine 37 gp=0xc0001a2000 m=nil [sync.Mutex.Lock, 5 minutes]:
sync.runtime_SemacquireMutex(0xc0001c8004?, 0x0?, 0x0?)
	/usr/local/go/src/runtime/sema.go:95 +0x25
sync.(*Mutex).Lock(...)
	/usr/local/go/src/sync/mutex.go:46
github.com/fencelock/fencelock/recipe.(*RWGrant).Token(0xc0001c8000)
	/src/recipe/rwlock.go:866 +0x45
github.com/fencelock/fencelock/safety/contender.(*worker).upgradeRound.func1()
	/src/safety/contender/prims.go:189 +0x12c
created by github.com/fencelock/fencelock/safety/contender.(*worker).upgradeRound in goroutine 20
	/src/safety/contender/prims.go:182 +0x6b5

goroutine 5 gp=0xc000003c00 m=nil [select]:
runtime.gopark(0x0?, 0x0?, 0x0?, 0x0?, 0x0?)
	/usr/local/go/src/runtime/proc.go:435 +0xce
time.Sleep(0x3b9aca00)
	/usr/local/go/src/runtime/time.go:338 +0x165
`
	want := "goroutine 1 [chan receive]: github.com/fencelock/fencelock/safety/contender.Main\n" +
		"goroutine 37 [sync.Mutex.Lock, 5 minutes]: github.com/fencelock/fencelock/recipe.(*RWGrant).Token <- github.com/fencelock/fencelock/safety/contender.(*worker).upgradeRound.func1"
	if got := stuckGoroutines(dump, 20); got != want {
		t.Errorf("stuckGoroutines =\n%s\nwant\n%s", got, want)
	}
	if got, want := stuckGoroutines(dump, 1), "goroutine 1 [chan receive]: github.com/fencelock/fencelock/safety/contender.Main\n(1 more)"; got != want {
		t.Errorf("stuckGoroutines, at most 1 =\n%s\nwant\n%s", got, want)
	}
	if got := stuckGoroutines("panic: boom\n", 20); got != "" {
		t.Errorf("stuckGoroutines of no dump = %q; want empty", got)
	}
}

// TestExitStatus: a non-zero exit is reported by Wait.
func TestExitStatus(t *testing.T) {
	p, _ := start(t, "")
	if err := p.Send("exit 3"); err != nil {
		t.Fatal(err)
	}
	err := p.Wait()
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Wait: %v", err)
	}
}
