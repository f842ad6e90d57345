package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// servers is every server testenv can start, by name.
var servers = map[string]*server{}

func init() {
	for _, s := range []*server{
		postgresServer("postgres", false), postgresServer("postgres-stock", true),
		redisServer("redis", false), redisServer("redis-stock", true),
		etcdServer(), zookeeperServer("zookeeper", false), zookeeperServer("zookeeper-stock", true),
		mongoServer(), mongoPGServer(),
		etcd3Server(), zookeeper3Server(), redishaServer(), redisClusterServer(),
		mysqlServer("mysql", false), mysqlServer("mysql-stock", true),
		natsServer("nats", false), natsServer("nats-stock", true),
		postgresHAServer("postgresha", false), postgresHAServer("postgresha-sync", true),
		nats3Server(),
	} {
		servers[s.name] = s
	}
}

func noPackages() []string { return nil }

func lookBin(name string, fallbacks ...string) (string, bool) {
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	for _, f := range fallbacks {
		if fi, err := os.Stat(f); err == nil && fi.Mode()&0o111 != 0 {
			return f, true
		}
	}
	return "", false
}

func cmdOutput(ctx context.Context, argv ...string) string {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
	if err != nil {
		return "version unknown"
	}
	return strings.TrimSpace(string(out))
}

// ---------------------------------------------------------------- PostgreSQL

// PostgreSQL: Debian's `postgresql` package, run as the `postgres` system
// user when testenv runs as root (PostgreSQL refuses root). Data in
// NAME/data, unix socket in NAME/run, TCP on 127.0.0.1 only, trust auth,
// fsync at its default (on). Tests get superuser fencelock and database
// fencelock. The stock variant keeps initdb's postgresql.conf but where
// it listens.
const (
	pgSystemUser = "postgres"
	pgTestUser   = "fencelock"
	pgTestDB     = "fencelock"
)

// pgBindir returns the newest /usr/lib/postgresql/N/bin with initdb,
// postgres and pg_isready, else the directory of postgres on PATH.
func pgBindir() (string, bool) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	best := ""
	for _, d := range dirs {
		if fileExists(filepath.Join(d, "initdb")) && fileExists(filepath.Join(d, "postgres")) && fileExists(filepath.Join(d, "pg_isready")) {
			best = d
		}
	}
	if best == "" {
		if p, ok := lookBin("postgres"); ok {
			if _, ok := lookBin("initdb"); ok {
				best = filepath.Dir(p)
			}
		}
	}
	return best, best != ""
}

// pgCred is the credential the server runs with: PG_USER's when root.
func pgCred(u *unit) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	return userCred(u.get("PG_USER"))
}

func userCred(name string) (*syscall.Credential, error) {
	usr, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(usr.Uid)
	gid, _ := strconv.Atoi(usr.Gid)
	c := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if ids, err := usr.GroupIds(); err == nil {
		for _, g := range ids {
			if n, err := strconv.Atoi(g); err == nil {
				c.Groups = append(c.Groups, uint32(n))
			}
		}
	}
	return c, nil
}

func pgAddrOf(u *unit) pgAddr {
	return pgAddr{hostport: hostPort(u.port("PG_PORT")), user: pgTestUser, db: pgTestDB}
}

// LibFaketime is the preload library of Debian's faketime package, which
// the PostgreSQL servers' install step installs when it is missing.
const LibFaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"

func postgresServer(name string, stock bool) *server {
	s := &server{name: name, stopSig: syscall.SIGINT} // "fast" shutdown; TERM waits for clients to leave
	s.packages = func() []string {
		var pkgs []string
		if _, ok := pgBindir(); !ok {
			pkgs = append(pkgs, "postgresql")
		}
		// The safety suite's postgres-faketime row runs a PostgreSQL of
		// its own under Debian's libfaketime (safety/clockjump_test.go).
		if _, err := os.Stat(LibFaketime); err != nil {
			pkgs = append(pkgs, "faketime")
		}
		return pkgs
	}
	s.install = func(ctx context.Context, u *unit) error {
		bin, ok := pgBindir()
		if !ok {
			return errors.New("no PostgreSQL server binaries (initdb, postgres) found")
		}
		if err := u.save("PG_BIN", bin); err != nil {
			return err
		}
		usr := pgSystemUser
		if os.Geteuid() != 0 {
			cur, err := user.Current()
			if err != nil {
				return err
			}
			usr = cur.Username
		}
		return u.save("PG_USER", usr)
	}
	s.init = func(ctx context.Context, u *unit) error {
		if err := pgInitData(ctx, u); err != nil {
			return err
		}
		conf := fmt.Sprintf(`
# ---- fencelock testenv%s ----
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
`, map[bool]string{true: " (stock: only where it listens)", false: ""}[stock], u.port("PG_PORT"), filepath.Join(u.dir, "run"))
		if !stock {
			conf += "max_connections = 300\nlogging_collector = off\nlog_destination = 'stderr'\nlog_line_prefix = '%m [%p] '\n"
		}
		f, err := os.OpenFile(filepath.Join(u.dir, "data", "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	s.start = func(u *unit, _ string) error {
		// After a kill -9 the old postmaster may still be an unreaped
		// zombie, which postgres takes for a live one: drop lock files
		// whose PID is dead or a zombie.
		locks, _ := filepath.Glob(filepath.Join(u.dir, "run", ".s.PGSQL.*.lock"))
		for _, lock := range append([]string{filepath.Join(u.dir, "data", "postmaster.pid")}, locks...) {
			b, err := os.ReadFile(lock)
			if err != nil {
				continue
			}
			pid, err := strconv.Atoi(firstLine(string(b)))
			if err != nil || !running(pid) {
				_ = os.Remove(lock)
			}
		}
		cred, err := pgCred(u)
		if err != nil {
			return err
		}
		return u.spawn("", cred, filepath.Join(u.get("PG_BIN"), "postgres"), "-D", filepath.Join(u.dir, "data"))
	}
	s.ready = func(ctx context.Context, u *unit) error { return pgPing(ctx, pgAddrOf(u), "postgres") }
	s.setup = func(ctx context.Context, u *unit) error {
		a := pgAddrOf(u)
		a.db = "postgres"
		return pgCreateDatabase(ctx, a, pgTestDB)
	}
	s.url = func(u *unit) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", pgTestUser, u.port("PG_PORT"), pgTestDB)
	}
	s.version = func(ctx context.Context, u *unit) string {
		return cmdOutput(ctx, filepath.Join(u.get("PG_BIN"), "postgres"), "--version")
	}
	return s
}

// pgInitData picks the port (PG_PORT) and makes the data dir with initdb's
// own postgresql.conf. initdb takes seconds on a busy machine: a pristine
// copy of its result is kept in the cache, keyed by server version and
// initdb options (as scripts/testenv did), and copied.
func pgInitData(ctx context.Context, u *unit) error {
	if _, err := u.savePort("PG_PORT"); err != nil {
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
	if err := os.Chmod(data, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(u.dir, 0o755); err != nil {
		return err
	}
	cred, err := pgCred(u)
	if err != nil {
		return err
	}
	chown := func(p string) error {
		if cred == nil {
			return nil
		}
		return os.Lchown(p, int(cred.Uid), int(cred.Gid))
	}
	if cred != nil {
		for _, d := range []string{data, run} {
			if err := chown(d); err != nil {
				return err
			}
		}
		// The state dir must be reachable for the postgres user.
		test := exec.CommandContext(ctx, "test", "-w", data)
		test.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if test.Run() != nil {
			return fmt.Errorf("user %s cannot reach %s (is TMPDIR private?)", u.get("PG_USER"), u.dir)
		}
	}
	bin := u.get("PG_BIN")
	opts := []string{"-U", pgTestUser, "--auth=trust", "--no-locale", "--encoding=UTF8", "--no-sync"}
	ver, err := exec.CommandContext(ctx, filepath.Join(bin, "postgres"), "--version").Output()
	if err != nil {
		return fmt.Errorf("postgres --version: %w", err)
	}
	key := sha256hex(append(ver, []byte(strings.Join(opts, "\n")+"\n")...))[:16]
	template := filepath.Join(u.e.cache, "postgres-initdb-"+key)
	logf, err := os.OpenFile(u.logFile(""), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	if fileExists(filepath.Join(template, "PG_VERSION")) {
		if err := copyTree(template, data, chown); err == nil {
			fmt.Fprintf(logf, "initdb: copied from %s\n", template)
			return nil
		}
	}
	if err := os.RemoveAll(data); err != nil {
		return err
	}
	if err := os.Mkdir(data, 0o700); err != nil {
		return err
	}
	if err := chown(data); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), append([]string{"-D", data}, opts...)...)
	cmd.Dir = u.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("initdb failed (log: %s): %w", u.logFile(""), err)
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

// ---------------------------------------------------------------- Redis

// Redis: Debian's redis-server with AOF and `appendfsync always`, so an
// acknowledged write survives a kill -9. The stock variant includes the
// packaged /etc/redis/redis.conf (when readable; else redis-server's
// built-in defaults): RDB snapshots, no AOF; only where it listens is set.

func redisBin() (string, bool) { return lookBin("redis-server", "/usr/bin/redis-server") }

func redisServer(name string, stock bool) *server {
	s := &server{name: name}
	s.packages = func() []string {
		if _, ok := redisBin(); !ok {
			return []string{"redis-server"}
		}
		return nil
	}
	s.install = func(ctx context.Context, u *unit) error {
		bin, ok := redisBin()
		if !ok {
			return errors.New("redis-server not found")
		}
		return u.save("REDIS_BIN", bin)
	}
	s.init = func(ctx context.Context, u *unit) error {
		port, err := u.savePort("REDIS_PORT")
		if err != nil {
			return err
		}
		data := filepath.Join(u.dir, "data")
		_ = os.RemoveAll(data)
		if err := os.MkdirAll(data, 0o755); err != nil {
			return err
		}
		var conf string
		if stock {
			include := ""
			if f, err := os.Open("/etc/redis/redis.conf"); err == nil {
				f.Close()
				include = "include /etc/redis/redis.conf"
			}
			conf = fmt.Sprintf(`# made by fencelock testenv: the packaged defaults, except where it listens
%s
port %d
bind 127.0.0.1
daemonize no
supervised no
pidfile %s
logfile ""
dir %s
`, include, port, filepath.Join(u.dir, "redis.pid"), data)
		} else {
			conf = fmt.Sprintf(`# made by fencelock testenv
port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
logfile ""
save ""
appendonly yes
appendfsync always
`, port, data)
		}
		return os.WriteFile(filepath.Join(u.dir, "redis.conf"), []byte(conf), 0o644)
	}
	s.start = func(u *unit, _ string) error {
		return u.spawn("", nil, u.get("REDIS_BIN"), filepath.Join(u.dir, "redis.conf"))
	}
	s.ready = func(ctx context.Context, u *unit) error { return redisPing(ctx, hostPort(u.port("REDIS_PORT"))) }
	s.url = func(u *unit) string { return fmt.Sprintf("redis://127.0.0.1:%d/0", u.port("REDIS_PORT")) }
	s.version = func(ctx context.Context, u *unit) string { return cmdOutput(ctx, u.get("REDIS_BIN"), "--version") }
	return s
}

// ---------------------------------------------------------------- etcd

// etcd v3.6 embedded in tools/etcd-test-server: a single member, client
// and peer ports on 127.0.0.1, data in etcd/data.

func (u *unit) buildEtcd(ctx context.Context) error {
	if u.e.root == "" {
		return errors.New("the checkout (tools/etcd-test-server) was not found")
	}
	bin, err := u.e.goBuild(ctx, filepath.Join(u.e.root, "tools", "etcd-test-server"), "etcd-test-server")
	if err != nil {
		return err
	}
	return u.save("ETCD_BIN", bin)
}

func etcdVersion(ctx context.Context, addr string) string {
	b, err := httpDo(ctx, "GET", "http://"+addr+"/version", "")
	if err != nil {
		return "version unknown"
	}
	return strings.TrimSpace(string(b))
}

func etcdServer() *server {
	s := &server{name: "etcd", packages: noPackages}
	s.install = func(ctx context.Context, u *unit) error { return u.buildEtcd(ctx) }
	s.init = func(ctx context.Context, u *unit) error {
		if _, err := u.savePort("ETCD_CLIENT_PORT"); err != nil {
			return err
		}
		if _, err := u.savePort("ETCD_PEER_PORT"); err != nil {
			return err
		}
		return os.RemoveAll(filepath.Join(u.dir, "data"))
	}
	s.start = func(u *unit, _ string) error {
		return u.spawn("", nil, u.get("ETCD_BIN"), "--data-dir", filepath.Join(u.dir, "data"), "--name", "fencelock-test",
			"--client-port", u.get("ETCD_CLIENT_PORT"), "--peer-port", u.get("ETCD_PEER_PORT"))
	}
	s.ready = func(ctx context.Context, u *unit) error { return etcdHealth(ctx, hostPort(u.port("ETCD_CLIENT_PORT"))) }
	s.url = func(u *unit) string { return fmt.Sprintf("etcd://127.0.0.1:%d", u.port("ETCD_CLIENT_PORT")) }
	s.version = func(ctx context.Context, u *unit) string {
		return etcdVersion(ctx, hostPort(u.port("ETCD_CLIENT_PORT")))
	}
	return s
}

// ---------------------------------------------------------------- ZooKeeper

// ZooKeeper 3.8 from Debian's libzookeeper-java and a headless JRE, run
// with java as a standalone server: tickTime=200 (sessions of 400 ms to
// 60 s), TTL nodes on, admin server off, all four-letter words allowed.
// The stock variant has the distribution's zoo_sample.cfg settings.

const zkJar = "/usr/share/java/zookeeper.jar"

func zkJava() (string, bool) {
	if p, ok := lookBin("java"); ok {
		return p, true
	}
	js, _ := filepath.Glob("/usr/lib/jvm/*/bin/java")
	for _, j := range js {
		if fi, err := os.Stat(j); err == nil && fi.Mode()&0o111 != 0 {
			return j, true
		}
	}
	return "", false
}

func zkPackages() []string {
	var p []string
	if !fileExists(zkJar) {
		p = append(p, "libzookeeper-java")
	}
	if _, ok := zkJava(); !ok {
		p = append(p, "default-jre-headless")
	}
	return p
}

func zkInstall(ctx context.Context, u *unit) error {
	java, ok := zkJava()
	if !ok {
		return errors.New("no java found")
	}
	if !fileExists(zkJar) {
		return fmt.Errorf("%s not found (Debian package libzookeeper-java)", zkJar)
	}
	return u.save("ZK_JAVA", java)
}

// zkClasspath: our conf dir (log4j.properties), the server jar (its
// manifest lists the other jars), and Debian's slf4j->log4j 1.2 binding
// so that it really logs.
func zkClasspath(u *unit) string {
	cp := filepath.Join(u.dir, "conf") + ":" + zkJar
	for _, j := range []string{"/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"} {
		if fileExists(j) {
			cp += ":" + j
		}
	}
	return cp
}

const zkLog4j = `# made by fencelock testenv; stdout goes to the log file in the state dir
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
`

func zookeeperServer(name string, stock bool) *server {
	s := &server{name: name, packages: zkPackages, install: zkInstall}
	s.init = func(ctx context.Context, u *unit) error {
		port, err := u.savePort("ZK_PORT")
		if err != nil {
			return err
		}
		data, conf := filepath.Join(u.dir, "data"), filepath.Join(u.dir, "conf")
		for _, d := range []string{data, conf} {
			_ = os.RemoveAll(d)
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		var cfg string
		if stock {
			cfg = fmt.Sprintf(`# made by fencelock testenv: the distribution's zoo_sample.cfg, except
# where it listens (clientPort, clientPortAddress, dataDir, admin server off)
tickTime=2000
initLimit=10
syncLimit=5
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
admin.enableServer=false
`, data, port)
		} else {
			cfg = fmt.Sprintf(`# made by fencelock testenv
tickTime=200
minSessionTimeout=400
maxSessionTimeout=60000
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
extendedTypesEnabled=true
autopurge.purgeInterval=0
`, data, port)
		}
		if err := os.WriteFile(filepath.Join(conf, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(conf, "log4j.properties"), []byte(zkLog4j), 0o644)
	}
	s.start = func(u *unit, _ string) error {
		argv := []string{u.get("ZK_JAVA"), "-Xms32m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
			"-Djava.awt.headless=true",
			"-Dlog4j.configuration=file:" + filepath.Join(u.dir, "conf", "log4j.properties")}
		if !stock {
			argv = append(argv, "-Dzookeeper.admin.enableServer=false", "-Dzookeeper.extendedTypesEnabled=true",
				"-Dzookeeper.4lw.commands.whitelist=*")
		}
		argv = append(argv, "-cp", zkClasspath(u), "org.apache.zookeeper.server.ZooKeeperServerMain", filepath.Join(u.dir, "conf", "zoo.cfg"))
		return u.spawn("", nil, argv...)
	}
	s.ready = func(ctx context.Context, u *unit) error {
		mode, err := zkMode(ctx, hostPort(u.port("ZK_PORT")))
		if err == nil && mode != "standalone" {
			err = fmt.Errorf("mode %s", mode)
		}
		return err
	}
	s.url = func(u *unit) string { return fmt.Sprintf("zk://127.0.0.1:%d", u.port("ZK_PORT")) }
	s.version = func(ctx context.Context, u *unit) string { return zkVersion(ctx, hostPort(u.port("ZK_PORT"))) }
	return s
}

func zkVersion(ctx context.Context, addr string) string {
	out, _ := zkFourLetter(ctx, addr, "srvr")
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
			return strings.TrimSpace(v)
		}
	}
	return "version unknown"
}

// ---------------------------------------------------------------- MongoDB wire protocol (FerretDB)

// mongo: FerretDB v1.24.0 embedded in tools/ferretdb-test-server with its
// SQLite handler, files in mongo/data. mongo-pg: the same binary with its
// PostgreSQL handler, on database fencelock_ferretdb of the postgres test
// server (or of FENCELOCK_TEST_POSTGRES when that names your own server).

// mongoPGDatabase is mongo-pg's database on the PostgreSQL server.
const mongoPGDatabase = "fencelock_ferretdb"

func (u *unit) buildFerretDB(ctx context.Context) error {
	if u.e.root == "" {
		return errors.New("the checkout (tools/ferretdb-test-server) was not found")
	}
	bin, err := u.e.goBuild(ctx, filepath.Join(u.e.root, "tools", "ferretdb-test-server"), "ferretdb-test-server")
	if err != nil {
		return err
	}
	return u.save("MONGO_BIN", bin)
}

func mongoURL(u *unit) string { return fmt.Sprintf("mongodb://127.0.0.1:%d/", u.port("MONGO_PORT")) }

func mongoServer() *server {
	s := &server{name: "mongo", packages: noPackages}
	s.install = func(ctx context.Context, u *unit) error { return u.buildFerretDB(ctx) }
	s.init = func(ctx context.Context, u *unit) error {
		if _, err := u.savePort("MONGO_PORT"); err != nil {
			return err
		}
		data := filepath.Join(u.dir, "data")
		_ = os.RemoveAll(data)
		return os.MkdirAll(data, 0o755)
	}
	s.start = func(u *unit, _ string) error {
		return u.spawn("", nil, u.get("MONGO_BIN"), "-data-dir", filepath.Join(u.dir, "data"), "-port", u.get("MONGO_PORT"))
	}
	s.ready = func(ctx context.Context, u *unit) error { return mongoReady(ctx, hostPort(u.port("MONGO_PORT")), "") }
	s.url = mongoURL
	s.version = func(context.Context, *unit) string { return "FerretDB v1.24.0 (embedded, SQLite backend)" }
	return s
}

func mongoPGServer() *server {
	s := &server{name: "mongo-pg", packages: noPackages, needs: []string{"postgres"}}
	s.install = func(ctx context.Context, u *unit) error { return u.buildFerretDB(ctx) }
	s.init = func(ctx context.Context, u *unit) error {
		if _, err := u.savePort("MONGO_PORT"); err != nil {
			return err
		}
		pu, err := url.Parse(u.deps["postgres"])
		if err != nil || pu.Host == "" {
			return errors.New("the postgres URL cannot be parsed")
		}
		pw, _ := pu.User.Password()
		a := pgAddr{hostport: pu.Host, user: pu.User.Username(), password: pw, db: strings.TrimPrefix(pu.Path, "/")}
		if pu.Port() == "" {
			a.hostport = pu.Host + ":5432"
		}
		if err := pgCreateDatabase(ctx, a, mongoPGDatabase); err != nil {
			return fmt.Errorf("creating database %s on the postgres server: %w", mongoPGDatabase, err)
		}
		pu.Path = "/" + mongoPGDatabase
		return u.save("MONGO_PG_POSTGRESQL_URL", pu.String())
	}
	s.start = func(u *unit, _ string) error {
		return u.spawn("", nil, u.get("MONGO_BIN"), "-handler=postgresql",
			"-postgresql-url="+u.get("MONGO_PG_POSTGRESQL_URL"), "-port", u.get("MONGO_PORT"))
	}
	// hello, and a command that needs the PostgreSQL backend to answer.
	s.ready = func(ctx context.Context, u *unit) error {
		return mongoReady(ctx, hostPort(u.port("MONGO_PORT")), "fencelock")
	}
	s.url = mongoURL
	s.version = func(context.Context, *unit) string {
		return "FerretDB v1.24.0 (embedded, PostgreSQL backend, database " + mongoPGDatabase + ")"
	}
	return s
}
