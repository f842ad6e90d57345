//go:build unix

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/fencingdoc"
	"github.com/fencelock/fencelock/internal/testenv"
	pgfence "github.com/fencelock/fencelock/kit/postgres"
	redisfence "github.com/fencelock/fencelock/kit/redis"
)

// The tests here run the jobs docs/cli.md documents under "Fencing a job's
// writes with the kits": COMMAND as printed there, under the built
// fencelock, with a real lock store and a real data store, writing
// through psql and redis-cli with the kits' function and script.

// needTool returns the path of a command-line tool the test runs; it
// skips when the tool is missing, but fails under CI=true, where a
// missing tool is an error.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if testenv.IsCI() {
			t.Fatalf("%s is not installed: under CI the fenced-job tests must run (install %s)", name, name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}

// cliBlock returns the text of docs/cli.md's block marked name.
func cliBlock(t *testing.T, name string) string {
	t.Helper()
	doc, err := fencingdoc.Load(fencingdoc.RepoFile("docs/cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := doc.Block(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// docCommand returns COMMAND of the one `fencelock run ... -- COMMAND`
// line that is docs/cli.md's block marked name.
func docCommand(t *testing.T, name string) string {
	t.Helper()
	b := strings.TrimSpace(cliBlock(t, name))
	if strings.Count(b, "\n") != 0 || !strings.HasPrefix(b, "fencelock run ") {
		t.Fatalf("block %s is not one fencelock run line: %q", name, b)
	}
	_, cmd, ok := strings.Cut(b, " -- ")
	if !ok {
		t.Fatalf("block %s has no ' -- COMMAND': %q", name, b)
	}
	return cmd
}

func randID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// jobRecord is what a job ran with: its token and holder.
type jobRecord struct {
	token fencelock.Token
	owner string
}

// fencedJobs runs shell commands as jobs under fencelock run, on the lock
// store f.url, in dir, with extra environment.
type fencedJobs struct {
	t   *testing.T
	f   *fixture
	key string
	env []string
}

// sh runs the shell line under sh -c with env, to completion (bounded),
// and returns its combined output and exit status.
func (j *fencedJobs) sh(name string, args []string, env []string) (string, int) {
	j.t.Helper()
	ctx, cancel := context.WithTimeout(j.t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = j.f.dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		j.t.Fatalf("%s %q did not finish within 2 minutes\n%s", name, args, out.String())
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	case err != nil:
		j.t.Fatalf("%s %q: %v", name, args, err)
	}
	return out.String(), 0
}

// run runs command (a shell line, as documented) as a job under
// fencelock run, and returns the token and holder it ran with, its
// output and exit status.
func (j *fencedJobs) run(command string) (jobRecord, string, int) {
	j.t.Helper()
	rec := filepath.Join(j.f.dir, "job-"+randID())
	line := `printf '%s\n%s\n' "$FENCELOCK_TOKEN" "$FENCELOCK_OWNER" > ` + rec + ` && ` + command
	out, code := j.sh(fencelockBin, []string{"run", "--ttl", "10s", j.key, "--", "sh", "-c", line},
		append([]string{"FENCELOCK_URL=" + j.f.url}, j.env...))
	b, err := os.ReadFile(rec)
	if err != nil {
		j.t.Fatalf("the job did not run (exit %d): %v\n%s", code, err, out)
	}
	tok, owner, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	n, err := strconv.ParseUint(tok, 10, 64)
	if err != nil || n == 0 || owner == "" {
		j.t.Fatalf("the job ran with token %q, owner %q", tok, owner)
	}
	return jobRecord{fencelock.Token(n), owner}, out, code
}

// replay re-runs command outside fencelock run, with a job's recorded
// token and holder: the job, paused past its lease, writing late.
func (j *fencedJobs) replay(command string, r jobRecord) (string, int) {
	j.t.Helper()
	return j.sh("sh", []string{"-c", command}, append([]string{
		"FENCELOCK_TOKEN=" + strconv.FormatUint(uint64(r.token), 10),
		"FENCELOCK_OWNER=" + r.owner,
		"FENCELOCK_KEY=" + j.key,
	}, j.env...))
}

func newFencedJobs(t *testing.T, lockURL string, env ...string) *fencedJobs {
	f := newFixture(t)
	f.url = lockURL
	return &fencedJobs{t: t, f: f, key: "fencelock-cli-test-" + randID() + "/accounts/1", env: env}
}

// A job under fencelock run writes through psql, calling the PostgreSQL
// kit's fencelock_fence first in its transaction, as docs/cli.md shows:
// accepted, the write lands and the fence records the job's token and
// holder; replayed with that token after a later job has written, psql
// exits non-zero and the data and the fence are unchanged; the kit's Go
// Tx sees the same fence.
func TestFencedPsqlJob(t *testing.T) {
	pgURL := testenv.URL(t, "FENCELOCK_TEST_POSTGRES")
	needTool(t, "psql")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// The data: a schema of the test's own, with the kit's fence table and
	// function and an accounts table.
	cfg, err := pgx.ParseConfig(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	schema := "fencelock_cli_fenced_" + randID()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Logf("cleanup: %v", err)
		}
		_ = conn.Close(ctx)
	})
	for _, q := range []string{
		`CREATE SCHEMA ` + schema,
		`SET search_path = ` + schema,
		`CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)`,
		`INSERT INTO accounts VALUES (1, 0)`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgfence.EnsureTable(ctx, conn); err != nil {
		t.Fatal(err)
	}
	state := func() (balance, token int64, owner string) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 1`).Scan(&balance); err != nil {
			t.Fatal(err)
		}
		err := conn.QueryRow(ctx, `SELECT token, holder FROM fencelock_fences WHERE resource = 'accounts/1'`).Scan(&token, &owner)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return balance, token, owner
	}

	// psql's connection string, DB, as the documented job expects it.
	ssl := "disable"
	if cfg.TLSConfig != nil {
		ssl = "require"
	}
	db := "host=" + cfg.Host + " port=" + strconv.Itoa(int(cfg.Port)) + " user=" + cfg.User +
		" dbname=" + cfg.Database + " sslmode=" + ssl + " options='-c search_path=" + schema + "'"
	env := []string{"DB=" + db, "PSQLRC=/dev/null"}
	if cfg.Password != "" {
		env = append(env, "PGPASSWORD="+cfg.Password)
	}
	jobs := newFencedJobs(t, pgURL, env...)
	if err := os.WriteFile(filepath.Join(jobs.f.dir, "fenced.sql"), []byte(cliBlock(t, "psql-kit-write")), 0o644); err != nil {
		t.Fatal(err)
	}
	command := docCommand(t, "psql-kit-run")

	first, out, code := jobs.run(command)
	if code != 0 {
		t.Fatalf("first job: exit %d; want 0 (accepted)\n%s", code, out)
	}
	if b, tok, owner := state(); b != 100 || tok != int64(first.token) || owner != first.owner {
		t.Fatalf("after the first job: balance %d, fence %d %q; want 100, %d %q", b, tok, owner, first.token, first.owner)
	}
	second, out, code := jobs.run(command)
	if code != 0 {
		t.Fatalf("second job: exit %d; want 0 (accepted)\n%s", code, out)
	}
	if second.token <= first.token {
		t.Fatalf("second job's token %d not above the first's %d", second.token, first.token)
	}
	if b, tok, owner := state(); b != 200 || tok != int64(second.token) || owner != second.owner {
		t.Fatalf("after the second job: balance %d, fence %d %q; want 200, %d %q", b, tok, owner, second.token, second.owner)
	}

	// The first job, late: refused by the function, nothing written.
	out, code = jobs.replay(command, first)
	if code == 0 || !strings.Contains(out, "stale fencing token "+strconv.FormatUint(uint64(first.token), 10)) {
		t.Fatalf("the first job replayed after the second: exit %d; want non-zero, refused as stale\n%s", code, out)
	}
	if b, tok, owner := state(); b != 200 || tok != int64(second.token) || owner != second.owner {
		t.Fatalf("after the stale replay: balance %d, fence %d %q; want 200, %d %q (unchanged)", b, tok, owner, second.token, second.owner)
	}

	// The kit's Go form reads the fence the jobs wrote.
	err = pgfence.Tx(ctx, conn, "accounts/1", first.token, first.owner, func(pgx.Tx) error { return nil })
	var se *fencelock.StaleTokenError
	if !errors.As(err, &se) || se.Highest != second.token {
		t.Errorf("pgfence.Tx with the first job's token: %v; want a StaleTokenError with highest %d", err, second.token)
	}
}

// A job under fencelock run writes through redis-cli with the Redis kit's
// script, as docs/cli.md shows: accepted, the write lands and the fence
// (at the kit's FenceKey) records the job's token and holder; replayed
// with that token after a later job has written, redis-cli exits
// non-zero and the data and the fence are unchanged; the kit's Go Do sees
// the same fence.
func TestFencedRedisCLIJob(t *testing.T) {
	redisURL := testenv.URL(t, "FENCELOCK_TEST_REDIS")
	needTool(t, "redis-cli")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// The documented command, on a resource of the test's own: the shared
	// server may hold another run's accounts/1.
	resource := "fencelock-cli-test-" + randID() + "/accounts/1"
	command := strings.ReplaceAll(docCommand(t, "redis-kit-run"), "accounts/1", resource)
	fenceKey, err := redisfence.FenceKey(resource)
	if err != nil {
		t.Fatal(err)
	}
	balanceKey := "{" + resource + "}:balance"
	if !strings.Contains(command, `"`+fenceKey+`"`) || !strings.Contains(command, `"`+balanceKey+`"`) {
		t.Fatalf("the documented command does not name the kit's fence key %s and the data key %s: %s", fenceKey, balanceKey, command)
	}
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rdb.Del(ctx, fenceKey, balanceKey).Err(); err != nil {
			t.Logf("cleanup: %v", err)
		}
		_ = rdb.Close()
	})
	state := func() (balance string, fence map[string]string) {
		t.Helper()
		balance, err := rdb.Get(ctx, balanceKey).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		fence, err = rdb.HGetAll(ctx, fenceKey).Result()
		if err != nil {
			t.Fatal(err)
		}
		return balance, fence
	}
	checkState := func(when, balance string, r jobRecord) {
		t.Helper()
		b, fence := state()
		if b != balance || fence["token"] != strconv.FormatUint(uint64(r.token), 10) || fence["owner"] != r.owner {
			t.Fatalf("%s: balance %q, fence %v; want %s, token %d, owner %q", when, b, fence, balance, r.token, r.owner)
		}
	}

	jobs := newFencedJobs(t, redisURL, "REDIS="+redisURL)
	if err := os.WriteFile(filepath.Join(jobs.f.dir, "fence.lua"), []byte(redisfence.Source), 0o644); err != nil {
		t.Fatal(err)
	}
	first, out, code := jobs.run(command)
	if code != 0 {
		t.Fatalf("first job: exit %d; want 0 (accepted)\n%s", code, out)
	}
	checkState("after the first job", "100", first)
	second, out, code := jobs.run(command)
	if code != 0 {
		t.Fatalf("second job: exit %d; want 0 (accepted)\n%s", code, out)
	}
	if second.token <= first.token {
		t.Fatalf("second job's token %d not above the first's %d", second.token, first.token)
	}
	checkState("after the second job", "200", second)

	// The first job, late: refused by the script, nothing written.
	out, code = jobs.replay(command, first)
	if code == 0 || !strings.Contains(out, "STALE stale fencing token "+strconv.FormatUint(uint64(first.token), 10)) {
		t.Fatalf("the first job replayed after the second: exit %d; want non-zero, refused as STALE\n%s", code, out)
	}
	checkState("after the stale replay", "200", second)

	// The kit's Go form reads the fence the jobs wrote.
	_, err = redisfence.Do(ctx, rdb, resource, first.token, first.owner,
		redisfence.Cmd{Name: "INCRBY", Keys: []string{balanceKey}, Args: []any{1}})
	var se *fencelock.StaleTokenError
	if !errors.As(err, &se) || se.Highest != second.token {
		t.Errorf("redisfence.Do with the first job's token: %v; want a StaleTokenError with highest %d", err, second.token)
	}
	checkState("after the kit's refused write", "200", second)
}
