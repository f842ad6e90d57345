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
	if mode == "stubborn" {
		select {}
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
