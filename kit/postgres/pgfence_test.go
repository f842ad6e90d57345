package pgfence_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/conformance/resource"
	"github.com/fencelock/fencelock/internal/testenv"
	pgfence "github.com/fencelock/fencelock/kit/postgres"
)

// testURL returns the test server's URL, or skips (fails on CI).
func testURL(t testing.TB) string {
	t.Helper()
	return testenv.URL(t, "FENCELOCK_TEST_POSTGRES")
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func randHex() string {
	var b [4]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// fixture is a pool, a fence table and a data table (name, value), both
// unique to the test and dropped when it ends.
type fixture struct {
	pool   *pgxpool.Pool
	db     *sql.DB
	fences pgfence.Fences
	data   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := ctxT(t)
	pool, err := pgxpool.New(ctx, testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	id := randHex()
	f := &fixture{
		pool:   pool,
		db:     stdlib.OpenDBFromPool(pool),
		fences: pgfence.Fences{Table: "fencelock_kit_" + id + "_fences"},
		data:   pgx.Identifier{"fencelock_kit_" + id + "_data"}.Sanitize(),
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+f.data+`, `+pgx.Identifier{f.fences.Table}.Sanitize()); err != nil {
			t.Logf("cleanup: %v", err)
		}
		_ = f.db.Close()
		closed := make(chan struct{})
		go func() { pool.Close(); close(closed) }() // waits for every connection
		select {
		case <-closed:
		case <-ctx.Done():
			t.Error("cleanup: the pool did not close: a connection is still in use (a transaction left open)")
		}
	})
	if err := f.fences.EnsureTable(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+f.data+` (name text PRIMARY KEY, value text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) upsert() string {
	return `INSERT INTO ` + f.data + ` (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value`
}

func (f *fixture) read(ctx context.Context, name string) (string, bool, error) {
	var v string
	err := f.pool.QueryRow(ctx, `SELECT value FROM `+f.data+` WHERE name = $1`, name).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return v, err == nil, err
}

// fence returns the recorded fence of name (0, "" if none).
func (f *fixture) fence(t *testing.T, name string) (int64, string) {
	t.Helper()
	var tok int64
	var holder string
	err := f.pool.QueryRow(ctxT(t), `SELECT token, holder FROM `+pgx.Identifier{f.fences.Table}.Sanitize()+` WHERE resource = $1`, name).Scan(&tok, &holder)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return tok, holder
}

// form is one of the kit's two transaction forms, with fn given as
// "write value under name" or "write, then fail with err".
type form struct {
	name  string
	write func(ctx context.Context, f *fixture, resource string, token fencelock.Token, holder, value string, fnErr error, called *bool) error
}

var forms = []form{
	{"pgx", func(ctx context.Context, f *fixture, name string, token fencelock.Token, holder, value string, fnErr error, called *bool) error {
		return f.fences.Tx(ctx, f.pool, name, token, holder, func(tx pgx.Tx) error {
			if called != nil {
				*called = true
			}
			if _, err := tx.Exec(ctx, f.upsert(), name, value); err != nil {
				return err
			}
			return fnErr
		})
	}},
	{"database-sql", func(ctx context.Context, f *fixture, name string, token fencelock.Token, holder, value string, fnErr error, called *bool) error {
		return f.fences.SQLTx(ctx, f.db, name, token, holder, func(tx *sql.Tx) error {
			if called != nil {
				*called = true
			}
			if _, err := tx.ExecContext(ctx, f.upsert(), name, value); err != nil {
				return err
			}
			return fnErr
		})
	}},
}

// kitResource is the resource of the conformance suite: a fenced
// transaction that upserts the value into the data table.
type kitResource struct {
	f    *fixture
	form form
}

func (r kitResource) Write(ctx context.Context, name string, token fencelock.Token, holder, value string) error {
	return r.form.write(ctx, r.f, name, token, holder, value, nil, nil)
}

func (r kitResource) Read(ctx context.Context, name string) (string, bool, error) {
	return r.f.read(ctx, name)
}

func TestResourceConformance(t *testing.T) {
	for _, fm := range forms {
		t.Run(fm.name, func(t *testing.T) {
			f := newFixture(t)
			resource.Run(t, resource.Harness{
				Resource: func(t *testing.T) resource.Resource { return kitResource{f, fm} },
			})
		})
	}
}

// A refused token rolls back without running fn: fn's write never lands,
// and the fence keeps its token and holder.
func TestRefusedTokenSkipsFnAndChangesNothing(t *testing.T) {
	for _, fm := range forms {
		t.Run(fm.name, func(t *testing.T) {
			ctx := ctxT(t)
			f := newFixture(t)
			if err := fm.write(ctx, f, "r", 5, "a", "v1", nil, nil); err != nil {
				t.Fatal(err)
			}
			called := false
			err := fm.write(ctx, f, "r", 4, "b", "late", nil, &called)
			var se *fencelock.StaleTokenError
			if !errors.Is(err, fencelock.ErrStaleToken) || !errors.As(err, &se) {
				t.Fatalf("token 4 after 5: err = %v; want a *fencelock.StaleTokenError", err)
			}
			if se.Resource != "r" || se.Token != 4 || se.Highest != 5 {
				t.Errorf("StaleTokenError = %+v; want resource r, token 4, highest 5", *se)
			}
			if called {
				t.Error("fn ran for a refused token")
			}
			if v, _, err := f.read(ctx, "r"); err != nil || v != "v1" {
				t.Errorf("value = %q, %v; want v1", v, err)
			}
			if tok, h := f.fence(t, "r"); tok != 5 || h != "a" {
				t.Errorf("fence = %d %q; want 5 \"a\"", tok, h)
			}
		})
	}
}

// An error from fn rolls back fn's writes and the fence record: the
// token fn ran under is not recorded, so a lower token than it (but higher
// than the last committed) is still accepted afterwards.
func TestFnErrorRollsBackWritesAndFence(t *testing.T) {
	errBoom := errors.New("boom")
	for _, fm := range forms {
		t.Run(fm.name, func(t *testing.T) {
			ctx := ctxT(t)
			f := newFixture(t)
			if err := fm.write(ctx, f, "r", 5, "a", "v1", nil, nil); err != nil {
				t.Fatal(err)
			}
			if err := fm.write(ctx, f, "r", 7, "b", "v2", errBoom, nil); err != errBoom {
				t.Fatalf("fn failed: err = %v; want fn's error unchanged", err)
			}
			if v, _, err := f.read(ctx, "r"); err != nil || v != "v1" {
				t.Errorf("value after fn failed = %q, %v; want v1 (fn's write rolled back)", v, err)
			}
			if tok, h := f.fence(t, "r"); tok != 5 || h != "a" {
				t.Errorf("fence after fn failed = %d %q; want 5 \"a\" (the record rolled back)", tok, h)
			}
			if err := fm.write(ctx, f, "r", 6, "c", "v3", nil, nil); err != nil {
				t.Fatalf("token 6 after a rolled-back 7: %v; want accepted", err)
			}
			// The first fence of a resource rolls back too.
			if err := fm.write(ctx, f, "new", 3, "a", "x", errBoom, nil); err != errBoom {
				t.Fatalf("fn failed: err = %v", err)
			}
			if tok, _ := f.fence(t, "new"); tok != 0 {
				t.Errorf("first fence after fn failed = %d; want no row", tok)
			}
		})
	}
}

// A token PostgreSQL's bigint cannot hold is refused with a
// *TokenRangeError before anything runs.
func TestTokenAboveInt64IsTokenRangeError(t *testing.T) {
	for _, fm := range forms {
		t.Run(fm.name, func(t *testing.T) {
			ctx := ctxT(t)
			f := newFixture(t)
			called := false
			err := fm.write(ctx, f, "r", fencelock.Token(math.MaxInt64)+1, "a", "v", nil, &called)
			var re *pgfence.TokenRangeError
			if !errors.Is(err, pgfence.ErrTokenRange) || !errors.As(err, &re) || re.Token != 1<<63 {
				t.Fatalf("token 2^63: err = %v; want a *pgfence.TokenRangeError", err)
			}
			if errors.Is(err, fencelock.ErrStaleToken) {
				t.Error("a TokenRangeError matches ErrStaleToken; it must not (the rule did not judge it)")
			}
			if called {
				t.Error("fn ran")
			}
			if tok, _ := f.fence(t, "r"); tok != 0 {
				t.Errorf("fence = %d; want no row", tok)
			}
		})
	}
}

// A missing fence table is reported with how to fix it.
func TestMissingTableSaysEnsureTable(t *testing.T) {
	ctx := ctxT(t)
	pool, err := pgxpool.New(ctx, testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	fences := pgfence.Fences{Table: "fencelock_kit_" + randHex() + "_missing"}
	err = fences.Tx(ctx, pool, "r", 1, "a", func(pgx.Tx) error { return nil })
	if err == nil || errors.Is(err, fencelock.ErrStaleToken) {
		t.Fatalf("err = %v; want a store error", err)
	}
	if got := err.Error(); !strings.Contains(got, "EnsureTable") {
		t.Errorf("err = %q; want it to name EnsureTable", got)
	}
}

func TestSchemaQuotesEachPart(t *testing.T) {
	got := pgfence.Fences{Table: "app.Fences"}.Schema()
	for _, want := range []string{
		"CREATE TABLE IF NOT EXISTS \"app\".\"Fences\" (\n  resource text PRIMARY KEY,\n  token bigint NOT NULL,\n  holder text NOT NULL\n);\n",
		"CREATE OR REPLACE FUNCTION \"app\".\"Fences_fence\"(resource text, token bigint, holder text)\n",
		"INSERT INTO \"app\".\"Fences\" AS f",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Schema() =\n%s\nwant it to contain\n%s", got, want)
		}
	}
	if pgfence.Schema() != (pgfence.Fences{Table: pgfence.DefaultTable}).Schema() {
		t.Error("Schema() is not DefaultTable's")
	}
	for _, c := range []struct {
		f    pgfence.Fences
		want string
	}{
		{pgfence.Fences{}, `"fencelock_fence"`},
		{pgfence.Fences{Table: pgfence.DefaultTable}, `"fencelock_fence"`},
		{pgfence.Fences{Table: "app.fences"}, `"app"."fences_fence"`},
		{pgfence.Fences{Table: "app.fences", Function: "app.Fence"}, `"app"."Fence"`},
	} {
		if got := c.f.FunctionName(); got != c.want {
			t.Errorf("%+v.FunctionName() = %s; want %s", c.f, got, c.want)
		}
	}
}

// A panic in fn rolls back the fence record and returns the connection:
// none is in use afterwards.
func TestFnPanicRollsBack(t *testing.T) {
	for _, c := range []struct {
		name  string
		panic func(context.Context, *fixture)
		inUse func(*fixture) int
	}{
		{"pgx", func(ctx context.Context, f *fixture) {
			_ = f.fences.Tx(ctx, f.pool, "r", 5, "a", func(pgx.Tx) error { panic("boom") })
		}, func(f *fixture) int { return int(f.pool.Stat().AcquiredConns()) }},
		{"database-sql", func(ctx context.Context, f *fixture) {
			_ = f.fences.SQLTx(ctx, f.db, "r", 5, "a", func(*sql.Tx) error { panic("boom") })
		}, func(f *fixture) int { return f.db.Stats().InUse }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctxT(t)
			f := newFixture(t)
			if err := forms[0].write(ctx, f, "r", 4, "a", "v", nil, nil); err != nil {
				t.Fatal(err)
			}
			func() {
				defer func() {
					if recover() == nil {
						t.Error("the panic did not reach the caller")
					}
				}()
				c.panic(ctx, f)
			}()
			if tok, _ := f.fence(t, "r"); tok != 4 {
				t.Errorf("fence after a panic = %d; want 4 (the record rolled back)", tok)
			}
			if n := c.inUse(f); n != 0 {
				t.Errorf("%d connections still in use after the panic", n)
			}
		})
	}
}

// The fencing function is callable from any SQL client: accepted, it
// returns; refused, it raises StaleSQLState with the highest accepted
// token in its message and changes nothing; NULL arguments raise 22004.
func TestFunctionRaisesStaleSQLState(t *testing.T) {
	ctx := ctxT(t)
	f := newFixture(t)
	call := `SELECT ` + f.fences.FunctionName() + `($1, $2, $3)`
	if _, err := f.pool.Exec(ctx, call, "it's", int64(5), "a"); err != nil {
		t.Fatalf("token 5, the first: %v; want accepted", err)
	}
	_, err := f.pool.Exec(ctx, call, "it's", int64(4), "b")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != pgfence.StaleSQLState {
		t.Fatalf("token 4 after 5: err = %v; want SQLSTATE %s", err, pgfence.StaleSQLState)
	}
	if want := `stale fencing token 4 for 'it''s' (highest accepted 5)`; pe.Message != want || pe.Hint == "" {
		t.Errorf("message %q, hint %q; want %q and a hint", pe.Message, pe.Hint, want)
	}
	if tok, h := f.fence(t, "it's"); tok != 5 || h != "a" {
		t.Errorf("fence after a refusal = %d %q; want 5 \"a\"", tok, h)
	}
	for _, args := range [][]any{{nil, int64(6), "a"}, {"it's", nil, "a"}, {"it's", int64(6), nil}} {
		if _, err := f.pool.Exec(ctx, call, args...); !errors.As(err, &pe) || pe.Code != "22004" {
			t.Errorf("%v: err = %v; want SQLSTATE 22004", args, err)
		}
	}
	if tok, h := f.fence(t, "it's"); tok != 5 || h != "a" {
		t.Errorf("fence after NULL arguments = %d %q; want 5 \"a\"", tok, h)
	}
}
