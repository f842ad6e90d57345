package suite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

// Commands are shell commands (run with sh -c) that act on a backend's
// server: the `fencelock safety --server-…` flags. Each must return once
// its action is done (a Pause once the server is stopped); after Kill
// (and Restart) and after Failover the suite waits until the backend
// answers again, up to ReadyTimeout. An empty command leaves its fault
// out.
type Commands struct {
	// Kill kills the server abruptly (kill -9, docker kill, systemctl
	// kill -s KILL …). With Restart it enables FaultServerKill.
	Kill string
	// Restart starts the killed server again with its data. Empty when
	// Kill's server comes back by itself (a supervisor restarts it).
	Restart string
	// Pause stops the server without closing its connections (kill
	// -STOP, docker pause); Resume continues it. Both enable
	// FaultServerPause.
	Pause, Resume string
	// Failover makes another member leader or primary (kill the leader
	// and start it again, SENTINEL FAILOVER, …): FaultFailover.
	Failover string
	// ReadyTimeout bounds the wait for the backend after Kill, Restart or
	// Failover. Default 2 minutes.
	ReadyTimeout time.Duration
}

// ErrCommand is returned (wrapped) when a control command fails.
var ErrCommand = errors.New("suite: control command failed")

// Control returns the Control that runs c's commands for the backend at
// rawURL (used to wait until it answers again), or nil if c has no
// command.
func (c Commands) Control(rawURL string) *Control {
	if c == (Commands{}) {
		return nil
	}
	ctl := &Control{Setup: map[string]string{}}
	if c.Kill != "" {
		ctl.Restart = func(ctx context.Context) error {
			if err := runCommand(ctx, "kill", c.Kill); err != nil {
				return err
			}
			if c.Restart != "" {
				if err := runCommand(ctx, "restart", c.Restart); err != nil {
					return err
				}
			}
			return c.awaitReady(ctx, rawURL)
		}
		ctl.Setup[FaultServerKill] = "server killed (--server-kill) and started again with its data"
		if c.Restart == "" {
			ctl.Setup[FaultServerKill] = "server killed (--server-kill); its supervisor starts it again"
		}
	}
	if c.Pause != "" && c.Resume != "" {
		ctl.Pause = func(ctx context.Context) error { return runCommand(ctx, "pause", c.Pause) }
		ctl.Resume = func(ctx context.Context) error { return runCommand(ctx, "resume", c.Resume) }
		ctl.Setup[FaultServerPause] = "server paused (--server-pause) for 2×TTL, then resumed (--server-resume)"
	}
	if c.Failover != "" {
		ctl.Failover = func(ctx context.Context) (string, error) {
			if err := runCommand(ctx, "failover", c.Failover); err != nil {
				return "", err
			}
			return "(--server-failover)", c.awaitReady(ctx, rawURL)
		}
		ctl.Setup[FaultFailover] = "--server-failover while locks are held"
	}
	return ctl
}

// runCommand runs one control command; its output goes into the error.
func runCommand(ctx context.Context, what, command string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		return fmt.Errorf("%w: %s command: %v: %s", ErrCommand, what, err, msg)
	}
	return nil
}

// awaitReady polls the backend (a fresh connection and an Inspect) every
// 100ms until it answers.
func (c Commands) awaitReady(ctx context.Context, rawURL string) error {
	bound := c.ReadyTimeout
	if bound <= 0 {
		bound = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		last = probe(ctx, rawURL)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("suite: the backend did not answer again within %v: %s", bound, driver.RedactText(last.Error(), rawURL))
		case <-tick.C:
		}
	}
}

// probe opens the backend and looks a key up once.
func probe(ctx context.Context, rawURL string) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	b, _, err := fencelock.OpenBackend(pctx, rawURL)
	if err != nil {
		return err
	}
	defer b.Close()
	_, err = b.Inspect(pctx, "fencelock-safety-ready-probe")
	return err
}
