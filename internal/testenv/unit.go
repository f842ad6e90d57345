package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/fencelock/fencelock/internal/pause"
)

// server describes how to install, start and probe one kind of server.
// A cluster has members; its functions that take a member act on one.
type server struct {
	name    string
	members []string       // a cluster's member IDs; nil for a single server
	needs   []string       // servers whose URL init needs (mongo-pg: postgres)
	stopSig syscall.Signal // graceful stop; 0 means SIGTERM

	// packages returns the Debian packages still missing.
	packages func() []string
	// install finds or builds the binaries and saves their paths.
	install func(ctx context.Context, u *unit) error
	// init runs before the first start: ports, configs, data dirs.
	init func(ctx context.Context, u *unit) error
	// start spawns the server (member of a cluster) with saved ports and data.
	start func(u *unit, member string) error
	// ready passes once the server (every member, and a leader) serves.
	ready func(ctx context.Context, u *unit) error
	// memberReady passes once one member serves.
	memberReady func(ctx context.Context, u *unit, member string) error
	// setup runs once, after the first ready (e.g. CREATE DATABASE).
	setup func(ctx context.Context, u *unit) error
	// url is the value of the server's variable.
	url func(u *unit) string
	// version describes the server for the log.
	version func(ctx context.Context, u *unit) string
	// addr is a member's client address, host:port.
	addr func(u *unit, member string) string
	// leader returns the ID of the leader, or ErrNoLeader.
	leader func(ctx context.Context, u *unit) (string, error)
	// failover moves leadership to another member and waits for it.
	failover func(ctx context.Context, u *unit) error
}

func (s *server) cluster() bool { return s.members != nil }

// unit is one server (all members of a cluster) in a state dir, with the
// variables its plugin saved: ports, binary paths.
type unit struct {
	e    *Env
	srv  *server
	dir  string
	vars map[string]string
	deps map[string]string // URLs of the servers in srv.needs
}

func (e *Env) unit(name string) (*unit, error) {
	srv, ok := servers[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, knownNames())
	}
	dir := filepath.Join(e.State, name)
	vars, err := loadVars(filepath.Join(dir, "env"))
	if err != nil {
		return nil, err
	}
	return &unit{e: e, srv: srv, dir: dir, vars: vars}, nil
}

func (u *unit) get(k string) string { return u.vars[k] }

func (u *unit) port(k string) int {
	p, _ := strconv.Atoi(u.vars[k])
	return p
}

// save sets k and keeps it in the server's env file for later calls.
func (u *unit) save(k, v string) error {
	u.vars[k] = v
	return storeVars(filepath.Join(u.dir, "env"), u.vars)
}

// savePort picks a free port and saves it as k.
func (u *unit) savePort(k string) (int, error) {
	p, err := FreePort(u.e.State)
	if err != nil {
		return 0, err
	}
	return p, u.save(k, strconv.Itoa(p))
}

// mdir is the directory of a member ("" for a single server): its pid file.
func (u *unit) mdir(member string) string {
	if member == "" {
		return u.dir
	}
	return filepath.Join(u.dir, member)
}

func (u *unit) pidFile(member string) string { return filepath.Join(u.mdir(member), "pid") }

// logFile is NAME/NAME.log, or NAME/ID/NAME-ID.log for a member.
func (u *unit) logFile(member string) string {
	if member == "" {
		return filepath.Join(u.dir, u.srv.name+".log")
	}
	return filepath.Join(u.mdir(member), u.srv.name+"-"+member+".log")
}

// memberIDs is the members of a cluster, or [""] for a single server.
func (u *unit) memberIDs() []string {
	if u.srv.cluster() {
		return u.srv.members
	}
	return []string{""}
}

func (u *unit) logs() []string {
	var out []string
	for _, m := range u.memberIDs() {
		out = append(out, u.logFile(m))
	}
	return out
}

func (u *unit) unitName(member string) string {
	if member == "" {
		return u.srv.name
	}
	return u.srv.name + "/" + member
}

// spawn starts argv for member (as user cred, if set) in the member's dir.
func (u *unit) spawn(member string, cred *syscall.Credential, argv ...string) error {
	if err := os.MkdirAll(u.mdir(member), 0o755); err != nil {
		return err
	}
	_, err := spawn(spawnSpec{
		argv:    argv,
		dir:     u.mdir(member),
		log:     u.logFile(member),
		cred:    cred,
		pidFile: u.pidFile(member),
	})
	return err
}

// pid returns the PID of a running member ("" for a single server).
func (u *unit) pid(member string) (int, bool) { return readPID(u.pidFile(member)) }

// alive reports whether every member runs.
func (u *unit) alive() bool {
	for _, m := range u.memberIDs() {
		if _, ok := u.pid(m); !ok {
			return false
		}
	}
	return true
}

// active reports whether member runs and is not paused.
func (u *unit) active(member string) bool {
	pid, ok := u.pid(member)
	if !ok {
		return false
	}
	p, err := pause.Read(pid)
	return err == nil && !p.Stopped()
}

func (u *unit) initialized() bool { return fileExists(filepath.Join(u.dir, "initialized")) }

// isReady runs the readiness probe once.
func (u *unit) isReady(ctx context.Context) error {
	return u.srv.ready(ctx, u)
}

// bringup installs (unless noInstall), initializes on the first start and
// starts the given members (default: all) that do not run.
func (u *unit) bringup(ctx context.Context, install bool, members ...string) (err error) {
	step := "install"
	defer func() {
		if err != nil {
			err = &StepError{Name: u.srv.name, Step: step, Err: err}
		}
	}()
	if err := os.MkdirAll(u.dir, 0o755); err != nil {
		return err
	}
	if install {
		if err := u.srv.install(ctx, u); err != nil {
			return err
		}
	}
	if !u.initialized() {
		step = "init"
		if err := u.srv.init(ctx, u); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(u.dir, "initialized"), nil, 0o644); err != nil {
			return err
		}
	}
	step = "start"
	if len(members) == 0 {
		members = u.memberIDs()
	}
	for _, m := range members {
		if _, ok := u.pid(m); ok {
			continue
		}
		if err := u.srv.start(u, m); err != nil {
			return err
		}
	}
	return nil
}

// finish runs setup once after the first ready, records the URL and logs
// the version.
func (u *unit) finish(ctx context.Context) error {
	done := filepath.Join(u.dir, "setup-done")
	if !fileExists(done) {
		if u.srv.setup != nil {
			if err := u.srv.setup(ctx, u); err != nil {
				return &StepError{Name: u.srv.name, Step: "setup", Err: err}
			}
		}
		if err := os.WriteFile(done, nil, 0o644); err != nil {
			return err
		}
	}
	url := u.srv.url(u)
	if err := writeFileAtomic(filepath.Join(u.dir, "url"), url+"\n"); err != nil {
		return err
	}
	if u.srv.version != nil {
		u.e.logf("%s: %s at %s", u.srv.name, u.srv.version(ctx, u), url)
	}
	return nil
}

// waitReady polls the readiness probe until it passes, the server exits,
// or the timeout ends.
func (u *unit) waitReady(ctx context.Context, timeout time.Duration) error {
	return u.waitFor(ctx, timeout, u.srv.name, u.alive, func(ctx context.Context) error { return u.srv.ready(ctx, u) })
}

// waitFor polls probe until it passes; it fails when alive says the server
// exited or after timeout.
func (u *unit) waitFor(ctx context.Context, timeout time.Duration, what string, alive func() bool, probe func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	lastNote := time.Now()
	var last error
	for {
		if last = probe(ctx); last == nil {
			return nil
		}
		if !alive() {
			return fmt.Errorf("%s: server exited before serving: %w", what, errExited)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not serving after %v (last probe: %v)", what, timeout, last)
		}
		if time.Since(lastNote) >= 10*time.Second {
			u.e.logf("%s: still waiting (%v left)", what, time.Until(deadline).Round(time.Second))
			lastNote = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(4 * pollInterval):
		}
	}
}

var errExited = errors.New("exited")
