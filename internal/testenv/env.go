package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/internal/pause"
)

// Errors of the package; test for them with errors.Is.
var (
	// ErrNoState: no state dir is set (FENCELOCK_TESTENV_STATE), or it is
	// not one that Up made, so no server may be touched.
	ErrNoState = errors.New("testenv: FENCELOCK_TESTENV_STATE is not set or not a testenv state dir (start servers with: out=$(scripts/testenv up) && eval \"$out\")")
	// ErrUnknown: a name that is not one of Names.
	ErrUnknown = errors.New("testenv: unknown server")
	// ErrNotStarted: the server was never started in this state dir.
	ErrNotStarted = errors.New("testenv: not started in this state dir")
	// ErrNotRunning: the server or member is not running now.
	ErrNotRunning = errors.New("testenv: not running")
	// ErrNoLeader: no member of the cluster is leader (primary) now, e.g.
	// during an election.
	ErrNoLeader = errors.New("testenv: no leader")
	// ErrNotCluster: a member operation on a name that is not a cluster, or
	// a member ID the cluster does not have.
	ErrNotCluster = errors.New("testenv: not a cluster member")
)

// StepError reports a server that could not be installed, initialized,
// started or set up, or did not come up.
type StepError struct {
	Name string // the server
	Step string // install, init, start, ready, setup
	Err  error
	Log  string // the tail of its log(s), if any
}

// Error implements error.
func (e *StepError) Error() string {
	msg := fmt.Sprintf("testenv: %s: %s failed: %v", e.Name, e.Step, e.Err)
	if e.Log != "" {
		msg += "\n" + e.Log
	}
	return msg
}

// Unwrap returns Err.
func (e *StepError) Unwrap() error { return e.Err }

// Names of the servers.
var (
	// Defaults is what Up starts when no name is given.
	Defaults = []string{"postgres", "redis", "etcd", "zookeeper", "mongo", "mongo-pg", "mysql", "nats"}
	// Clusters start only when named: loopback clusters for fault injection.
	Clusters = []string{"etcd3", "zookeeper3", "redisha", "postgresha", "postgresha-sync", "nats3", "rediscluster"}
	// Stock start only when named: servers in their distribution's default
	// configuration.
	Stock = []string{"zookeeper-stock", "redis-stock", "postgres-stock", "mysql-stock", "nats-stock"}
)

// Names returns every server name, in the order Up exports them.
func Names() []string { return slices.Concat(Defaults, Clusters, Stock) }

func knownNames() string { return strings.Join(Names(), " ") }

// IsCluster reports whether name is a cluster.
func IsCluster(name string) bool { return slices.Contains(Clusters, name) }

// Env is one state dir of servers. Its methods may be called concurrently
// (on different servers).
type Env struct {
	// State is the state dir.
	State string
	// Log receives progress messages ("testenv: [1.2s] ..."); nil drops them.
	Log io.Writer
	// Timeout bounds the wait for a server to serve
	// (FENCELOCK_TESTENV_TIMEOUT seconds, default 60).
	Timeout time.Duration
	// StopTimeout bounds a graceful stop before SIGKILL
	// (FENCELOCK_TESTENV_STOP_TIMEOUT seconds, default 20).
	StopTimeout time.Duration

	root  string // the checkout: tools/ and scripts/install-servers
	cache string // cached tool builds and initdb results
	t0    time.Time
	logMu sync.Mutex

	peerAddr func(server, from, to, kind, target string) (string, error) // Config.PeerAddr
}

// Open returns the Env of an existing state dir, or ErrNoState.
func Open(state string) (*Env, error) {
	if !stateOK(state) {
		return nil, ErrNoState
	}
	return newEnv(state), nil
}

// FromEnv opens the state dir named by FENCELOCK_TESTENV_STATE.
func FromEnv() (*Env, error) { return Open(os.Getenv(StateEnv)) }

func newEnv(state string) *Env {
	e := &Env{
		State:       state,
		Timeout:     secondsEnv("FENCELOCK_TESTENV_TIMEOUT", 60),
		StopTimeout: secondsEnv("FENCELOCK_TESTENV_STOP_TIMEOUT", 20),
		root:        findRoot(),
		cache:       cacheDir(),
		t0:          time.Now(),
	}
	return e
}

func secondsEnv(k string, def int) time.Duration {
	if n, err := strconv.Atoi(os.Getenv(k)); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return time.Duration(def) * time.Second
}

func cacheDir() string {
	if c := os.Getenv("FENCELOCK_TESTENV_CACHE"); c != "" {
		return c
	}
	if c := os.Getenv("XDG_CACHE_HOME"); c != "" {
		return filepath.Join(c, "fencelock")
	}
	home := os.Getenv("HOME")
	if home == "" {
		home = "/tmp"
	}
	return filepath.Join(home, ".cache", "fencelock")
}

// findRoot returns the checkout: the first directory at or above the
// working directory with go.work and scripts/install-servers, else the
// one this source file is in (when built without -trimpath).
func findRoot() string {
	isRoot := func(d string) bool {
		return fileExists(filepath.Join(d, "go.work")) && fileExists(filepath.Join(d, "tools"))
	}
	if dir, err := os.Getwd(); err == nil {
		for {
			if isRoot(dir) {
				return dir
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		if d := filepath.Join(filepath.Dir(file), "..", ".."); isRoot(d) {
			return filepath.Clean(d)
		}
	}
	return ""
}

func (e *Env) rel(p string) string {
	if r, err := filepath.Rel(e.root, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

func (e *Env) logWriter() io.Writer {
	if e.Log == nil {
		return io.Discard
	}
	return lockedWriter{e}
}

type lockedWriter struct{ e *Env }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.e.logMu.Lock()
	defer w.e.logMu.Unlock()
	return w.e.Log.Write(p)
}

func (e *Env) logf(format string, args ...any) {
	if e.Log == nil {
		return
	}
	d := time.Since(e.t0)
	fmt.Fprintf(lockedWriter{e}, "testenv: [%d.%ds] %s\n", int(d.Seconds()), int(d.Milliseconds()%1000/100), fmt.Sprintf(format, args...))
}

// started returns the unit of a server that was started in this state dir.
func (e *Env) started(name string) (*unit, error) {
	u, err := e.unit(name)
	if err != nil {
		return nil, err
	}
	if !u.initialized() {
		return nil, fmt.Errorf("%w %s: %s", ErrNotStarted, e.State, name)
	}
	return u, nil
}

// URL returns the URL recorded for a server in this state dir, "" if none.
func (e *Env) URL(name string) string {
	return readTrimmed(filepath.Join(e.State, name, "url"))
}

// Owns reports whether url is the URL recorded for the server name in this
// state dir: only such a server may be killed or paused (a developer's
// own server never is).
func (e *Env) Owns(name, url string) bool {
	return e != nil && url != "" && e.URL(name) == url
}

// Exports returns the variables of every server of the state dir that has
// a URL, in the order of Names, after FENCELOCK_TESTENV_STATE and
// FENCELOCK_TESTENV.
func (e *Env) Exports() []Var {
	vars := []Var{{StateEnv, e.State}}
	if e.root != "" {
		vars = append(vars, Var{ScriptEnv, filepath.Join(e.root, "scripts", "testenv")})
	}
	for _, n := range Names() {
		if u := e.URL(n); u != "" {
			vars = append(vars, Var{EnvVar(n), u})
		}
	}
	return vars
}

// ---------------------------------------------------------------- stopping

type stopMode int

const (
	crash    stopMode = iota // SIGKILL
	graceful                 // the server's stop signal, SIGKILL after StopTimeout
)

// stopUnits stops the given members (all at once) and removes their pid
// files. Only a process whose PID and start time match its pid file is
// touched, with its descendants: never a server testenv did not start.
func (e *Env) stopUnits(mode stopMode, targets map[*unit][]string) {
	type victim struct {
		u      *unit
		member string
	}
	var all []int
	var vs []victim
	for u, members := range targets {
		for _, m := range members {
			pid, ok := u.pid(m)
			if !ok {
				_ = os.Remove(u.pidFile(m))
				continue
			}
			if mode == crash {
				tree := freezeTree(pid)
				all = append(all, tree...)
				vs = append(vs, victim{u, m})
				e.logf("%s: kill -9 pid %d (%d processes)", u.unitName(m), pid, len(tree))
				pause.Signal(tree, syscall.SIGKILL)
				continue
			}
			tree := pause.Tree(pid)
			all = append(all, tree...)
			vs = append(vs, victim{u, m})
			sig := u.srv.stopSig
			if sig == 0 {
				sig = syscall.SIGTERM
			}
			e.logf("%s: stopping pid %d (%v)", u.unitName(m), pid, sig)
			_ = syscall.Kill(pid, sig)
			pause.Signal(tree, syscall.SIGCONT) // a paused server must run to exit
		}
	}
	if len(all) == 0 {
		return
	}
	if mode == graceful && !waitGone(e.StopTimeout, all) {
		e.logf("WARNING: still running after %v, sending SIGKILL", e.StopTimeout)
		for _, v := range vs {
			if pid, ok := v.u.pid(v.member); ok {
				all = append(all, pause.Tree(pid)...) // children forked meanwhile
			}
		}
		pause.Signal(all, syscall.SIGKILL)
	}
	if !waitGone(15*time.Second, all) {
		e.logf("WARNING: processes did not exit: %v", all)
	}
	for _, v := range vs {
		_ = os.Remove(v.u.pidFile(v.member))
	}
}

func (e *Env) stopAll(mode stopMode, us ...*unit) {
	t := map[*unit][]string{}
	for _, u := range us {
		t[u] = u.memberIDs()
	}
	e.stopUnits(mode, t)
}

// Down stops every server of the state dir (gracefully; SIGKILL after
// StopTimeout) and removes the dir. It returns the variables that pointed
// at its servers (for `unset` lines), FENCELOCK_TESTENV_STATE last.
func (e *Env) Down(ctx context.Context) ([]string, error) {
	var us []*unit
	var vars []string
	for _, n := range Names() {
		if !fileExists(filepath.Join(e.State, n)) {
			continue
		}
		u, err := e.unit(n)
		if err != nil {
			return nil, err
		}
		us = append(us, u)
		if url := e.URL(n); url != "" {
			// Only variables that point at our servers.
			if v := os.Getenv(EnvVar(n)); v == "" || v == url {
				vars = append(vars, EnvVar(n))
			}
		}
	}
	e.stopAll(graceful, us...)
	if err := os.RemoveAll(e.State); err != nil {
		return vars, err
	}
	e.logf("removed %s", e.State)
	return append(vars, StateEnv), nil
}

// ---------------------------------------------------------------- one server

// Restart kills a server (every member of a cluster) with SIGKILL, a
// crash, and starts it again with its ports and data; it returns once it
// serves again.
func (e *Env) Restart(ctx context.Context, name string) error {
	u, err := e.started(name)
	if err != nil {
		return err
	}
	e.stopAll(crash, u)
	return e.startAgain(ctx, u)
}

// Stop stops a server gracefully (its stop signal, then SIGKILL after
// StopTimeout); its ports and data are kept.
func (e *Env) Stop(ctx context.Context, name string) error {
	u, err := e.started(name)
	if err != nil {
		return err
	}
	e.stopAll(graceful, u)
	return nil
}

// Start starts a stopped server again with its ports and data, and
// returns once it serves.
func (e *Env) Start(ctx context.Context, name string) error {
	u, err := e.started(name)
	if err != nil {
		return err
	}
	return e.startAgain(ctx, u)
}

func (e *Env) startAgain(ctx context.Context, u *unit) error {
	if u.alive() {
		e.logf("%s: already running", u.srv.name)
		return nil
	}
	e.logf("%s: starting on the same port with the same data", u.srv.name)
	err := u.bringup(ctx, false)
	if err == nil {
		err = u.waitReady(ctx, e.Timeout)
	}
	if err != nil {
		e.stopAll(graceful, u)
		return &StepError{Name: u.srv.name, Step: "restart", Err: err, Log: u.logTails()}
	}
	e.logf("%s: ready", u.srv.name)
	return nil
}

func (u *unit) logTails() string {
	var parts []string
	for _, l := range u.logs() {
		parts = append(parts, tailFile(l, 40))
	}
	return strings.Join(parts, "\n")
}

// Pause stops a server (every member of a cluster), all its processes,
// with SIGSTOP, and returns once each is stopped. Pausing a paused server
// does nothing; a member that does not run is ErrNotRunning.
func (e *Env) Pause(ctx context.Context, name string) error { return e.pause(ctx, name, "", true) }

// Resume continues what Pause stopped (SIGCONT) and returns once every
// process runs again.
func (e *Env) Resume(ctx context.Context, name string) error { return e.pause(ctx, name, "", false) }

func (e *Env) pause(ctx context.Context, name, member string, stop bool) error {
	u, err := e.started(name)
	if err != nil {
		return err
	}
	members := u.memberIDs()
	if member != "" {
		if err := u.checkMember(member); err != nil {
			return err
		}
		members = []string{member}
	}
	// One signal to every process of every member first, so that the
	// members of a cluster stop (or go on) together; then make sure of each.
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	for _, m := range members {
		if pid, ok := u.pid(m); ok {
			pause.Signal(pause.Tree(pid), sig)
		}
	}
	var errs []error
	for _, m := range members {
		if err := pauseTree(ctx, u.pidFile(m), stop); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", u.unitName(m), err))
			continue
		}
		e.logf("%s: %s", u.unitName(m), map[bool]string{true: "paused", false: "resumed"}[stop])
	}
	return errors.Join(errs...)
}

// PID returns the PID of a single server's process, or ErrNotRunning.
func (e *Env) PID(name string) (int, error) {
	if IsCluster(name) {
		return 0, fmt.Errorf("%w: %s is a cluster: ask for a member's PID", ErrNotCluster, name)
	}
	u, err := e.started(name)
	if err != nil {
		return 0, err
	}
	pid, ok := u.pid("")
	if !ok {
		return 0, fmt.Errorf("%w: %s", ErrNotRunning, name)
	}
	return pid, nil
}

// Status writes what runs in the state dir: per server its state, PID,
// URL and log (per member for a cluster).
func (e *Env) Status(w io.Writer) error {
	fmt.Fprintf(w, "state dir: %s\n", e.State)
	for _, n := range Names() {
		u, err := e.unit(n)
		if err != nil || !u.initialized() {
			continue
		}
		url := e.URL(n)
		if url == "" {
			url = "?"
		}
		if u.srv.cluster() {
			fmt.Fprintf(w, "%-15s %s\n", n, url)
		}
		for _, m := range u.memberIDs() {
			st, pid := u.state(m)
			s := string(st)
			if st != Stopped {
				s += fmt.Sprintf(" (pid %d)", pid)
			}
			if u.srv.cluster() {
				fmt.Fprintf(w, "  %-8s %-22s log: %s\n", m, s, u.logFile(m))
			} else {
				fmt.Fprintf(w, "%-15s %-22s %s  log: %s\n", n, s, url, u.logFile(m))
			}
		}
	}
	return nil
}

// State is what a server or member is doing.
type State string

// States of a server or member.
const (
	Running State = "running"
	Paused  State = "paused"  // stopped by SIGSTOP
	Stopped State = "stopped" // not running (killed, stopped, or exited)
)

func (u *unit) state(member string) (State, int) {
	pid, ok := u.pid(member)
	if !ok {
		return Stopped, 0
	}
	if p, err := pause.Read(pid); err == nil && p.Stopped() {
		return Paused, pid
	}
	return Running, pid
}

// ---------------------------------------------------------------- cluster members

// Member describes one member of a cluster.
type Member struct {
	ID    string
	State State
	PID   int    // 0 when Stopped
	Addr  string // client address, host:port
}

func (e *Env) cluster(name string) (*unit, error) {
	if !IsCluster(name) {
		if _, ok := servers[name]; !ok {
			return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, knownNames())
		}
		return nil, fmt.Errorf("%w: %q is not a cluster (clusters: %s)", ErrNotCluster, name, strings.Join(Clusters, " "))
	}
	return e.started(name)
}

func (u *unit) checkMember(id string) error {
	if !u.srv.cluster() || !slices.Contains(u.srv.members, id) {
		return fmt.Errorf("%w: %s has no member %q (members: %s)", ErrNotCluster, u.srv.name, id, strings.Join(u.srv.members, " "))
	}
	return nil
}

func (e *Env) member(name, id string) (*unit, error) {
	u, err := e.cluster(name)
	if err != nil {
		return nil, err
	}
	return u, u.checkMember(id)
}

// KillMember kills one member of a cluster with SIGKILL, all its
// processes, and returns once they are gone. A member that does not run
// is left alone.
func (e *Env) KillMember(ctx context.Context, name, id string) error {
	u, err := e.member(name, id)
	if err != nil {
		return err
	}
	e.stopUnits(crash, map[*unit][]string{u: {id}})
	return nil
}

// StopMember stops one member gracefully.
func (e *Env) StopMember(ctx context.Context, name, id string) error {
	u, err := e.member(name, id)
	if err != nil {
		return err
	}
	e.stopUnits(graceful, map[*unit][]string{u: {id}})
	return nil
}

// StartMember starts a stopped or killed member with its ports and data,
// and returns once it serves (an etcd member that sees a leader, a
// ZooKeeper node that leads or follows, a Redis server that answers PING).
func (e *Env) StartMember(ctx context.Context, name, id string) error {
	u, err := e.member(name, id)
	if err != nil {
		return err
	}
	if pid, ok := u.pid(id); ok {
		e.logf("%s: already running (pid %d)", u.unitName(id), pid)
		return nil
	}
	e.logf("%s: starting on the same ports with the same data", u.unitName(id))
	err = u.bringup(ctx, false, id)
	if err == nil {
		err = u.waitFor(ctx, e.Timeout, u.unitName(id),
			func() bool { _, ok := u.pid(id); return ok },
			func(ctx context.Context) error { return u.srv.memberReady(ctx, u, id) })
	}
	if err != nil {
		e.stopUnits(graceful, map[*unit][]string{u: {id}})
		return &StepError{Name: u.unitName(id), Step: "start", Err: err, Log: tailFile(u.logFile(id), 40)}
	}
	pid, _ := u.pid(id)
	e.logf("%s: serving (pid %d)", u.unitName(id), pid)
	return nil
}

// RestartMember is KillMember, then StartMember.
func (e *Env) RestartMember(ctx context.Context, name, id string) error {
	if err := e.KillMember(ctx, name, id); err != nil {
		return err
	}
	return e.StartMember(ctx, name, id)
}

// PauseMember is Pause for one member of a cluster.
func (e *Env) PauseMember(ctx context.Context, name, id string) error {
	if _, err := e.member(name, id); err != nil {
		return err
	}
	return e.pause(ctx, name, id, true)
}

// ResumeMember is Resume for one member of a cluster.
func (e *Env) ResumeMember(ctx context.Context, name, id string) error {
	if _, err := e.member(name, id); err != nil {
		return err
	}
	return e.pause(ctx, name, id, false)
}

// MemberPID returns the PID of a member of a cluster, or ErrNotRunning.
func (e *Env) MemberPID(name, id string) (int, error) {
	u, err := e.member(name, id)
	if err != nil {
		return 0, err
	}
	pid, ok := u.pid(id)
	if !ok {
		return 0, fmt.Errorf("%w: %s", ErrNotRunning, u.unitName(id))
	}
	return pid, nil
}

// Addr returns the client address (host:port) of a member, running or not.
func (e *Env) Addr(name, id string) (string, error) {
	u, err := e.member(name, id)
	if err != nil {
		return "", err
	}
	return u.srv.addr(u, id), nil
}

// Members lists the members of a cluster in order.
func (e *Env) Members(name string) ([]Member, error) {
	u, err := e.cluster(name)
	if err != nil {
		return nil, err
	}
	var ms []Member
	for _, id := range u.srv.members {
		st, pid := u.state(id)
		ms = append(ms, Member{ID: id, State: st, PID: pid, Addr: u.srv.addr(u, id)})
	}
	return ms, nil
}

// Leader returns the ID of the cluster's leader right now (etcd's raft
// leader, ZooKeeper's leader, the Redis primary as the Sentinel names it,
// the leader of nats3's bucket stream),
// asking only members that run and are not paused, or ErrNoLeader.
func (e *Env) Leader(ctx context.Context, name string) (string, error) {
	u, err := e.cluster(name)
	if err != nil {
		return "", err
	}
	id, err := u.srv.leader(ctx, u)
	if err != nil || id == "" {
		return "", fmt.Errorf("%w now: %s", ErrNoLeader, name)
	}
	return id, nil
}

// Failover moves leadership to another member while all run and returns
// once the new leader serves. Only redisha (SENTINEL FAILOVER), the
// PostgreSQL clusters (a switchover: stop, promote, start as standby) and
// nats3 (a stepdown of the bucket stream's leader) have it.
func (e *Env) Failover(ctx context.Context, name string) error {
	u, err := e.cluster(name)
	if err != nil {
		return err
	}
	if u.srv.failover == nil {
		return fmt.Errorf("testenv: %s has no failover command (kill its leader instead)", name)
	}
	return u.srv.failover(ctx, u)
}
