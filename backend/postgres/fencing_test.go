package postgres_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/fencingdoc"
)

// fencingSchema connects to the test server with search_path set to a
// schema of its own, dropped at the end, and creates the table the
// documented patterns write to (accounts: id, balance) with one row, id 1,
// balance 0, then runs the page's own ALTER TABLE on it.
func fencingSchema(t *testing.T, doc *fencingdoc.Doc) (*pgx.Conn, string) {
	t.Helper()
	ctx := ctxT(t)
	var b [4]byte
	_, _ = crand.Read(b[:])
	schema := "fencelock_fencing_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
			t.Logf("cleanup: %v", err)
		}
		conn.Close(ctx)
	})
	for _, q := range []string{
		`CREATE SCHEMA ` + schema,
		`SET search_path = ` + schema,
		`CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)`,
		`INSERT INTO accounts VALUES (1, 0)`,
		mustBlock(t, doc, "postgres-schema"),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return conn, schema
}

func mustBlock(t *testing.T, doc *fencingdoc.Doc, name string) string {
	t.Helper()
	b, err := doc.Block(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadFencingDoc(t *testing.T) *fencingdoc.Doc {
	t.Helper()
	doc, err := fencingdoc.Load(fencingdoc.RepoFile("docs/fencing.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) < 10 {
		t.Fatalf("docs/fencing.md has %d cases", len(doc.Cases))
	}
	return doc
}

// fenceRow is what the row holds after a step.
type fenceRow struct {
	balance int64
	fence   int64
	owner   *string
}

func readFenceRow(t *testing.T, conn *pgx.Conn) fenceRow {
	t.Helper()
	var r fenceRow
	if err := conn.QueryRow(ctxT(t), `SELECT balance, fence, fence_owner FROM accounts WHERE id = 1`).Scan(&r.balance, &r.fence, &r.owner); err != nil {
		t.Fatal(err)
	}
	return r
}

// checkFenceRow: after an accepted write the row holds its value, token and
// holder; after a refused one it is unchanged.
func checkFenceRow(t *testing.T, c fencingdoc.Case, before, after, want fenceRow) {
	t.Helper()
	if !c.Accept {
		want = before
	}
	if after.balance != want.balance || after.fence != want.fence || (after.owner == nil) != (want.owner == nil) ||
		(after.owner != nil && *after.owner != *want.owner) {
		t.Fatalf("step %d (%s): row = %s, want %s", c.Step, c.Why, after, want)
	}
}

func (r fenceRow) String() string {
	o := "NULL"
	if r.owner != nil {
		o = strconv.Quote(*r.owner)
	}
	return fmt.Sprintf("{balance %d, fence %d, fence_owner %s}", r.balance, r.fence, o)
}

// TestDocumentedSQLFencePatternFollowsRule is the regression test for the
// documented fencing patterns that disagreed with Fence (the SQL one never
// recorded the holder, so a holder's second write was refused): it runs
// docs/fencing.md's own PostgreSQL statement, as the page prints it,
// against a real PostgreSQL through the page's table of cases (the table
// Fence is tested with) and checks each outcome and the row after it.
func TestDocumentedSQLFencePatternFollowsRule(t *testing.T) {
	doc := loadFencingDoc(t)
	conn, _ := fencingSchema(t, doc)
	write := mustBlock(t, doc, "postgres-write")
	ctx := ctxT(t)
	for _, c := range doc.Cases {
		if c.Token > math.MaxInt64 {
			t.Fatalf("step %d: token %d does not fit a bigint", c.Step, c.Token)
		}
		before := readFenceRow(t, conn)
		value := int64(c.Step * 1000)
		tag, err := conn.Exec(ctx, write, int64(c.Token), c.Holder, 1, value)
		if err != nil {
			t.Fatalf("step %d: %v", c.Step, err)
		}
		if got := tag.RowsAffected() == 1; got != c.Accept {
			t.Fatalf("step %d (%s): token %d from %q: %d rows updated; the page says accepted=%v", c.Step, c.Why, c.Token, c.Holder, tag.RowsAffected(), c.Accept)
		}
		holder := c.Holder
		checkFenceRow(t, c, before, readFenceRow(t, conn), fenceRow{value, int64(c.Token), &holder})
	}
}

// TestDocumentedPsqlFenceCommandFollowsRule is the regression test for the
// fencing commands of `fencelock run` that disagreed with Fence (docs/cli.md
// used <=, the command's help <, neither recorded the holder, and psql does
// not substitute variables in -c, so the documented command could not run).
// It takes the command as printed in docs/fencing.md, in docs/cli.md and
// in `fencelock run`'s help (cmd/fencelock/run.go), and runs it, with the
// page's write.sql, through the page's table of cases against a real
// PostgreSQL, as `fencelock run` would: COMMAND under sh with
// FENCELOCK_TOKEN and FENCELOCK_OWNER set.
func TestDocumentedPsqlFenceCommandFollowsRule(t *testing.T) {
	if _, err := exec.LookPath("psql"); err != nil {
		t.Skip("psql not installed")
	}
	doc := loadFencingDoc(t)
	cli, err := fencingdoc.Load(fencingdoc.RepoFile("docs/cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	help, err := os.ReadFile(fencingdoc.RepoFile("cmd/fencelock/run.go"))
	if err != nil {
		t.Fatal(err)
	}
	commands := map[string]string{
		"docs/fencing.md": command(t, mustBlock(t, doc, "psql-run")),
		"docs/cli.md":     command(t, mustBlock(t, cli, "psql-run")),
		"run.go help":     command(t, string(help)),
	}
	for where, cmd := range commands {
		t.Run(strings.ReplaceAll(where, "/", "_"), func(t *testing.T) {
			conn, schema := fencingSchema(t, doc)
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "write.sql"), []byte(mustBlock(t, doc, "psql-write")), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := pgx.ParseConfig(testURL(t))
			if err != nil {
				t.Fatal(err)
			}
			env := append(os.Environ(),
				"PGHOST="+cfg.Host, "PGPORT="+strconv.Itoa(int(cfg.Port)), "PGUSER="+cfg.User,
				"PGPASSWORD="+cfg.Password, "PGDATABASE="+cfg.Database,
				"PGOPTIONS=-c search_path="+schema, "PSQLRC=/dev/null")
			for _, c := range doc.Cases {
				before := readFenceRow(t, conn)
				sh := exec.CommandContext(ctxT(t), "sh", "-c", cmd)
				sh.Dir = dir
				sh.Env = append(env, "FENCELOCK_TOKEN="+strconv.FormatUint(c.Token, 10), "FENCELOCK_OWNER="+c.Holder)
				out, err := sh.CombinedOutput()
				if err != nil {
					t.Fatalf("step %d: %s: %v\n%s", c.Step, cmd, err, out)
				}
				want := "UPDATE 0"
				if c.Accept {
					want = "UPDATE 1"
				}
				if strings.TrimSpace(string(out)) != want {
					t.Fatalf("step %d (%s): token %d from %q: psql printed %q; the page says accepted=%v (%s)", c.Step, c.Why, c.Token, c.Holder, out, c.Accept, want)
				}
				holder := c.Holder
				checkFenceRow(t, c, before, readFenceRow(t, conn), fenceRow{before.balance + 100, int64(c.Token), &holder})
			}
		})
	}
}

// command returns COMMAND of the one line in text that runs
// "fencelock run KEY -- COMMAND", without the closing backquote of a Go
// raw string.
func command(t *testing.T, text string) string {
	t.Helper()
	var found []string
	for _, l := range strings.Split(text, "\n") {
		if _, cmd, ok := strings.Cut(l, "fencelock run "); ok && strings.Contains(cmd, "FENCELOCK_TOKEN") {
			_, cmd, ok = strings.Cut(cmd, " -- ")
			if ok {
				found = append(found, strings.TrimSuffix(strings.TrimSpace(cmd), "`"))
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one line running fencelock run with $FENCELOCK_TOKEN, found %q", found)
	}
	return found[0]
}
