// Package proc runs the safety harness's contender processes: it starts a
// re-execution of the running binary (see suite.MainIfContender) with a
// contender's configuration in its environment, streams the history
// events the process writes to stdout, sends it commands on stdin, and
// pauses (SIGSTOP), resumes (SIGCONT) and kills (SIGKILL) it, stamping
// those harness events with the system-wide monotonic clock.
//
// Every process is reaped: Wait, Stop and Kill return only after the
// process has exited and its output has been read to the end, and no
// goroutine of a Proc outlives that.
package proc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/internal/pause"
	"github.com/fencelock/fencelock/safety/history"
	"github.com/fencelock/fencelock/safety/mono"
)

// Spec says what to start.
type Spec struct {
	// Name is the process's name in events (history.Event.Proc).
	Name string
	// Path is the executable; default os.Args[0] (the running test
	// binary).
	Path string
	// Args are the arguments; default "-test.run=^$", so a test binary
	// whose TestMain does not take over runs no test.
	Args []string
	// Env is added to the harness's own environment.
	Env []string
}

// Sink receives a process's events, in the order the process wrote them.
// It is called from one goroutine per process, and also by Pause, Resume
// and Kill for the harness events they stamp; it must be safe for
// concurrent use when several processes share it.
type Sink func(history.Event)

// ErrExited is returned when a signal or command is sent to a process
// that has exited.
var ErrExited = errors.New("proc: process has exited")

// Proc is a running contender process. Its methods are safe for
// concurrent use.
type Proc struct {
	name string
	cmd  *exec.Cmd
	sink Sink

	inMu  sync.Mutex
	stdin io.WriteCloser // nil once closed

	stderr lockedBuffer
	exited chan struct{} // closed once the process is reaped and its output read
	err    error         // cmd.Wait's result, set before exited is closed
	killed bool          // guarded by inMu: Kill was called
}

// Start starts the process and begins streaming its events to sink.
func Start(spec Spec, sink Sink) (*Proc, error) {
	if spec.Name == "" {
		return nil, errors.New("proc: Spec.Name is empty")
	}
	path := spec.Path
	if path == "" {
		path = os.Args[0]
	}
	args := spec.Args
	if args == nil {
		args = []string{"-test.run=^$"}
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), spec.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// If the harness dies, so do its contenders (even stopped ones).
		Pdeathsig: syscall.SIGKILL,
	}
	p := &Proc{name: spec.Name, cmd: cmd, sink: sink, exited: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		stdin.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("proc: start %s: %w", spec.Name, err)
	}
	p.stdin = stdin
	go p.read(stdout)
	return p, nil
}

// read streams events until the process's stdout ends, then reaps it.
func (p *Proc) read(stdout io.Reader) {
	r := bufio.NewReaderSize(stdout, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var ev history.Event
			if jerr := json.Unmarshal(line, &ev); jerr != nil || ev.Kind == "" {
				// Not an event (a stray print): keep it for diagnostics.
				fmt.Fprintf(&p.stderr, "[stdout] %s", line)
			} else {
				if ev.Proc == "" {
					ev.Proc = p.name
				}
				p.sink(ev)
			}
		}
		if err != nil {
			break
		}
	}
	p.err = p.cmd.Wait()
	p.inMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.inMu.Unlock()
	close(p.exited)
}

// Name returns the process's name.
func (p *Proc) Name() string { return p.name }

// PID returns the process's ID.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited returns a channel that is closed once the process has exited,
// been reaped and its output read to the end.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Stderr returns what the process wrote to stderr (and any stdout line
// that was not an event).
func (p *Proc) Stderr() string { return p.stderr.String() }

// Send writes v to the process's stdin as one JSON line.
func (p *Proc) Send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return ErrExited
	}
	_, err = p.stdin.Write(append(b, '\n'))
	return err
}

func (p *Proc) signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return ErrExited
	default:
	}
	// The process cannot be reaped (its PID reused) before exited is
	// closed, which read does only after Wait.
	if err := p.cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return ErrExited
		}
		return err
	}
	return nil
}

// Pause stops the process with SIGSTOP, waits until the kernel reports it
// stopped, and emits a Pause event stamped then.
func (p *Proc) Pause(ctx context.Context) error {
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	if err := p.WaitStopped(ctx); err != nil {
		return err
	}
	p.sink(history.Event{T: mono.Now(), Proc: p.name, Kind: history.Pause, Note: "SIGSTOP"})
	return nil
}

// WaitStopped waits until the process is in the stopped state (after a
// SIGSTOP from the harness or from itself).
func (p *Proc) WaitStopped(ctx context.Context) error {
	select {
	case <-p.exited:
		return ErrExited
	default:
	}
	// The PID cannot be reused before exited is closed (see signal); stop
	// waiting then.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := pause.WaitStopped(ctx, p.PID())
	select {
	case <-p.exited:
		return ErrExited
	default:
	}
	if errors.Is(err, pause.ErrGone) {
		return ErrExited
	}
	return err
}

// State returns the process's state letter from /proc/PID/stat ('R',
// 'S', 'T', …).
func (p *Proc) State() (byte, error) {
	select {
	case <-p.exited:
		return 0, ErrExited
	default:
	}
	st, err := pause.Read(p.PID())
	if err != nil {
		return 0, err
	}
	return st.State, nil
}

// Resume continues a stopped process with SIGCONT, emitting a Resume
// event stamped just before the signal.
func (p *Proc) Resume() error {
	select {
	case <-p.exited:
		return ErrExited
	default:
	}
	p.sink(history.Event{T: mono.Now(), Proc: p.name, Kind: history.Resume, Note: "SIGCONT"})
	return p.signal(syscall.SIGCONT)
}

// Kill kills the process with SIGKILL (a crash: it cannot clean up),
// waits until it is reaped, and emits a Crash event stamped then, when
// the process certainly does nothing more.
func (p *Proc) Kill() error {
	p.inMu.Lock()
	p.killed = true
	p.inMu.Unlock()
	if err := p.signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.exited
	p.sink(history.Event{T: mono.Now(), Proc: p.name, Kind: history.Crash, Note: "SIGKILL"})
	return nil
}

// Stop asks the process to stop: it sends stop (if not nil) as a command,
// closes stdin, resumes the process in case it is paused, and waits for
// it to exit. If ctx ends first, the process is made to exit (SIGQUIT, for
// a Go process its goroutines' stacks on stderr; SIGKILL if it has not
// exited quitGrace later; no Crash event) and Stop returns an error
// saying so, naming what each goroutine of the process's own code was
// doing (see stuckGoroutines). Stop returns the process's exit error
// otherwise.
func (p *Proc) Stop(ctx context.Context, stop any) error {
	if stop != nil {
		_ = p.Send(stop)
	}
	p.inMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.inMu.Unlock()
	_ = p.signal(syscall.SIGCONT)
	select {
	case <-p.exited:
		return p.Wait()
	case <-ctx.Done():
	}
	// What it still waits for is the bug to find: a Go process writes
	// every goroutine's stack to stderr on SIGQUIT, and exits.
	_ = p.signal(syscall.SIGQUIT)
	grace := time.NewTimer(quitGrace)
	defer grace.Stop()
	select {
	case <-p.exited:
	case <-grace.C:
		_ = p.signal(syscall.SIGKILL)
		<-p.exited
	}
	stderr := p.Stderr()
	if stuck := stuckGoroutines(stderr, 20); stuck != "" {
		return fmt.Errorf("proc: %s did not stop in time and was killed (SIGQUIT): %w; its goroutines then:\n%s", p.name, ctx.Err(), stuck)
	}
	return fmt.Errorf("proc: %s did not stop in time and was killed: %w\n%s", p.name, ctx.Err(), tail(stderr, 20))
}

// quitGrace is how long Stop gives a process that did not stop in time to
// write its goroutines' stacks and exit after SIGQUIT before it kills it.
const quitGrace = 2 * time.Second

// stuckGoroutines summarises a Go goroutine dump (what a Go process writes
// on SIGQUIT) found in stderr: one line per goroutine running code outside
// the standard library, at most n, each with its state (what it waits for,
// and for how long when that is a minute or more) and its two innermost
// frames outside the standard library, innermost first. It returns "" if
// stderr holds no such goroutine.
func stuckGoroutines(stderr string, n int) string {
	var out []string
	more := 0
	for _, block := range strings.Split(stderr, "\n\n") {
		block = strings.TrimLeft(block, "\n")
		header, body, ok := strings.Cut(block, "\n")
		if !ok || !strings.HasPrefix(header, "goroutine ") {
			continue
		}
		id, _, _ := strings.Cut(strings.TrimPrefix(header, "goroutine "), " ")
		state := ""
		if i, j := strings.IndexByte(header, '['), strings.LastIndexByte(header, ']'); i >= 0 && j > i {
			state = header[i : j+1]
		}
		var frames []string
		for _, line := range strings.Split(body, "\n") {
			if line == "" || strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "created by ") {
				continue
			}
			fn := line
			if i := strings.LastIndexByte(fn, '('); i > 0 && strings.HasSuffix(fn, ")") {
				fn = fn[:i] // the arguments
			}
			if first, _, _ := strings.Cut(fn, "/"); strings.Contains(first, ".") && strings.Contains(fn, "/") {
				frames = append(frames, fn)
				if len(frames) == 2 {
					break
				}
			}
		}
		if len(frames) == 0 {
			continue
		}
		if len(out) == n {
			more++
			continue
		}
		out = append(out, fmt.Sprintf("goroutine %s %s: %s", id, state, strings.Join(frames, " <- ")))
	}
	if more > 0 {
		out = append(out, fmt.Sprintf("(%d more)", more))
	}
	return strings.Join(out, "\n")
}

// Wait waits for the process to exit and returns its exit error (nil for
// a zero exit status; nil too after Kill).
func (p *Proc) Wait() error {
	<-p.exited
	p.inMu.Lock()
	killed := p.killed
	p.inMu.Unlock()
	if killed {
		return nil
	}
	if p.err != nil {
		return fmt.Errorf("proc: %s: %w\n%s", p.name, p.err, tail(p.Stderr(), 20))
	}
	return nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// lockedBuffer is a bytes.Buffer safe for concurrent use, capped at 1 MiB
// (the oldest half is dropped).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := b.b.Len(); n > 1<<20 {
		rest := append([]byte("…\n"), b.b.Bytes()[n/2:]...)
		b.b.Reset()
		b.b.Write(rest)
	}
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
