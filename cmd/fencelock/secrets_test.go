//go:build unix

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/migrate"
)

// logRecorder is a slog.Handler that keeps every record, at every level,
// with all its attributes and groups, as text.
type logRecorder struct {
	mu    *sync.Mutex
	buf   *bytes.Buffer
	attrs []slog.Attr
	group string
}

func newLogRecorder() *logRecorder { return &logRecorder{mu: new(sync.Mutex), buf: new(bytes.Buffer)} }

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(h.buf, "%s %s %s", r.Level, h.group, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(h.buf, " %s=%v", a.Key, a.Value.Any())
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(h.buf, " %s=%v", a.Key, a.Value.Any())
		return true
	})
	h.buf.WriteByte('\n')
	return nil
}

func (h *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	h2 := *h
	h2.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &h2
}

func (h *logRecorder) WithGroup(g string) slog.Handler {
	h2 := *h
	h2.group += g + "."
	return &h2
}

func (h *logRecorder) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.buf.String()
}

// inProcess runs the fencelock command in this process and returns its
// output (stdout and stderr) and exit status.
func inProcess(args ...string) (string, int) {
	var out bytes.Buffer
	var mu sync.Mutex
	w := &lockedWriter{mu: &mu, w: &out}
	e := &env{stdin: strings.NewReader(""), stdout: w, stderr: w, getenv: func(string) string { return "" }}
	code := e.main(args)
	mu.Lock()
	defer mu.Unlock()
	return out.String(), code
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// secretURLs returns URLs of every registered scheme (and an unknown one)
// with secret in every position a credential can take: userinfo, query
// parameters (the generic ones and each backend's own), repeated
// parameters, nested URLs, malformed URLs, unreachable hosts, and wrong
// passwords against the real servers of scripts/testenv where they run.
func secretURLs(t *testing.T, secret string) []string {
	esc := url.QueryEscape
	host := func(env, def string) (string, string) {
		raw := os.Getenv(env)
		u, err := url.Parse(raw)
		if raw == "" || err != nil || u.Host == "" {
			return def, ""
		}
		return u.Host, u.RawQuery
	}
	pgHost, pgQuery := host("FENCELOCK_TEST_POSTGRES", "127.0.0.1:1")
	redisHost, _ := host("FENCELOCK_TEST_REDIS", "127.0.0.1:1")
	etcdHost, _ := host("FENCELOCK_TEST_ETCD", "127.0.0.1:1")
	zkHost, _ := host("FENCELOCK_TEST_ZOOKEEPER", "127.0.0.1:1")
	mongoHost, _ := host("FENCELOCK_TEST_MONGO", "127.0.0.1:1")
	mysqlHost, _ := host("FENCELOCK_TEST_MYSQL", "127.0.0.1:1")
	natsHost, _ := host("FENCELOCK_TEST_NATS", "127.0.0.1:1")
	if pgQuery != "" {
		pgQuery += "&"
	}
	S := secret
	var urls []string
	add := func(us ...string) { urls = append(urls, us...) }
	// Every scheme: userinfo, password=, repeated, bad port, bad escape,
	// unparseable, unreachable.
	for _, sh := range []struct{ scheme, host, path string }{
		{"postgres", pgHost, "/fencelock"}, {"postgresql", pgHost, "/fencelock"},
		{"redis", redisHost, "/0"}, {"rediss", "127.0.0.1:1", "/0"},
		{"redis+sentinel", redisHost, "/mymaster"}, {"redis+cluster", redisHost, ""},
		{"etcd", etcdHost, "/p/"}, {"etcds", "127.0.0.1:1", "/p/"},
		{"zk", zkHost, "/c"},
		{"mongodb", mongoHost, "/db"}, {"mongodb+srv", "fencelock-test.invalid", "/db"},
		{"mysql", mysqlHost, "/fencelock"}, {"mariadb", mysqlHost, "/fencelock"},
		{"nats", natsHost, ""}, {"nats+tls", "127.0.0.1:1", ""},
		{"mem", "X", ""}, {"file", "localhost", t.TempDir()},
		{"nosuchscheme", "h", "/x"},
	} {
		b := sh.scheme + "://"
		add(
			b+"app:"+S+"@"+sh.host+sh.path,
			b+"app:"+esc(S+"/?#@x")+"@"+sh.host+sh.path,
			b+sh.host+sh.path+"?password="+S,
			b+sh.host+sh.path+"?password="+S+"&password="+S+"x",
			b+sh.host+sh.path+"?x_token="+S+"&api_key="+S+"&client_secret="+S+"&credentials="+S,
			b+"app:"+S+"@"+sh.host+sh.path+"?ttl=bogus",
			b+"app:"+S+"@127.0.0.1:99999"+sh.path,
			b+"app:"+S+"%zz@"+sh.host+sh.path,
			b+"app:"+S+"@[::1"+sh.path,
			b+"app:"+S+"@127.0.0.1:1"+sh.path+"?password="+S,
			b+"app:"+S+"@h:1 /x?password="+S,
		)
	}
	// Each backend's own credential parameters.
	add(
		"postgres://"+pgHost+"/fencelock?"+pgQuery+"password="+S,
		"postgres://fencelock:"+S+"@"+pgHost+"/fencelock?"+pgQuery+"sslpassword="+S+"&sslkey=/"+S,
		"postgres://"+pgHost+"/fencelock?"+pgQuery+"listen_url="+esc("postgres://u:"+S+"@"+pgHost+"/fencelock?password="+S),
		"postgres://"+pgHost+"/fencelock?"+pgQuery+"listen_url="+esc("postgres://u:"+S+"@[::1/x"),
		"postgres://"+pgHost+"/fencelock?"+pgQuery+"passfile=/"+S,
		"redis://:"+S+"@"+redisHost+"/0",
		"redis://default:"+S+"@"+redisHost+"/0?dial_timeout=1s",
		"redis+sentinel://u:"+S+"@"+redisHost+"/m?sentinel_password="+S+"&sentinel_password="+S+"y",
		"redis+sentinel://"+redisHost+"/m?sentinel_username=u&sentinel_password="+S+"&dial_timeout=500ms",
		"redis+cluster://u:"+S+"@"+redisHost+"?dial_timeout=500ms",
		"etcd://root:"+S+"@"+etcdHost+"/p/?dial_timeout=1s",
		"etcds://root:"+S+"@"+etcdHost+"/p/?key_file=/"+S+"&cert_file=/c&dial_timeout=500ms",
		"zk://"+zkHost+"/c?auth=digest:u:"+S,
		"zk://u:"+S+"@"+zkHost+"/c",
		"mongodb://u:"+S+"@"+mongoHost+"/db?serverSelectionTimeoutMS=1000",
		"mongodb://"+mongoHost+"/db?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:"+S+"&serverSelectionTimeoutMS=1000",
		"mongodb://"+mongoHost+"/db?tls=true&tlsCertificateKeyFile=/k&tlsCertificateKeyFilePassword="+S,
		"mongodb://"+mongoHost+"/db?proxyHost=h&proxyUsername=u&proxyPassword="+S,
		"mongodb+srv://u:"+S+"@fencelock-test.invalid/db",
		"mysql://"+mysqlHost+"/fencelock?tls_key=/"+S+"&tls_cert=/c",
		"mysql://fencelock:"+S+"@"+mysqlHost+"/fencelock?password="+S+"&timeout=1s",
		"nats://"+natsHost+"?token="+S+"&connect_timeout=1s",
		"nats://u:"+S+"@"+natsHost+"?creds=/"+S+"&nkey=/"+S,
		"nats+tls://u:"+S+"@127.0.0.1:1?key_file=/"+S+"&cert_file=/c&connect_timeout=500ms",
		"mem://u:"+S+"@X",
		"file://u:"+S+"@localhost/tmp/x",
		"nosuchscheme://h/x?password="+S,
	)
	// Dual URLs, whose old= and new= are URLs with secrets.
	add(
		migrate.DualURL("postgres://u:"+S+"@"+pgHost+"/fencelock?"+pgQuery+"password="+S, "redis://:"+S+"@"+redisHost+"/0"),
		migrate.DualURL("mem://a?password="+S, "mem://b"),
		migrate.DualURL("redis://:"+S+"@127.0.0.1:99999", "mem://b"),
		migrate.DualURL("dual://?old="+esc("mem://x?password="+S), "mem://b"),
		"dual://?old=mem://a?password="+S+"&new=mem://b",
		"dual://u:"+S+"@h?old=mem://a",
	)
	return urls
}

// TestNoSecretInAnyOutput opens every registered scheme, and an unknown
// one, with a secret in every position, through fencelock.Open and
// through the command (status, list, doctor, migrate dual-url, with and
// without --verbose), and checks that the secret appears in no error, no
// log record (slog.Default and the Logger option both record everything)
// and no output.
func TestNoSecretInAnyOutput(t *testing.T) {
	var rnd [6]byte
	rand.Read(rnd[:])
	secret := "Hunter2pw" + hex.EncodeToString(rnd[:])
	leaks := func(s string) bool {
		return strings.Contains(s, secret) // letters and digits: the same escaped
	}
	rec := newLogRecorder()
	prev := slog.Default()
	slog.SetDefault(slog.New(rec))
	defer slog.SetDefault(prev)
	logger := slog.New(rec)

	prefix := "fencelock-secrets-test-" + hex.EncodeToString(rnd[:]) + "/"
	urls := secretURLs(t, secret)
	schemes := map[string]bool{}
	for _, raw := range urls {
		if i := strings.Index(raw, "://"); i > 0 {
			schemes[raw[:i]] = true
		}
	}
	for _, s := range fencelock.Schemes() {
		if !schemes[s] && s != "rediss+sentinel" && s != "rediss+cluster" {
			t.Errorf("registered scheme %q is not tested", s)
		}
	}
	for _, raw := range urls {
		// The library.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := fencelock.Open(ctx, raw, &fencelock.Options{Logger: logger, Owner: "secrets-test"})
		if err != nil {
			if leaks(err.Error()) || leaks(fmt.Sprintf("%+v", err)) {
				t.Errorf("fencelock.Open(%q) error shows the secret: %v", raw, err)
			}
		} else {
			if l, err := c.TryAcquire(ctx, prefix+"k"); err == nil {
				_ = l.Release(ctx)
			} else if leaks(err.Error()) {
				t.Errorf("TryAcquire on %q: error shows the secret: %v", raw, err)
			}
			if infos, err := c.List(ctx, prefix); err != nil && leaks(err.Error()) || leaks(fmt.Sprint(infos)) {
				t.Errorf("List on %q shows the secret: %v %v", raw, infos, err)
			}
			if d := fmt.Sprintf("%+v", c.Describe()); leaks(d) {
				t.Errorf("Describe of %q shows the secret: %s", raw, d)
			}
			c.Close()
		}
		cancel()

		// The command.
		for _, args := range [][]string{
			{"status", "--connect-timeout", "1s", "--url", raw, prefix + "k"},
			{"status", "--verbose", "--json", "--connect-timeout", "1s", "--url", raw, prefix + "k"},
			{"list", "--connect-timeout", "1s", "--url", raw, prefix},
			{"doctor", "--verbose", "--connect-timeout", "1s", "--url", raw},
			{"migrate", "dual-url", raw, "mem://other"},
		} {
			out, code := inProcess(args...)
			if leaks(out) {
				t.Errorf("fencelock %q (exit %d) printed the secret:\n%s", args, code, out)
			}
		}
	}
	if logs := rec.String(); leaks(logs) {
		t.Errorf("a log record shows the secret:\n%s", logs)
	}
}

// TestBadURLExitsUsage: a URL that cannot be used (a bad port, a
// malformed URL, an unknown parameter) is a usage error, exit 64, on every
// backend; an unreachable store is 69.
func TestBadURLExitsUsage(t *testing.T) {
	for _, raw := range []string{
		"redis://:99999", "rediss://h:99999/0", "redis+sentinel://h:1,h:99999/m", "redis+cluster://h:0",
		"postgres://u@127.0.0.1:99999/db", "postgresql://h:70000/db",
		"etcd://h:99999", "etcds://h:99999",
		"nats://h:99999", "nats+tls://h:0", "nats://h:1?bucket=a.b",
		"zk://h:99999", "zk://h:1,h:65536/c",
		"mongodb://h:99999/db", "mongodb+srv://h:1/db",
		"mysql://u@h:99999/db", "mariadb://u@h:1/db?table=a&table=b",
		"mem://X:99999", "mem://X?x=1", "file://localhost:99999/tmp",
		"dual://?old=" + url.QueryEscape("redis://:99999") + "&new=mem://b",
		"nosuchscheme://h/x",
		"redis://h:6379/0?nosuchparam=1", "postgres://h:1/db%zz", "etcd://[::1", "zk://h:1/c?bogus=1",
	} {
		out, code := inProcess("status", "--connect-timeout", "3s", "--url", raw, "k")
		if code != exitUsage {
			t.Errorf("status --url %q: exit %d, want %d (usage):\n%s", raw, code, exitUsage, out)
		}
	}
	out, code := inProcess("status", "--connect-timeout", "1s", "--url", "redis://127.0.0.1:1/0", "k")
	if code != exitUnavailable {
		t.Errorf("status on an unreachable Redis: exit %d, want %d:\n%s", code, exitUnavailable, out)
	}
}

// TestMemNoParameters: an unknown parameter on a URL that takes none
// says so, instead of listing no known parameters.
func TestMemNoParameters(t *testing.T) {
	out, code := inProcess("status", "--url", "mem://X?x=1", "k")
	if code != exitUsage || !strings.Contains(out, "takes no parameters") || strings.Contains(out, "known parameters: \n") {
		t.Errorf("status --url mem://X?x=1: exit %d:\n%s", code, out)
	}
}

// redisWithWarning returns the test Redis's URL with skip_checks=true,
// which always gives one configuration warning.
func redisWithWarning(t *testing.T) string {
	t.Helper()
	raw := os.Getenv("FENCELOCK_TEST_REDIS")
	if raw == "" {
		t.Skip("FENCELOCK_TEST_REDIS not set")
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("skip_checks", "true")
	u.RawQuery = q.Encode()
	return u.String()
}

// TestWarningsOnlyWithVerbose: the command (the built binary, as cron
// runs it) prints a backend's configuration warnings only with
// --verbose, and then once.
func TestWarningsOnlyWithVerbose(t *testing.T) {
	f := newFixture(t)
	f.url = redisWithWarning(t)
	const warning = "server settings not checked"
	for _, args := range [][]string{
		{"status", "fencelock-secrets-test/k"},
		{"list", "fencelock-secrets-test/"},
		{"run", "fencelock-secrets-test/k", "--", "true"},
	} {
		stdout, stderr, code := f.run(args...)
		if strings.Contains(stdout+stderr, warning) || strings.Contains(stderr, "WARN") {
			t.Errorf("fencelock %q (exit %d) without --verbose printed a warning:\n%s%s", args, code, stdout, stderr)
		}
		vargs := append([]string{args[0], "--verbose"}, args[1:]...)
		stdout, stderr, code = f.run(vargs...)
		if n := strings.Count(stdout+stderr, warning); n != 1 {
			t.Errorf("fencelock %q (exit %d) printed the warning %d times, want once:\n%s%s", vargs, code, n, stdout, stderr)
		}
	}
}

// TestDoctor: doctor prints the backend's description and warnings, with
// the URL redacted, and exits 1 if there are warnings, 0 if none.
func TestDoctor(t *testing.T) {
	f := newFixture(t)
	stdout, stderr, code := f.run("doctor", "--url", "mem://doctor")
	if code != exitOK || !strings.Contains(stdout, "warnings: none") || !strings.Contains(stdout, "backend:") {
		t.Errorf("doctor on mem: exit %d:\n%s%s", code, stdout, stderr)
	}
	raw := redisWithWarning(t)
	stdout, stderr, code = f.run("doctor", "--url", raw)
	if code != exitWarnings || !strings.Contains(stdout, "server settings not checked") || !strings.Contains(stdout, "fencing:") {
		t.Errorf("doctor on Redis with skip_checks: exit %d, want %d:\n%s%s", code, exitWarnings, stdout, stderr)
	}
	stdout, stderr, code = f.run("doctor", "--json", "--url", raw)
	if code != exitWarnings || !strings.Contains(stdout, `"warnings": [`) {
		t.Errorf("doctor --json: exit %d:\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = f.run("doctor", "--url", "redis://127.0.0.1:1/0", "--connect-timeout", "1s")
	if code != exitUnavailable {
		t.Errorf("doctor on an unreachable store: exit %d, want %d:\n%s%s", code, exitUnavailable, stdout, stderr)
	}
	stdout, stderr, code = f.run("doctor", "--url", "redis://:99999")
	if code != exitUsage {
		t.Errorf("doctor on a bad URL: exit %d, want %d:\n%s%s", code, exitUsage, stdout, stderr)
	}
}

// TestDualURLSecrets: migrate dual-url does not print credentials unless
// asked to with --show-secrets.
func TestDualURLSecrets(t *testing.T) {
	out, code := inProcess("migrate", "dual-url", "redis://:Hunter2dual@h:6379/0", "mem://b")
	if code != exitUsage || strings.Contains(out, "Hunter2dual") || !strings.Contains(out, "--show-secrets") {
		t.Errorf("dual-url with a password: exit %d:\n%s", code, out)
	}
	out, code = inProcess("migrate", "dual-url", "--show-secrets", "redis://:Hunter2dual@h:6379/0", "mem://b")
	if want := migrate.DualURL("redis://:Hunter2dual@h:6379/0", "mem://b") + "\n"; code != exitOK || out != want {
		t.Errorf("dual-url --show-secrets: exit %d, %q; want %q", code, out, want)
	}
	out, code = inProcess("migrate", "dual-url", "redis://h:6379/0", "mem://b")
	if code != exitOK || !strings.HasPrefix(out, "dual://") {
		t.Errorf("dual-url without credentials: exit %d:\n%s", code, out)
	}
}
