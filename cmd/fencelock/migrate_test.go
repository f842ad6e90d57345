//go:build unix

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/testenv"
)

func withQuery(t *testing.T, raw, k, v string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestMigrateCommand drives `fencelock migrate` against the real Redis and
// PostgreSQL the way the runbook does: copy the floors, run through the
// dual URL, then on PostgreSQL alone: the token printed by each `run` is
// above the previous one.
func TestMigrateCommand(t *testing.T) {
	f := newFixture(t)
	var rnd [4]byte
	rand.Read(rnd[:])
	id := hex.EncodeToString(rnd[:])
	redisURL := withQuery(t, testenv.URL(t, "FENCELOCK_TEST_REDIS"), "prefix", "cli-migrate-"+id)
	pgURL := withQuery(t, testenv.URL(t, "FENCELOCK_TEST_POSTGRES"), "table", "cli_migrate_"+id)
	dropTableAtEnd(t, testenv.URL(t, "FENCELOCK_TEST_POSTGRES"), "cli_migrate_"+id)

	last := uint64(0)
	runOn := func(u, what string) {
		t.Helper()
		stdout, stderr, code := f.run("run", "--url", u, "jobs/nightly", "--", "sh", "-c", `echo "$FENCELOCK_TOKEN"`)
		if code != 0 {
			t.Fatalf("run on %s: exit %d\n%s", what, code, stderr)
		}
		tok, err := strconv.ParseUint(strings.TrimSpace(stdout), 10, 64)
		if err != nil || tok <= last {
			t.Fatalf("run on %s printed token %q, want one above %d", what, stdout, last)
		}
		last = tok
	}
	for range 5 {
		runOn(redisURL, "Redis")
	}

	stdout, stderr, code := f.run("migrate", "tokens", "--dry-run", "--from", redisURL, "--to", pgURL)
	if code != 0 || !strings.Contains(stdout, `"jobs/nightly"`) || !strings.Contains(stdout, "nothing changed") {
		t.Fatalf("migrate tokens --dry-run: exit %d\n%s%s", code, stdout, stderr)
	}
	for range 2 { // idempotent
		stdout, stderr, code = f.run("migrate", "tokens", "--json", "--from", redisURL, "--to", pgURL)
		var rep tokensJSON
		if err := json.Unmarshal([]byte(stdout), &rep); code != 0 || err != nil || !rep.Global || rep.Max != last {
			t.Fatalf("migrate tokens --json: exit %d, %+v, %v; want the global floor raised to %d\n%s", code, rep, err, last, stderr)
		}
	}

	dual, stderr, code := f.run("migrate", "dual-url", redisURL, pgURL)
	if code != 0 || !strings.HasPrefix(dual, "dual://?old=") {
		t.Fatalf("migrate dual-url: exit %d, %q\n%s", code, dual, stderr)
	}
	dual = strings.TrimSpace(dual)
	runOn(dual, "the dual backend")
	stdout, _, code = f.run("list", "--json", "--url", dual)
	if code != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Fatalf("list on the dual backend after the run: exit %d, %s; want no locks", code, stdout)
	}
	runOn(pgURL, "PostgreSQL")
	runOn(dual, "the dual backend after PostgreSQL")
	runOn(redisURL, "Redis after the dual backend")

	// Usage errors, and a copy from the file backend.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"migrate"}, exitUsage, "want a subcommand"},
		{[]string{"migrate", "tokens", "--from", redisURL}, exitUsage, "needs both"},
		{[]string{"migrate", "tokens", "--from", redisURL, "--to", redisURL}, exitUsage, "same backend"},
		{[]string{"migrate", "nonsense"}, exitUsage, "unknown subcommand"},
		// The file backend has token floors too (per key): copying from it works.
		{[]string{"migrate", "tokens", "--from", f.url, "--to", pgURL}, exitOK, ""},
	} {
		_, stderr, code := f.run(c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("fencelock %s: exit %d, stderr %q; want exit %d mentioning %q", strings.Join(c.args, " "), code, stderr, c.code, c.want)
		}
	}
}

// dropTableAtEnd drops the lock table (and its sequence) the test made.
func dropTableAtEnd(t *testing.T, base, table string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS "`+table+`"; DROP SEQUENCE IF EXISTS "`+table+`_token_seq"`); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
}
