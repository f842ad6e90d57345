// Package cluster lets the safety harness inject store faults into servers
// that scripts/testenv started: kill -9, restart, stop and start of one
// member of a loopback cluster (etcd3, zookeeper3, redisha), finding its
// current leader or primary, and pausing a whole server or one member with
// SIGSTOP/SIGCONT.
//
// Every method runs one scripts/testenv command (docs/testenv.md describes
// them) against one state dir, so the processes it touches are exactly the
// ones testenv started there and never a server of someone else. The
// clusters are not part of the default `scripts/testenv up` set; the safety
// runner (or a developer) starts them by name:
//
//	out=$(scripts/testenv up etcd3 zookeeper3 redisha) && eval "$out"
//
// after which FromEnv finds them, or with Up from Go.
package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Names of the loopback clusters scripts/testenv can start.
const (
	// Etcd3 is a 3-member etcd cluster, members "1" "2" "3"; its URL is
	// etcd://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3.
	Etcd3 = "etcd3"
	// ZooKeeper3 is a 3-node ZooKeeper ensemble, members "1" "2" "3"; its
	// URL is zk://127.0.0.1:C1,127.0.0.1:C2,127.0.0.1:C3.
	ZooKeeper3 = "zookeeper3"
	// RedisHA is a Redis primary ("1" at first) and its replica ("2"),
	// watched by one Sentinel (member "sentinel"), which promotes the
	// replica when the primary dies; its URL names the Sentinel:
	// redis+sentinel://127.0.0.1:S/fencelock/0.
	RedisHA = "redisha"
)

// Environment variables that scripts/testenv up exports.
const (
	// StateEnv names the state dir of the running servers.
	StateEnv = "FENCELOCK_TESTENV_STATE"
	// ScriptEnv is the absolute path of scripts/testenv.
	ScriptEnv = "FENCELOCK_TESTENV"
)

// Errors reported by Testenv's methods; test for them with errors.Is.
var (
	// ErrNoState: FENCELOCK_TESTENV_STATE is not set, so no server was
	// started by scripts/testenv and none may be killed or paused.
	ErrNoState = errors.New("cluster: FENCELOCK_TESTENV_STATE is not set (start servers with scripts/testenv up)")
	// ErrNotRunning: the server or member is not running.
	ErrNotRunning = errors.New("cluster: not running")
	// ErrNoLeader: no member of the cluster is leader (primary) right now,
	// e.g. during an election.
	ErrNoLeader = errors.New("cluster: no leader")
)

// exitNotNow is scripts/testenv's exit status for "not running" and "no
// leader now".
const exitNotNow = 3

// CommandError reports a scripts/testenv command that failed.
type CommandError struct {
	Args     []string // the command's arguments after the script's path
	ExitCode int      // its exit status, -1 if it did not exit normally
	Stderr   string   // the last lines it wrote to stderr
	Err      error    // ErrNotRunning, ErrNoLeader, a context error, or the exec error
}

// Error implements error: the command, its error, and its stderr's tail.
func (e *CommandError) Error() string {
	msg := fmt.Sprintf("cluster: scripts/testenv %s: %v", strings.Join(e.Args, " "), e.Err)
	if e.Stderr != "" {
		msg += "\n" + e.Stderr
	}
	return msg
}

// Unwrap returns Err.
func (e *CommandError) Unwrap() error { return e.Err }

// Testenv runs scripts/testenv commands against one state dir. Its methods
// may be called concurrently; each returns when its command has finished.
type Testenv struct {
	// Script is the path of scripts/testenv.
	Script string
	// State is the state dir (FENCELOCK_TESTENV_STATE) of the servers.
	State string

	urls map[string]string // set by Up
}

// FromEnv returns the Testenv of the servers named by the environment:
// FENCELOCK_TESTENV_STATE, and FENCELOCK_TESTENV for the script, or else
// scripts/testenv in the checkout around the working directory. It fails
// with ErrNoState when no state dir is set.
func FromEnv() (*Testenv, error) {
	state := os.Getenv(StateEnv)
	if state == "" {
		return nil, ErrNoState
	}
	script, err := findScript()
	if err != nil {
		return nil, err
	}
	return &Testenv{Script: script, State: state}, nil
}

// findScript returns $FENCELOCK_TESTENV, or scripts/testenv in the first
// directory at or above the working directory that has one.
func findScript() (string, error) {
	if s := os.Getenv(ScriptEnv); s != "" {
		return s, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("cluster: finding scripts/testenv: %w", err)
	}
	for {
		s := filepath.Join(dir, "scripts", "testenv")
		if fi, err := os.Stat(s); err == nil && !fi.IsDir() {
			return s, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cluster: scripts/testenv not found above the working directory (set FENCELOCK_TESTENV)")
		}
		dir = parent
	}
}

// EnvVar returns the environment variable holding the URL of a server or
// cluster started by scripts/testenv: FENCELOCK_TEST_ETCD3 for Etcd3.
func EnvVar(name string) string {
	return "FENCELOCK_TEST_" + strings.ToUpper(name)
}

// Up starts the named servers or clusters with `scripts/testenv up` in a new
// state dir of their own (variables of the caller's environment that name
// other servers for them are ignored) and returns its Testenv, whose URL
// method gives their URLs. The caller must call Down. Under CI=true a server
// that cannot be started is an error; otherwise it is left out and URL
// returns "" for it.
func Up(ctx context.Context, names ...string) (*Testenv, error) {
	if len(names) == 0 {
		return nil, errors.New("cluster: Up needs at least one name")
	}
	script, err := findScript()
	if err != nil {
		return nil, err
	}
	env := make([]string, 0, len(os.Environ()))
	drop := map[string]bool{StateEnv: true}
	for _, n := range names {
		drop[EnvVar(n)] = true
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			env = append(env, kv)
		}
	}
	args := append([]string{"up"}, names...)
	out, err := run(ctx, script, env, args)
	vars, perr := parseExports(out)
	t := &Testenv{Script: script, State: vars[StateEnv], urls: map[string]string{}}
	if err == nil && perr != nil {
		err = fmt.Errorf("cluster: reading the output of scripts/testenv up: %w", perr)
	}
	if err == nil && t.State == "" {
		err = errors.New("cluster: scripts/testenv up printed no state dir")
	}
	if err != nil {
		if t.State != "" {
			_ = t.Down(context.WithoutCancel(ctx))
		}
		return nil, err
	}
	for _, n := range names {
		t.urls[n] = vars[EnvVar(n)]
	}
	return t, nil
}

// Down stops every server of the state dir and removes it (scripts/testenv
// down). Use it for a Testenv made by Up, not for servers someone else
// started.
func (t *Testenv) Down(ctx context.Context) error {
	_, err := t.run(ctx, "down")
	return err
}

// URL returns the URL of the named server or cluster: the one Up reported,
// or else the value of its environment variable (EnvVar), "" if unset.
func (t *Testenv) URL(name string) string {
	if u, ok := t.urls[name]; ok {
		return u
	}
	return os.Getenv(EnvVar(name))
}

// Kill kills member of cluster name with SIGKILL, with all its processes,
// and returns once they are gone. Killing a member that is not running
// does nothing.
func (t *Testenv) Kill(ctx context.Context, name, member string) error {
	_, err := t.run(ctx, "member", name, "kill", member)
	return err
}

// Start starts a stopped or killed member with its ports and data, and
// returns once it serves requests (an etcd member that sees a leader, a
// ZooKeeper node that leads or follows, a Redis server that answers PING).
func (t *Testenv) Start(ctx context.Context, name, member string) error {
	_, err := t.run(ctx, "member", name, "start", member)
	return err
}

// Stop stops a member gracefully (SIGTERM; SIGKILL after 20 s).
func (t *Testenv) Stop(ctx context.Context, name, member string) error {
	_, err := t.run(ctx, "member", name, "stop", member)
	return err
}

// Restart is Kill, then Start.
func (t *Testenv) Restart(ctx context.Context, name, member string) error {
	_, err := t.run(ctx, "member", name, "restart", member)
	return err
}

// RestartServer kills a single server (not a cluster) with SIGKILL and
// starts it again with its port and data (scripts/testenv restart NAME).
func (t *Testenv) RestartServer(ctx context.Context, name string) error {
	_, err := t.run(ctx, "restart", name)
	return err
}

// Owns reports whether url is the URL scripts/testenv recorded for its
// server name in this state dir: only such a server may be killed or
// paused (a developer's own server never is).
func (t *Testenv) Owns(name, url string) bool {
	if t == nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join(t.State, name, "url"))
	return err == nil && strings.TrimSpace(string(b)) == url
}

// Leader returns the ID of the member that is the cluster's leader (etcd's
// raft leader, ZooKeeper's leader, the Redis primary as the Sentinel names
// it) right now, asking only members that run and are not paused. It fails
// with ErrNoLeader when there is none, e.g. during an election.
func (t *Testenv) Leader(ctx context.Context, name string) (string, error) {
	out, err := t.run(ctx, "member", name, "leader")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// WaitLeader polls Leader every 50 ms until a member other than those in
// not is leader, and returns its ID; it gives up when ctx ends. Use it
// after killing or pausing the leader.
func (t *Testenv) WaitLeader(ctx context.Context, name string, not ...string) (string, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		id, err := t.Leader(ctx, name)
		switch {
		case err == nil:
			if !contains(not, id) {
				return id, nil
			}
		case !errors.Is(err, ErrNoLeader):
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("cluster: waiting for a new leader of %s: %w", name, ctx.Err())
		case <-tick.C:
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Failover asks the cluster to move leadership to another member while all
// run, and returns once a new leader serves. Only RedisHA has it (SENTINEL
// FAILOVER).
func (t *Testenv) Failover(ctx context.Context, name string) error {
	_, err := t.run(ctx, "member", name, "failover")
	return err
}

// Pause stops the server of a backend (all members of a cluster) with
// SIGSTOP, all its processes, and returns once every one is stopped. It
// fails with ErrNotRunning if a server or member is not running. Pausing a
// paused server does nothing.
func (t *Testenv) Pause(ctx context.Context, name string) error {
	_, err := t.run(ctx, "pause", name)
	return err
}

// Resume continues what Pause stopped (SIGCONT) and returns once every
// process runs again. Resuming a running server does nothing.
func (t *Testenv) Resume(ctx context.Context, name string) error {
	_, err := t.run(ctx, "resume", name)
	return err
}

// PauseMember is Pause for one member of a cluster.
func (t *Testenv) PauseMember(ctx context.Context, name, member string) error {
	_, err := t.run(ctx, "member", name, "pause", member)
	return err
}

// ResumeMember is Resume for one member of a cluster.
func (t *Testenv) ResumeMember(ctx context.Context, name, member string) error {
	_, err := t.run(ctx, "member", name, "resume", member)
	return err
}

// PID returns the process ID of a backend's server (not a cluster's: use
// MemberPID), or ErrNotRunning.
func (t *Testenv) PID(ctx context.Context, name string) (int, error) {
	return t.pid(ctx, "pid", name)
}

// MemberPID returns the process ID of a member of a cluster, or
// ErrNotRunning.
func (t *Testenv) MemberPID(ctx context.Context, name, member string) (int, error) {
	return t.pid(ctx, "member", name, "pid", member)
}

func (t *Testenv) pid(ctx context.Context, args ...string) (int, error) {
	out, err := t.run(ctx, args...)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return 0, fmt.Errorf("cluster: scripts/testenv %s printed %q, not a PID", strings.Join(args, " "), out)
	}
	return pid, nil
}

// Addr returns the client address (host:port) of a member of a cluster,
// running or not.
func (t *Testenv) Addr(ctx context.Context, name, member string) (string, error) {
	out, err := t.run(ctx, "member", name, "addr", member)
	return strings.TrimSpace(out), err
}

// State is what a member is doing.
type State string

// States of a member.
const (
	Running State = "running"
	Paused  State = "paused"  // stopped by SIGSTOP
	Stopped State = "stopped" // not running (killed, stopped, or exited)
)

// Member describes one member of a cluster.
type Member struct {
	ID    string
	State State
	PID   int    // 0 when Stopped
	Addr  string // client address, host:port
}

// Members lists the members of a cluster in order.
func (t *Testenv) Members(ctx context.Context, name string) ([]Member, error) {
	out, err := t.run(ctx, "member", name, "members")
	if err != nil {
		return nil, err
	}
	var ms []Member
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 {
			return nil, fmt.Errorf("cluster: scripts/testenv member %s members: unexpected line %q", name, sc.Text())
		}
		m := Member{ID: f[0], State: State(f[1]), Addr: f[3]}
		if f[2] != "-" {
			if m.PID, err = strconv.Atoi(f[2]); err != nil {
				return nil, fmt.Errorf("cluster: scripts/testenv member %s members: bad PID in %q", name, sc.Text())
			}
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// run runs scripts/testenv with args against t's state dir and returns its
// stdout.
func (t *Testenv) run(ctx context.Context, args ...string) (string, error) {
	if t.State == "" {
		return "", &CommandError{Args: args, ExitCode: -1, Err: ErrNoState}
	}
	env := append(os.Environ(), StateEnv+"="+t.State)
	return run(ctx, t.Script, env, args)
}

func run(ctx context.Context, script string, env, args []string) (string, error) {
	cmd := exec.CommandContext(ctx, script, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	// Servers started by the script never hold its stdout or stderr, but
	// a killed script's children might: do not wait for them for long.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err == nil {
		return stdout.String(), nil
	}
	ce := &CommandError{Args: args, ExitCode: -1, Stderr: tail(stderr.String(), 20), Err: err}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		ce.Err = ctx.Err()
	case errors.As(err, &ee):
		ce.ExitCode = ee.ExitCode()
		if ce.ExitCode == exitNotNow {
			if len(args) > 0 && args[len(args)-1] == "leader" {
				ce.Err = ErrNoLeader
			} else {
				ce.Err = ErrNotRunning
			}
		}
	}
	return stdout.String(), ce
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// parseExports reads the `export NAME='value'` lines that scripts/testenv
// up prints.
func parseExports(out string) (map[string]string, error) {
	vars := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		kv, ok := strings.CutPrefix(line, "export ")
		k, v, ok2 := strings.Cut(kv, "=")
		if !ok || !ok2 {
			return vars, fmt.Errorf("unexpected line %q", line)
		}
		uv, err := unquote(v)
		if err != nil {
			return vars, fmt.Errorf("line %q: %w", line, err)
		}
		vars[k] = uv
	}
	return vars, sc.Err()
}

// unquote undoes the shell quoting of scripts/testenv's tenv_sq:
// single-quoted parts, and \' for a quote between them.
func unquote(s string) (string, error) {
	var b strings.Builder
	for len(s) > 0 {
		switch {
		case strings.HasPrefix(s, `\'`):
			b.WriteByte('\'')
			s = s[2:]
		case s[0] == '\'':
			end := strings.IndexByte(s[1:], '\'')
			if end < 0 {
				return "", errors.New("unterminated quote")
			}
			b.WriteString(s[1 : 1+end])
			s = s[end+2:]
		default:
			return "", fmt.Errorf("unquoted text %q", s)
		}
	}
	return b.String(), nil
}
