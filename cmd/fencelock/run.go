package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
)

const runUsage = `
Usage: fencelock run [flags] KEY -- COMMAND [ARG...]

Acquire the lock KEY (waiting while someone else holds it, unless --no-wait),
run COMMAND while holding it, release it when COMMAND exits, and exit with
COMMAND's exit status. The lease is renewed in the background (every TTL/3).
COMMAND gets these environment variables:

  FENCELOCK_KEY     the lock's key
  FENCELOCK_TOKEN   the fencing token: a number that strictly increases with
                    every grant of KEY; pass it with every write to the
                    protected resource, which should refuse tokens lower
                    than the highest it has seen
  FENCELOCK_OWNER   the holder's name, as 'fencelock status' shows it

If the lease is lost while COMMAND runs (the store no longer has it, or it
could not be renewed in time), COMMAND gets SIGTERM, then SIGKILL after
--grace, and fencelock exits with status 79. Signals sent to fencelock
(INT, TERM, HUP, QUIT, USR1, USR2) are forwarded to COMMAND. The lock is
released on every exit path. COMMAND runs in its own process group (so a lost
lease stops its children too), except when fencelock's stdin is a terminal:
then it stays in fencelock's group so that it can use the terminal, and
terminal-generated INT and QUIT reach it directly rather than being forwarded.

Exit status:
  N       COMMAND exited with status N
  128+N   COMMAND was killed by signal N
  64      usage error (bad flags, bad key, bad URL or unknown URL scheme)
  69      the backend cannot be opened or reached, or failed
  75      the lock was not acquired: held by someone else (--no-wait), or
          --timeout passed
  79      the lease was lost while COMMAND ran; COMMAND was terminated (or had
          already finished, but not exclusively)
  126     COMMAND is not executable
  127     COMMAND was not found
`

const runExamples = `Examples:
  # Only one backup at a time on this machine (embedded file backend):
  fencelock run backup -- ./backup.sh --full

  # Skip this cron run if the previous one still holds the lock:
  fencelock run --no-wait jobs/nightly -- make nightly || [ $? -eq 75 ]

  # Across machines, via Redis, waiting at most a minute:
  fencelock run --url redis://redis.internal:6379 --timeout 1m deploy/web -- ./deploy.sh

  # Pass the fencing token on to the resource:
  fencelock run accounts/1 -- sh -c 'psql -v ON_ERROR_STOP=1 -v token="$FENCELOCK_TOKEN" -v owner="$FENCELOCK_OWNER" -f write.sql'  # write.sql: docs/fencing.md`

func cmdRun(e *env, args []string) int {
	fset := e.flagSet("run", runUsage, runExamples)
	var cf connFlags
	addConnFlags(fset, &cf)
	ttl := fset.Duration("ttl", 0, "lease time to live `D`: how long the lock outlives a crashed fencelock\n(default 15s, or the URL's ttl parameter)")
	fset.Bool("wait", true, "wait while someone else holds KEY (the default)")
	noWait := fset.Bool("no-wait", false, "do not wait: exit 75 at once if KEY is held")
	timeout := fset.Duration("timeout", 0, "stop waiting after `D` and exit 75 (default: wait as long as it takes)")
	grace := fset.Duration("grace", 10*time.Second, "after a lost lease, wait `D` between SIGTERM and SIGKILL")
	summary := fset.Bool("summary", false, "on exit, print one line to stderr: token, wait and hold time, renewals,\nrenewal failures, danger-zone entries, and how the lease ended")
	pos, argv, exit, stop := e.parse(fset, args, 1)
	if stop {
		return exit
	}
	explicit := map[string]bool{}
	fset.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	switch {
	case len(pos) == 0:
		return e.usageError("run", "missing KEY and COMMAND")
	case len(argv) == 0:
		return e.usageError("run", "missing COMMAND (fencelock run KEY -- COMMAND [ARG...])")
	case explicit["wait"] && *noWait:
		return e.usageError("run", "--wait and --no-wait are exclusive")
	case *noWait && explicit["timeout"]:
		return e.usageError("run", "--timeout applies to waiting; it makes no sense with --no-wait")
	case *timeout < 0 || *grace < 0 || *ttl < 0:
		return e.usageError("run", "durations must not be negative")
	}
	key := pos[0]
	if err := driver.ValidateKey(key); err != nil {
		return e.usageError("run", "%v", err)
	}
	u := e.parsedURL(&cf)

	// Signals: from here on, fencelock handles them. Before COMMAND
	// starts, a terminating signal abandons the wait.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	stopWatcher := sync.OnceFunc(func() {
		close(stopWatch)
		<-watchDone
	})
	defer stopWatcher()
	go func() {
		defer close(watchDone)
		for {
			select {
			case s := <-sigs:
				if terminating(s) {
					cancel(&signalError{s})
					return
				}
			case <-stopWatch:
				return
			}
		}
	}()
	// interrupted reports the signal that abandoned the wait, if any.
	interrupted := func() (int, bool) {
		var se *signalError
		if errors.As(context.Cause(ctx), &se) {
			return 128 + signalNumber(se.sig), true
		}
		return 0, false
	}
	if u != nil && strings.EqualFold(u.Scheme, "mem") {
		fmt.Fprintf(e.stderr, "fencelock run: warning: mem:// locks live inside this fencelock process only: they exclude no other process\n")
	}
	opts := &fencelock.Options{TTL: *ttl}
	if *summary {
		sum := newRunSummary(key)
		opts.Observer = sum
		// Registered before c.Close's defer, so it runs after it and sees
		// the release.
		defer sum.print(e.stderr, func(s string) string { return scrub(s, u) })
	}
	if u != nil && strings.EqualFold(u.Scheme, "file") {
		// Polling the file backend costs a local file read: poll often
		// for a prompt hand-over where inotify (Linux) is unavailable.
		opts.MaxBackoff = 100 * time.Millisecond
	}
	c, err := e.open(ctx, &cf, opts, key)
	if err != nil {
		if code, ok := interrupted(); ok {
			return code
		}
		return e.fail("run", err, u)
	}
	defer c.Close()

	// Acquire.
	var l *fencelock.Lease
	if *noWait {
		l, err = c.TryAcquire(ctx, key)
	} else {
		actx, acancel := ctx, context.CancelFunc(func() {})
		if *timeout > 0 {
			actx, acancel = context.WithTimeout(ctx, *timeout)
		}
		l, err = c.Acquire(actx, key)
		if err != nil && ctx.Err() == nil && actx.Err() != nil {
			acancel()
			holder := ""
			ictx, icancel := context.WithTimeout(context.Background(), cf.connectTimeout)
			if info, ierr := c.Inspect(ictx, key); ierr == nil && info.Locked() {
				holder = fmt.Sprintf("; held by %s (token %d, %v left)", strconv.Quote(info.Owner), info.Token, info.Remaining.Round(time.Millisecond))
			}
			icancel()
			fmt.Fprintf(e.stderr, "fencelock run: gave up waiting for %s after %v (--timeout)%s\n", strconv.Quote(key), *timeout, holder)
			return exitNotAcquired
		}
		acancel()
	}
	if err != nil {
		if code, ok := interrupted(); ok {
			return code
		}
		switch {
		case errors.Is(err, fencelock.ErrNotAcquired):
			fmt.Fprintf(e.stderr, "fencelock run: %s; not waiting (--no-wait)\n", scrub(err.Error(), u))
			return exitNotAcquired
		}
		return e.fail("run", err, u)
	}
	// From now on signals are COMMAND's: stop the watcher first, so that
	// it eats none of them, and honour one that arrived meanwhile.
	stopWatcher()
	if code, ok := interrupted(); ok {
		rctx, rcancel := context.WithTimeout(context.Background(), c.Options().ReleaseTimeout)
		l.Release(rctx)
		rcancel()
		return code
	}
	return e.runChild(c, l, argv, sigs, *grace)
}

type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "interrupted by " + e.sig.String() }

// runChild runs argv while l is held and returns fencelock's exit status.
func (e *env) runChild(c *fencelock.Client, l *fencelock.Lease, argv []string, sigs chan os.Signal, grace time.Duration) int {
	releaseCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), c.Options().ReleaseTimeout)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = e.stdin, e.stdout, e.stderr
	cmd.Env = append(os.Environ(),
		"FENCELOCK_KEY="+l.Key(),
		"FENCELOCK_TOKEN="+strconv.FormatUint(uint64(l.Token()), 10),
		"FENCELOCK_OWNER="+l.Owner())
	group := !stdinIsTerminal()
	setProcAttr(cmd, group)
	if err := cmd.Start(); err != nil {
		rctx, rcancel := releaseCtx()
		l.Release(rctx)
		rcancel()
		fmt.Fprintf(e.stderr, "fencelock run: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotExec
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	var (
		lostErr error
		kill    <-chan time.Time
		leaseCh = l.Done()
	)
wait:
	for {
		select {
		case <-done:
			break wait
		case s := <-sigs:
			if group || !fromTerminal(s) {
				signalChild(cmd.Process, s, group)
			}
		case <-leaseCh:
			leaseCh = nil
			lostErr = l.Err()
			fmt.Fprintf(e.stderr, "fencelock run: %v\nfencelock run: stopping the command: SIGTERM now, SIGKILL in %v\n", lostErr, grace)
			signalChild(cmd.Process, sigTERM, group)
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			fmt.Fprintf(e.stderr, "fencelock run: the command did not stop within %v (--grace): SIGKILL\n", grace)
			signalChild(cmd.Process, sigKILL, group)
		}
	}
	if lostErr == nil {
		if err := l.Err(); err != nil {
			lostErr = err // lost at the very end
		}
	}
	if lostErr != nil {
		return exitLeaseLost
	}
	rctx, rcancel := releaseCtx()
	err := l.Release(rctx)
	rcancel()
	switch {
	case errors.Is(err, fencelock.ErrNotHeld):
		fmt.Fprintf(e.stderr, "fencelock run: when the command finished, the lock on %s was no longer held (token %d): the command may not have run exclusively\n", strconv.Quote(l.Key()), l.Token())
		return exitLeaseLost
	case err != nil:
		fmt.Fprintf(e.stderr, "fencelock run: warning: release failed (the lock expires with its TTL): %v\n", err)
	}
	return exitStatus(cmd.ProcessState)
}

func exitStatus(ps *os.ProcessState) int {
	if ps == nil {
		return exitSoftware
	}
	if n, ok := signaled(ps); ok {
		return 128 + n
	}
	return ps.ExitCode()
}
