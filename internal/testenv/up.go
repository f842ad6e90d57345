package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Config is how Up runs.
type Config struct {
	// State is a state dir to reuse (servers that still run are reused,
	// stopped ones started again); when it is "" or not a state dir, Up
	// makes a new one, fencelock-testenv.XXXXXX under TMPDIR.
	State string
	// CI makes a server that cannot be started fatal: Up stops what it
	// started and fails. Otherwise the server is left out with a warning.
	CI bool
	// Log receives progress messages; nil drops them.
	Log io.Writer
	// Given returns the value of a server's variable in the caller's
	// environment: a set one that is not this state dir's URL names the
	// caller's own server, which Up exports back instead of starting one.
	// Nil means no server is given.
	Given func(envVar string) string
	// PeerAddr, if set, is asked for the address a cluster member from
	// uses to reach the peer port target (host:port) of member to, when
	// the member's configuration is written; kind names the port
	// ("quorum", "election"). It returns the address to write instead
	// (a proxy's, so that the caller can cut the link). Only zookeeper3
	// asks it; nil keeps the peers' own addresses.
	PeerAddr func(server, from, to, kind, target string) (string, error)
}

// IsCI reports whether the environment says CI (CI=true or CI=1).
func IsCI() bool {
	ci := os.Getenv("CI")
	return ci == "true" || ci == "1"
}

// Up starts the named servers (Defaults when none is named), and each
// server one of them needs (mongo-pg needs postgres), in parallel, and
// returns once each serves, with the state dir's Env and the variables to
// export: FENCELOCK_TESTENV_STATE, FENCELOCK_TESTENV, then one per server
// in the order of Names. Missing Debian packages are installed first with
// scripts/install-servers; the Go tools are built once and cached.
//
// A server that fails is, under cfg.CI, an error (after stopping what this
// call started, and removing a state dir it made); otherwise a warning,
// and its variable is left out.
func Up(ctx context.Context, cfg Config, names ...string) (*Env, []Var, error) {
	if len(names) == 0 {
		names = Defaults
	}
	var e *Env
	created := false
	if stateOK(cfg.State) {
		e = newEnv(cfg.State)
		e.Log = cfg.Log
		e.peerAddr = cfg.PeerAddr
		e.logf("reusing state dir %s", cfg.State)
	} else {
		if cfg.State != "" {
			fmt.Fprintf(logOrDiscard(cfg.Log), "testenv: WARNING: %s=%s is not a testenv state dir; making a new one\n", StateEnv, cfg.State)
		}
		dir, err := os.MkdirTemp("", "fencelock-testenv.")
		if err != nil {
			return nil, nil, err
		}
		// PostgreSQL runs as another user and must reach its data dir.
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, marker), []byte(time.Now().Format("2006-01-02 15:04:05")+"\n"), 0o644); err != nil {
			return nil, nil, err
		}
		e = newEnv(dir)
		e.Log = cfg.Log
		e.peerAddr = cfg.PeerAddr
		created = true
	}
	given := cfg.Given
	if given == nil {
		given = func(string) string { return "" }
	}
	r := &upRun{e: e, cfg: cfg, given: given, done: map[string]chan struct{}{}, urls: map[string]string{}}

	// The servers named, each after what it needs.
	var order []string
	var addNeeds func(n string)
	addNeeds = func(n string) {
		if slices.Contains(order, n) {
			return
		}
		if s, ok := servers[n]; ok {
			for _, d := range s.needs {
				addNeeds(d)
			}
		}
		order = append(order, n)
	}
	for _, n := range names {
		addNeeds(n)
	}

	err := r.run(ctx, order)
	if cerr := ctx.Err(); cerr != nil {
		err = fmt.Errorf("testenv: interrupted: %w", cerr)
	}
	if err != nil {
		// Under CI, or interrupted.
		e.stopAll(graceful, r.startedUnits()...)
		if created {
			_ = os.RemoveAll(e.State)
		}
		return nil, nil, err
	}
	vars := []Var{{StateEnv, e.State}}
	if e.root != "" {
		vars = append(vars, Var{ScriptEnv, filepath.Join(e.root, "scripts", "testenv")})
	}
	for _, n := range Names() {
		if u, ok := r.urls[n]; ok && u != "" {
			vars = append(vars, Var{EnvVar(n), u})
		}
	}
	e.logf("up done")
	return e, vars, nil
}

func logOrDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// upRun is one call of Up.
type upRun struct {
	e     *Env
	cfg   Config
	given func(string) string

	mu      sync.Mutex
	done    map[string]chan struct{} // closed when a server is up or failed
	urls    map[string]string        // exported URLs
	started []*unit                  // units this run started
	fatal   []error                  // failures under CI
}

func (r *upRun) startedUnits() []*unit {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.started)
}

// fail applies the failure policy to one server.
func (r *upRun) fail(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfg.CI {
		r.e.logf("ERROR: %v (CI=true, so this is fatal)", err)
		r.fatal = append(r.fatal, err)
		return
	}
	r.e.logf("WARNING: %v -- %s not set, its tests will be skipped", err, EnvVar(name))
}

func (r *upRun) run(ctx context.Context, order []string) error {
	e := r.e
	var todo []*unit
	for _, n := range order {
		r.done[n] = make(chan struct{})
	}
	for _, n := range order {
		u, err := e.unit(n)
		if err != nil {
			r.fail(n, err)
			close(r.done[n])
			continue
		}
		v := EnvVar(n)
		val, recorded := r.given(v), e.URL(n)
		switch {
		case val != "" && val != recorded:
			e.logf("%s: %s is set, using that server", n, v)
			r.urls[n] = val
			close(r.done[n])
		case recorded != "" && u.alive() && u.isReady(ctx) == nil:
			e.logf("%s: already running (%s)", n, recorded)
			r.urls[n] = recorded
			close(r.done[n])
		default:
			todo = append(todo, u)
		}
	}

	// Debian packages (and PostgreSQL's system user): one install for all.
	failed := map[string]bool{}
	var pkgs []string
	needUser := ""
	for _, u := range todo {
		pkgs = append(pkgs, u.srv.packages()...)
		if os.Geteuid() == 0 && strings.HasPrefix(u.srv.name, "postgres") {
			if _, err := user.Lookup(pgSystemUser); err != nil {
				needUser = pgSystemUser
			}
		}
	}
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	if len(pkgs) > 0 || needUser != "" {
		if err := e.installPackages(ctx, pkgs, needUser); err != nil {
			e.logf("WARNING: %v", err)
			for _, u := range todo {
				if missing := u.srv.packages(); len(missing) > 0 {
					failed[u.srv.name] = true
					r.fail(u.srv.name, &StepError{Name: u.srv.name, Step: "install", Err: fmt.Errorf("cannot install Debian packages %s: %w", strings.Join(missing, " "), err)})
				}
			}
		}
	}

	var wg sync.WaitGroup
	for _, u := range todo {
		if failed[u.srv.name] {
			close(r.done[u.srv.name])
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(r.done[u.srv.name])
			url, err := r.bring(ctx, u)
			if err != nil {
				r.fail(u.srv.name, err)
				return
			}
			r.mu.Lock()
			r.urls[u.srv.name] = url
			r.mu.Unlock()
		}()
	}
	wg.Wait()
	return errors.Join(r.fatal...)
}

var portInUse = regexp.MustCompile(`(?i)address already in use|EADDRINUSE|BindException`)

// bring starts one server and waits until it serves: after the servers it
// needs, with new ports (twice at most) when its first ports were taken
// between the pick and the bind.
func (r *upRun) bring(ctx context.Context, u *unit) (string, error) {
	e := r.e
	u.deps = map[string]string{}
	for _, d := range u.srv.needs {
		select {
		case <-r.done[d]:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		r.mu.Lock()
		url := r.urls[d]
		r.mu.Unlock()
		if url == "" {
			return "", &StepError{Name: u.srv.name, Step: "start", Err: fmt.Errorf("it needs %s, which did not start", d)}
		}
		u.deps[d] = url
	}
	fresh := !u.initialized()
	for attempt := 1; ; attempt++ {
		if !u.alive() {
			e.logf("%s: starting", u.srv.name)
			err := u.bringup(ctx, true)
			r.mu.Lock()
			r.started = append(r.started, u)
			r.mu.Unlock()
			if err != nil {
				e.stopAll(graceful, u)
				var se *StepError
				if errors.As(err, &se) && se.Step != "install" {
					se.Log = u.logTails()
				}
				return "", err
			}
		}
		err := u.waitReady(ctx, e.Timeout)
		if err == nil {
			e.logf("%s: ready", u.srv.name)
			break
		}
		if fresh && attempt < 3 && !u.alive() && u.logsMatch(portInUse) {
			e.logf("WARNING: %s: port already in use, trying new ports", u.srv.name)
			e.stopAll(graceful, u) // the other members of a cluster
			for _, l := range u.logs() {
				_ = os.Rename(l, filepath.Join(e.State, fmt.Sprintf("%s.failed-%d", filepath.Base(l), attempt)))
			}
			if err := os.RemoveAll(u.dir); err != nil {
				return "", err
			}
			u.vars = map[string]string{}
			continue
		}
		e.stopAll(graceful, u)
		return "", &StepError{Name: u.srv.name, Step: "ready", Err: err, Log: u.logTails()}
	}
	if err := u.finish(ctx); err != nil {
		e.stopAll(graceful, u)
		return "", err
	}
	return e.URL(u.srv.name), nil
}

func (u *unit) logsMatch(re *regexp.Regexp) bool {
	for _, l := range u.logs() {
		if b, err := os.ReadFile(l); err == nil && re.Match(b) {
			return true
		}
	}
	return false
}
