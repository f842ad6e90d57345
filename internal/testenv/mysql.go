package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ---------------------------------------------------------------- MariaDB

// mysql: Debian's mariadb-server (MariaDB 10.11 on bookworm), run as
// mariadbd with a defaults file of its own: data in NAME/data (made by
// mariadb-install-db, whose result is cached like initdb's), socket and pid
// file in NAME/run, TCP on 127.0.0.1 only. Durable settings are spelt out:
// innodb_flush_log_at_trx_commit=1, doublewrite on, no binary log (so
// sync_binlog does not apply). Tests get user fencelock (no password, every
// privilege, so that they may create and drop tables and read the
// replication status) and database fencelock. mysql-stock includes the
// distribution's /etc/mysql/my.cnf and sets only where it listens and
// keeps its files.

const (
	mysqlTestUser = "fencelock"
	mysqlTestDB   = "fencelock"
)

func mariadbBins() (mariadbd, installDB, client string, ok bool) {
	mariadbd, ok1 := lookBin("mariadbd", "/usr/sbin/mariadbd")
	installDB, ok2 := lookBin("mariadb-install-db", "/usr/bin/mariadb-install-db")
	client, ok3 := lookBin("mariadb", "/usr/bin/mariadb")
	return mariadbd, installDB, client, ok1 && ok2 && ok3
}

// mysqlSocket is the server's unix socket, which the probes and the setup
// use as root (root@localhost has no password and is reachable only there).
func mysqlSocket(u *unit) string { return filepath.Join(u.dir, "run", "mysqld.sock") }

// mysqlClient runs one statement with the mariadb client as root, over the
// socket, with probeTimeout as its bound.
func mysqlClient(ctx context.Context, u *unit, sql string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, u.get("MYSQL_CLIENT"), "--no-defaults", "--socket="+mysqlSocket(u),
		"--user=root", "--connect-timeout=3", "--batch", "--skip-column-names", "-e", sql)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s: %w", strings.TrimSpace(string(out)), err)
	}
	return strings.TrimSpace(string(out)), nil
}

func mysqlServer(name string, stock bool) *server {
	s := &server{name: name} // SIGTERM is mariadbd's clean shutdown
	s.packages = func() []string {
		if _, _, _, ok := mariadbBins(); !ok {
			return []string{"mariadb-server"}
		}
		return nil
	}
	s.install = func(ctx context.Context, u *unit) error {
		d, i, c, ok := mariadbBins()
		if !ok {
			return errors.New("no MariaDB binaries (mariadbd, mariadb-install-db, mariadb) found (Debian package mariadb-server)")
		}
		for k, v := range map[string]string{"MYSQL_BIN": d, "MYSQL_INSTALL_DB": i, "MYSQL_CLIENT": c} {
			if err := u.save(k, v); err != nil {
				return err
			}
		}
		return nil
	}
	s.init = func(ctx context.Context, u *unit) error {
		port, err := u.savePort("MYSQL_PORT")
		if err != nil {
			return err
		}
		data, run := filepath.Join(u.dir, "data"), filepath.Join(u.dir, "run")
		for _, d := range []string{data, run} {
			if err := os.RemoveAll(d); err != nil {
				return err
			}
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		where := fmt.Sprintf(`datadir = %s
socket = %s
pid-file = %s
port = %d
bind-address = 127.0.0.1
`, data, mysqlSocket(u), filepath.Join(run, "mysqld.pid"), port)
		var conf string
		if stock {
			conf = "# made by fencelock testenv: the distribution's configuration, except\n# where it listens and keeps its files\n"
			if fileExists("/etc/mysql/my.cnf") {
				conf += "!include /etc/mysql/my.cnf\n"
			}
			conf += "[mariadbd]\n" + where
		} else {
			conf = "# made by fencelock testenv\n[mariadbd]\n" + where + `skip-name-resolve
skip-log-bin
innodb_flush_log_at_trx_commit = 1
innodb_doublewrite = 1
innodb_buffer_pool_size = 64M
max_connections = 300
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
`
		}
		if err := os.WriteFile(filepath.Join(u.dir, "my.cnf"), []byte(conf), 0o644); err != nil {
			return err
		}
		return mysqlInstallDB(ctx, u, data)
	}
	s.start = func(u *unit, _ string) error {
		argv := []string{u.get("MYSQL_BIN"), "--defaults-file=" + filepath.Join(u.dir, "my.cnf")}
		if os.Geteuid() == 0 {
			argv = append(argv, "--user=root")
		}
		return u.spawn("", nil, argv...)
	}
	s.ready = func(ctx context.Context, u *unit) error {
		_, err := mysqlClient(ctx, u, "SELECT 1")
		return err
	}
	s.setup = func(ctx context.Context, u *unit) error {
		_, err := mysqlClient(ctx, u, fmt.Sprintf("CREATE DATABASE IF NOT EXISTS %s; CREATE USER IF NOT EXISTS '%s'@'%%'; GRANT ALL PRIVILEGES ON *.* TO '%s'@'%%'",
			mysqlTestDB, mysqlTestUser, mysqlTestUser))
		return err
	}
	s.url = func(u *unit) string {
		return fmt.Sprintf("mysql://%s@127.0.0.1:%d/%s", mysqlTestUser, u.port("MYSQL_PORT"), mysqlTestDB)
	}
	s.version = func(ctx context.Context, u *unit) string { return cmdOutput(ctx, u.get("MYSQL_BIN"), "--version") }
	return s
}

// mysqlInstallDB makes the system tables in data with mariadb-install-db,
// or copies them from the cache (keyed by the server's version and the
// options), since it takes seconds on a busy machine.
func mysqlInstallDB(ctx context.Context, u *unit, data string) error {
	opts := []string{"--auth-root-authentication-method=normal", "--skip-test-db"}
	ver, err := exec.CommandContext(ctx, u.get("MYSQL_BIN"), "--version").Output()
	if err != nil {
		return fmt.Errorf("mariadbd --version: %w", err)
	}
	key := sha256hex(append(ver, []byte(strings.Join(opts, "\n")+"\n")...))[:16]
	template := filepath.Join(u.e.cache, "mariadb-install-db-"+key)
	logf, err := os.OpenFile(u.logFile(""), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	if fileExists(filepath.Join(template, "mysql")) {
		if err := copyTree(template, data, nil); err == nil {
			fmt.Fprintf(logf, "mariadb-install-db: copied from %s\n", template)
			return nil
		}
		if err := os.RemoveAll(data); err != nil {
			return err
		}
		if err := os.MkdirAll(data, 0o755); err != nil {
			return err
		}
	}
	argv := append([]string{"--defaults-file=" + filepath.Join(u.dir, "my.cnf"), "--datadir=" + data}, opts...)
	if os.Geteuid() == 0 {
		argv = append(argv, "--user=root")
	}
	cmd := exec.CommandContext(ctx, u.get("MYSQL_INSTALL_DB"), argv...)
	cmd.Dir = u.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mariadb-install-db failed (log: %s): %w", u.logFile(""), err)
	}
	tmp := fmt.Sprintf("%s.tmp.%d", template, os.Getpid())
	if os.MkdirAll(u.e.cache, 0o755) == nil && copyTree(data, tmp, nil) == nil {
		if os.Rename(tmp, template) != nil {
			_ = os.RemoveAll(tmp)
		}
	} else {
		_ = os.RemoveAll(tmp)
	}
	return nil
}
