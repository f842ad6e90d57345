package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ---------------------------------------------------------------- postgresha, postgresha-sync

// postgresha: a PostgreSQL primary (member 1 at first) and a standby (2)
// fed by streaming replication, both from Debian's postgresql like the
// postgres server (run as the postgres system user when root, trust auth,
// fsync on). The standby is a pg_basebackup of the primary with
// standby.signal and primary_conninfo (application_name member1 or
// member2); nothing promotes it by itself: Promote (or Failover, a clean
// switchover) does. A member started while the other one is the primary
// and its own data is not a standby's (it was the primary before a
// failover) is made a standby again with a fresh pg_basebackup.
//
// postgresha replicates asynchronously (the default). postgresha-sync names
// both members in synchronous_standby_names ('FIRST 1 (member1,
// member2)') with synchronous_commit = remote_apply: a commit returns once
// the standby has applied it, and while the standby is down every commit
// waits for it.
//
// URL: postgres://fencelock@127.0.0.1:P1,127.0.0.1:P2/fencelock?sslmode=disable&target_session_attrs=read-write
// (pgx tries the hosts in turn and keeps the one that accepts writes).

// pghaNames are the PostgreSQL clusters.
var pghaNames = []string{"postgresha", "postgresha-sync"}

func postgresHAServer(name string, sync bool) *server {
	s := &server{name: name, members: []string{"1", "2"}, stopSig: syscall.SIGINT}
	pg := servers["postgres"]
	if pg == nil {
		pg = postgresServer("postgres", false)
	}
	s.packages, s.install = pg.packages, pg.install
	port := func(u *unit, id string) int { return u.port("PGHA_PORT_" + id) }
	addr := func(u *unit, id string) string { return hostPort(port(u, id)) }
	pga := func(u *unit, id string) pgAddr {
		return pgAddr{hostport: addr(u, id), user: pgTestUser, db: "postgres"}
	}
	data := func(u *unit, id string) string { return filepath.Join(u.mdir(id), "data") }
	run := func(u *unit, id string) string { return filepath.Join(u.mdir(id), "run") }
	other := func(id string) string { return map[string]string{"1": "2", "2": "1"}[id] }

	s.init = func(ctx context.Context, u *unit) error {
		for _, id := range s.members {
			if _, err := u.savePort("PGHA_PORT_" + id); err != nil {
				return err
			}
			_ = os.RemoveAll(u.mdir(id))
			if err := os.MkdirAll(u.mdir(id), 0o755); err != nil {
				return err
			}
		}
		// Member 1's data from initdb (its cached copy), made in the
		// member's dir by a unit of its own; member 2's is a base backup
		// of it, made when it first starts.
		m := &unit{e: u.e, srv: &server{name: s.name + "-1"}, dir: u.mdir("1"), vars: map[string]string{
			"PG_BIN": u.get("PG_BIN"), "PG_USER": u.get("PG_USER")}}
		if err := pgInitData(ctx, m); err != nil {
			return err
		}
		conf := `
# ---- fencelock testenv (` + s.name + `): port and socket dir are given on the command line ----
listen_addresses = '127.0.0.1'
max_connections = 300
logging_collector = off
log_destination = 'stderr'
log_line_prefix = '%m [%p] '
wal_level = replica
max_wal_senders = 10
wal_keep_size = '256MB'
hot_standby = on
`
		if sync {
			conf += "synchronous_standby_names = 'FIRST 1 (member1, member2)'\nsynchronous_commit = remote_apply\n"
		}
		return appendFile(filepath.Join(data(u, "1"), "postgresql.conf"), conf)
	}

	inRecovery := pgInRecovery

	// rebase makes member id's data a fresh standby of member from.
	rebase := func(ctx context.Context, u *unit, id, from string) error {
		cred, err := pgCred(u)
		if err != nil {
			return err
		}
		d := data(u, id)
		if err := os.RemoveAll(d); err != nil {
			return err
		}
		for _, dir := range []string{d, run(u, id)} {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			if cred != nil {
				if err := os.Lchown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
					return err
				}
			}
		}
		if err := os.Chmod(run(u, id), 0o755); err != nil {
			return err
		}
		logf, err := os.OpenFile(u.logFile(id), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer logf.Close()
		fmt.Fprintf(logf, "\n===== testenv %s: pg_basebackup from member %s\n", time.Now().Format("2006-01-02 15:04:05"), from)
		cmd := exec.CommandContext(ctx, filepath.Join(u.get("PG_BIN"), "pg_basebackup"), "-D", d,
			"-h", "127.0.0.1", "-p", strconv.Itoa(port(u, from)), "-U", pgTestUser, "-X", "stream", "-c", "fast", "--no-sync", "-w")
		cmd.Dir = u.mdir(id)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("pg_basebackup of member %s (log: %s): %w", from, u.logFile(id), err)
		}
		conninfo := fmt.Sprintf("\nprimary_conninfo = 'host=127.0.0.1 port=%d user=%s application_name=member%s'\n", port(u, from), pgTestUser, id)
		if err := appendFile(filepath.Join(d, "postgresql.auto.conf"), conninfo); err != nil {
			return err
		}
		sig := filepath.Join(d, "standby.signal")
		if err := os.WriteFile(sig, nil, 0o600); err != nil {
			return err
		}
		if cred != nil {
			return os.Lchown(sig, int(cred.Uid), int(cred.Gid))
		}
		return nil
	}

	s.start = func(u *unit, id string) error {
		ctx, cancel := context.WithTimeout(context.Background(), u.e.Timeout)
		defer cancel()
		d := data(u, id)
		standby := fileExists(filepath.Join(d, "standby.signal"))
		if !standby {
			// A member without data, or a former primary: a standby of
			// the other member if that one is the primary now.
			o := other(id)
			primary := false
			if _, ok := u.pid(o); ok {
				err := u.waitFor(ctx, u.e.Timeout, u.unitName(o), func() bool { _, ok := u.pid(o); return ok }, func(ctx context.Context) error {
					rec, err := inRecovery(ctx, u, o)
					primary = err == nil && !rec
					return err
				})
				if err != nil {
					return fmt.Errorf("member %s: %w", o, err)
				}
			}
			switch {
			case primary:
				u.e.logf("%s: making it a standby of member %s (pg_basebackup)", u.unitName(id), o)
				if err := rebase(ctx, u, id, o); err != nil {
					return err
				}
			case !fileExists(filepath.Join(d, "PG_VERSION")):
				return fmt.Errorf("member %s has no data and member %s is not a running primary to copy it from", id, o)
			}
		}
		// After a kill -9 the old postmaster may be an unreaped zombie,
		// which postgres takes for a live one: drop stale lock files.
		locks, _ := filepath.Glob(filepath.Join(run(u, id), ".s.PGSQL.*.lock"))
		for _, lock := range append([]string{filepath.Join(d, "postmaster.pid")}, locks...) {
			if b, err := os.ReadFile(lock); err == nil {
				if pid, err := strconv.Atoi(firstLine(string(b))); err != nil || !running(pid) {
					_ = os.Remove(lock)
				}
			}
		}
		cred, err := pgCred(u)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(run(u, id), 0o755); err != nil {
			return err
		}
		if cred != nil {
			if err := os.Lchown(run(u, id), int(cred.Uid), int(cred.Gid)); err != nil {
				return err
			}
		}
		return u.spawn(id, cred, filepath.Join(u.get("PG_BIN"), "postgres"), "-D", d,
			"-p", strconv.Itoa(port(u, id)), "-k", run(u, id))
	}
	s.memberReady = func(ctx context.Context, u *unit, id string) error { return pgPing(ctx, pga(u, id), "postgres") }
	s.addr = addr
	s.leader = func(ctx context.Context, u *unit) (string, error) {
		for _, id := range s.members {
			if !u.active(id) {
				continue
			}
			if rec, err := inRecovery(ctx, u, id); err == nil && !rec {
				return id, nil
			}
		}
		return "", ErrNoLeader
	}
	// ready: one member is the primary and the other streams from it
	// (synchronously for postgresha-sync).
	s.ready = func(ctx context.Context, u *unit) error {
		p, err := s.leader(ctx, u)
		if err != nil {
			return errors.New("no member is primary yet")
		}
		o := other(p)
		if rec, err := inRecovery(ctx, u, o); err != nil || !rec {
			return fmt.Errorf("member %s is not a standby yet (%v)", o, err)
		}
		c, err := pga(u, p).connect(ctx, "")
		if err != nil {
			return err
		}
		defer c.Close()
		rows, err := c.query("SELECT application_name, state, sync_state FROM pg_stat_replication")
		if err != nil {
			return err
		}
		want := []string{"member" + o, "streaming", "async"}
		if sync {
			want[2] = "sync"
		}
		for _, r := range rows {
			if slices.Equal(r, want) {
				return nil
			}
		}
		return fmt.Errorf("the primary (member %s) does not see member %s as %v yet: %v", p, o, want, rows)
	}
	s.setup = func(ctx context.Context, u *unit) error {
		p, err := s.leader(ctx, u)
		if err != nil {
			return err
		}
		a := pga(u, p)
		a.db = "postgres"
		return pgCreateDatabase(ctx, a, pgTestDB)
	}
	s.url = func(u *unit) string {
		return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&target_session_attrs=read-write", pgTestUser, joinAddrs(u, s.members, addr), pgTestDB)
	}
	// failover: a clean switchover. The primary stops (a fast shutdown
	// sends the standby all its WAL first), the standby is promoted, and
	// the old primary starts again as its standby.
	s.failover = func(ctx context.Context, u *unit) error {
		old, err := s.leader(ctx, u)
		if err != nil {
			return fmt.Errorf("testenv: %s: no primary now, nothing to fail over", s.name)
		}
		u.e.stopUnits(graceful, map[*unit][]string{u: {old}})
		if err := pgPromote(ctx, u, other(old)); err != nil {
			return err
		}
		if err := u.bringup(ctx, false, old); err != nil {
			return err
		}
		return u.waitReady(ctx, u.e.Timeout)
	}
	s.version = func(ctx context.Context, u *unit) string {
		return cmdOutput(ctx, filepath.Join(u.get("PG_BIN"), "postgres"), "--version")
	}
	return s
}

// pgPromote promotes the standby id (pg_promote) and waits until it
// accepts writes.
func pgPromote(ctx context.Context, u *unit, id string) error {
	c, err := pgAddr{hostport: u.srv.addr(u, id), user: pgTestUser, db: "postgres"}.connect(ctx, "")
	if err != nil {
		return fmt.Errorf("testenv: %s: promoting member %s: %w", u.srv.name, id, err)
	}
	// wait => false: pg_promote only signals the promotion, so the
	// exchange stays within a probe's deadline however long the standby
	// takes to finish recovery; the wait below is bounded by e.Timeout.
	rows, err := c.query("SELECT pg_promote(false)")
	c.Close()
	if err != nil {
		return fmt.Errorf("testenv: %s: promoting member %s: %w", u.srv.name, id, err)
	}
	if len(rows) != 1 || len(rows[0]) != 1 || rows[0][0] != "t" {
		return fmt.Errorf("testenv: %s: pg_promote() on member %s returned %v", u.srv.name, id, rows)
	}
	err = u.waitFor(ctx, u.e.Timeout, u.unitName(id), func() bool { _, ok := u.pid(id); return ok }, func(ctx context.Context) error {
		rec, err := pgInRecovery(ctx, u, id)
		if err == nil && rec {
			err = errors.New("still in recovery")
		}
		return err
	})
	if err == nil {
		u.e.logf("%s: member %s promoted: it is the primary now", u.srv.name, id)
	}
	return err
}

// Promote makes the standby member id of a PostgreSQL cluster (postgresha,
// postgresha-sync) the primary (SELECT pg_promote()) and returns once it
// accepts writes. Kill the primary first (KillMember) to model a failover
// after its crash: with asynchronous replication the standby may lack the
// primary's last commits. Start the killed member again (StartMember) and
// it becomes the new primary's standby (from a fresh pg_basebackup).
func (e *Env) Promote(ctx context.Context, name, id string) error {
	u, err := e.member(name, id)
	if err != nil {
		return err
	}
	if !slices.Contains(pghaNames, name) {
		return fmt.Errorf("%w: %s has no standby to promote (only %s)", ErrNotCluster, name, strings.Join(pghaNames, ", "))
	}
	if !u.active(id) {
		return fmt.Errorf("%w: %s", ErrNotRunning, u.unitName(id))
	}
	return pgPromote(ctx, u, id)
}

// pgInRecovery asks member id whether it is a standby
// (pg_is_in_recovery()).
func pgInRecovery(ctx context.Context, u *unit, id string) (bool, error) {
	c, err := pgAddr{hostport: u.srv.addr(u, id), user: pgTestUser, db: "postgres"}.connect(ctx, "")
	if err != nil {
		return false, err
	}
	defer c.Close()
	rows, err := c.query("SELECT pg_is_in_recovery()")
	if err != nil {
		return false, err
	}
	if len(rows) != 1 || len(rows[0]) != 1 {
		return false, fmt.Errorf("pg_is_in_recovery() returned %v", rows)
	}
	return rows[0][0] == "t", nil
}

// appendFile appends text to an existing file.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
