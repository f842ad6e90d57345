//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/safety/report"
	"github.com/fencelock/fencelock/safety/suite"
)

// Exit status of safety when the report fails: a cell is UNSAFE-UNEXPECTED
// or a negative control was not caught.
const exitSafetyFailed = 1

const safetyUsage = `
Usage: fencelock safety --url URL [--url URL ...] [flags]

Run the safety suite's fault matrix against your own servers: real contender
processes (re-executions of this binary) take turns on lock keys, write to a
fenced resource, and get faults injected one at a time; every cell's history
is checked for the properties P1-P8 and classified (safe, safe-with-fencing,
unsafe-expected, UNSAFE-UNEXPECTED), as in docs/safety.md. See
docs/safety-suite.md, "Run it against your own servers".

--url may be given several times, as URL or NAME=URL (NAME is the backend's
row in the report; default the backend's name). The --server-* flags apply to
the --url before them. Faults that need nothing from you always run (holder
pause and kill, network faults through a proxy in front of the URL's
host:port, stale release/renew, rotation); server faults run only with the
commands for them, and are otherwise listed in the report as not run, with
the reason:
  server-kill   --server-kill (and --server-restart unless a supervisor
                restarts it)
  server-pause  --server-pause and --server-resume
  failover      --server-failover
redis-flushall runs only when named in --faults: it deletes every key of the
Redis server.

The report goes to --out as safety.md and safety.json; the history of every
cell that failed is kept in --out/histories. The seed is printed first:
--seed reruns the same choices. No secret of a URL is printed or written.

Exit status: 0 every cell as expected, 1 a cell is UNSAFE-UNEXPECTED (or a
negative control was not caught), 64 usage error, 69 a backend cannot be
opened, 70 a cell could not run to the end or --timeout ran out.
`

const safetyExamples = `Examples:
  fencelock safety --url redis://localhost:6390 --url postgres://localhost:5440/locks
  fencelock safety --url redis://localhost:6390 \
      --server-kill 'kill -9 $(cat /tmp/r/redis.pid)' --server-restart 'redis-server /tmp/r/redis.conf' \
      --faults default,redis-flushall --rounds 3 --out ./safety-report
  fencelock safety --url ours=ourstore://db1:7000 --expect expect.json --timeout 20m

The --expect file is a JSON array of rules; the first matching rule wins, and
yours come before the built-in ones:
  [{"backend": "redis", "fault": "server-kill",
    "expectation": {"unsafe": true, "properties": ["P1", "P2"],
                    "why": "no appendfsync always on this server", "fix": "appendfsync always"}}]`

// backendFlags collects --url and the --server-* flags that follow it.
type backendFlags struct {
	backends []suite.Backend
	cmds     []suite.Commands
}

var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]*$`)

func (b *backendFlags) addURL(v string) error {
	var name string
	if i := strings.Index(v, "="); i > 0 && !strings.Contains(v[:i], "://") && nameRE.MatchString(v[:i]) {
		name, v = v[:i], v[i+1:]
	}
	if v == "" {
		return errors.New("empty URL")
	}
	b.backends = append(b.backends, suite.Backend{Name: name, URL: v})
	b.cmds = append(b.cmds, suite.Commands{})
	return nil
}

// set returns a flag function that stores a --server-* command on the
// last --url.
func (b *backendFlags) set(flagName string, field func(*suite.Commands) *string) func(string) error {
	return func(v string) error {
		if len(b.backends) == 0 {
			return fmt.Errorf("--%s must follow the --url it applies to", flagName)
		}
		p := field(&b.cmds[len(b.cmds)-1])
		if *p != "" {
			return fmt.Errorf("--%s given twice for one --url", flagName)
		}
		*p = v
		return nil
	}
}

func cmdSafety(e *env, args []string) int {
	fs := e.flagSet("safety", safetyUsage, safetyExamples)
	var bf backendFlags
	fs.Func("url", "a backend `URL` or NAME=URL (repeatable; required)", bf.addURL)
	fs.Func("server-kill", "shell `command` that kills the server of the last --url abruptly (kill -9, docker kill)",
		bf.set("server-kill", func(c *suite.Commands) *string { return &c.Kill }))
	fs.Func("server-restart", "shell `command` that starts the killed server again with its data",
		bf.set("server-restart", func(c *suite.Commands) *string { return &c.Restart }))
	fs.Func("server-pause", "shell `command` that pauses the server (kill -STOP, docker pause)",
		bf.set("server-pause", func(c *suite.Commands) *string { return &c.Pause }))
	fs.Func("server-resume", "shell `command` that resumes the paused server (kill -CONT, docker unpause)",
		bf.set("server-resume", func(c *suite.Commands) *string { return &c.Resume }))
	fs.Func("server-failover", "shell `command` that moves leadership to another member",
		bf.set("server-failover", func(c *suite.Commands) *string { return &c.Failover }))
	faults := fs.String("faults", "", "comma-separated `faults` and groups (default, mutants, redis-eviction, members); without it, the group default: every fault\nbut redis-flushall, the mutants, the redis-evict-… and the member-… cells. Faults: "+strings.Join(suite.AllFaults(), ", "))
	rounds := fs.Int("rounds", 1, "fault rounds per cell (holder-pause: twice this)")
	seed := fs.Int64("seed", 0, "seed of the run; 0 picks one (printed first)")
	out := fs.String("out", "", "report `dir` (default ./fencelock-safety-TIME)")
	expect := fs.String("expect", "", "expectation table, a JSON `file` (see below)")
	timeout := fs.Duration("timeout", 0, "bound on the whole run; cells not started in time are listed as not run (0: none)")
	baseline := fs.Duration("baseline", 5*time.Second, "how long the fault-free cell runs")
	ttl := fs.Duration("ttl", 0, "lease TTL of every backend (default 1s, 2s for etcd)")
	pos, rest, exit, stop := e.parse(fs, args, 0)
	if stop {
		return exit
	}
	if len(pos) != 0 || len(rest) != 0 {
		return e.usageError("safety", "takes no arguments")
	}
	if len(bf.backends) == 0 {
		return e.usageError("safety", "--url is required")
	}
	for _, b := range bf.backends {
		if err := unusableURL(b.URL); err != nil {
			// A URL no backend can use is a usage error (64), as for
			// every other command, found before any report is written.
			return e.usageError("safety", "--url: %s", oneLine(driver.RedactText(err.Error(), b.URL)))
		}
	}
	var urls []string
	for _, b := range bf.backends {
		urls = append(urls, b.URL)
	}
	red := func(s string) string {
		for _, u := range urls {
			s = driver.RedactText(s, u)
		}
		return s
	}
	cfg := suite.Config{
		Rounds:    *rounds,
		Seed:      *seed,
		Baseline:  *baseline,
		Timeout:   *timeout,
		Repro:     "fencelock safety --url '<URL of {backend}>' --faults {fault} --seed {seed}",
		ReproHint: "Each cell reruns alone with its seed (give the backend's URL, and its --server-* commands, again):",
		EnvURLs:   true,
		Logf: func(format string, args ...any) {
			fmt.Fprintf(e.stderr, "fencelock safety: %s\n", red(fmt.Sprintf(format, args...)))
		},
	}
	if *faults != "" {
		for _, f := range strings.Split(*faults, ",") {
			cfg.Faults = append(cfg.Faults, strings.TrimSpace(f))
		}
	}
	if *rounds < 1 {
		return e.usageError("safety", "--rounds must be at least 1")
	}
	if *ttl < 0 {
		return e.usageError("safety", "--ttl must be positive")
	}
	for i, b := range bf.backends {
		b.TTL = *ttl
		b.Control = bf.cmds[i].Control(b.URL)
		cfg.Backends = append(cfg.Backends, b)
	}
	if *expect != "" {
		t, err := readExpect(*expect)
		if err != nil {
			return e.usageError("safety", "--expect: %v", err)
		}
		cfg.Expect = t
	}
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()&(1<<53-1) | 1
	}
	cfg.OutDir = *out
	if cfg.OutDir == "" {
		cfg.OutDir = "fencelock-safety-" + time.Now().UTC().Format("20060102-150405")
	}
	fmt.Fprintf(e.stderr, "fencelock safety: seed %d (rerun with --seed %d); report in %s\n", cfg.Seed, cfg.Seed, cfg.OutDir)

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	rep, err := suite.Run(ctx, cfg)
	if errors.Is(err, suite.ErrConfig) {
		return e.usageError("safety", "%s", red(err.Error()))
	}
	printSafety(e, rep, cfg.OutDir)
	switch {
	case rep.Failed():
		fmt.Fprintf(e.stderr, "fencelock safety: the report FAILS (seed %d):\n", rep.Seed)
		for _, p := range rep.Problems() {
			fmt.Fprintf(e.stderr, "  %s\n", red(p))
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "fencelock safety: %s\n", red(err.Error()))
		}
		return exitSafetyFailed
	case errors.Is(err, suite.ErrBackend):
		fmt.Fprintf(e.stderr, "fencelock safety: %s\n", red(err.Error()))
		return exitUnavailable
	case err != nil:
		fmt.Fprintf(e.stderr, "fencelock safety: %s\n", red(err.Error()))
		return exitSoftware
	}
	return exitOK
}

// readExpect reads an expectation table: a JSON array of report.Rule.
func readExpect(path string) (report.Table, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var t report.Table
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, r := range t {
		if r.Backend == "" || r.Fault == "" {
			return nil, fmt.Errorf("%s: rule %d: backend and fault are required (\"*\" matches any)", path, i+1)
		}
	}
	return t, nil
}

// printSafety prints the verdict of every cell, what did not run, and
// where the report is.
func printSafety(e *env, rep report.Report, dir string) {
	tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tFAULT\tVERDICT\tACQUISITIONS\tWRITES\tSTALE ATTEMPTED/ACCEPTED")
	for _, c := range rep.Cells {
		s := c.Result.Stats
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d/%d\n", c.Backend, c.Fault, c.Verdict, s.Acquisitions, s.Writes, s.StaleAttempted, s.StaleAccepted)
	}
	for _, n := range rep.NotRun {
		fmt.Fprintf(tw, "%s\t%s\tnot run\t\t\t%s\n", n.Backend, n.Fault, n.Why)
	}
	tw.Flush()
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	fmt.Fprintf(e.stdout, "report: %s, %s\n", filepath.Join(abs, "safety.md"), filepath.Join(abs, "safety.json"))
}

// safetyContender runs this process as a contender of `fencelock safety`
// and exits, if it is one (suite.MainIfContender): main calls it first.
func safetyContender() { suite.MainIfContender() }

// unusableURL returns the error of a URL that no backend can use (an
// unknown scheme, a malformed URL, an unknown or malformed parameter),
// found without connecting: the backend is opened with a context that has
// already ended, and any other failure is left to the suite to report.
func unusableURL(raw string) error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() {
		b, _, err := fencelock.OpenBackend(ctx, raw)
		if err == nil {
			b.Close()
		}
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		return nil // a backend that ignores its context: let the suite judge
	}
	var ioe *fencelock.InvalidOptionError
	if errors.Is(err, fencelock.ErrUnknownScheme) || errors.As(err, &ioe) && strings.HasPrefix(ioe.Option, "URL") {
		return err
	}
	return nil
}
