// Package pgfence applies fencelock's fencing rule inside PostgreSQL, in
// the same transaction as your own statements, so that a paused holder's
// late write can never land after the next holder's.
//
// The rule, from docs/fencing.md
// (https://github.com/fencelock/fencelock/blob/main/docs/fencing.md):
// a write carrying token T from holder H is accepted if T is greater than
// the highest token the resource has accepted, or if T equals that highest
// token and H is the holder that presented it; an accepted write records T
// and H; anything else is refused and changes nothing. Token 0 is never
// accepted.
//
// Tx (pgx) and SQLTx (database/sql) begin a transaction, check and record
// the token in a fence table (one row per resource: resource, token,
// holder, locked until the transaction ends), run your function in the
// same transaction and commit. A refused token rolls back and returns a
// *fencelock.StaleTokenError, which matches fencelock.ErrStaleToken; an
// error from your function rolls back your statements and the fence record
// alike. Concurrent fenced transactions on one resource run one after the
// other, since each holds the resource's fence row until it ends.
//
// The rule lives in the database, in one SQL function that EnsureTable (or
// the DDL of Schema) creates beside the fence table:
//
//	fencelock_fence(resource text, token bigint, holder text) RETURNS void
//
// It checks token and holder against resource's fence row and records
// them, or raises SQLSTATE FL001 (StaleSQLState) with the message "stale
// fencing token T for 'R' (highest accepted H)". Tx and SQLTx call it; so
// can any SQL client, such as psql in a shell job under `fencelock run`,
// before its own statements in the same transaction. With a script
// fenced.sql
//
//	SELECT fencelock_fence('accounts/1', :token, :'owner');
//	UPDATE accounts SET balance = balance + 100 WHERE id = 1;
//
// the job is
//
//	fencelock run accounts/1 -- sh -c 'psql -v ON_ERROR_STOP=1 --single-transaction \
//	  -v token="$FENCELOCK_TOKEN" -v owner="$FENCELOCK_OWNER" -f fenced.sql'
//
// and psql exits 3, having rolled back, when the token is refused.
//
// For a service whose writes are API requests, Checker applies the rule
// for kit/httpfence's Middleware and kit/grpc's Server before the handler
// runs, each check a short transaction of its own, so that every replica
// of the service shares one fence. The check and the handler's write are
// then two steps: see Checker for when that is enough, and when the
// handler must write in Tx as well.
//
// Create the fence table and its function once, with EnsureTable or the
// DDL of Schema. The zero Fences, and the package-level functions, use the
// table fencelock_fences and the function fencelock_fence; set
// Fences.Table (and Fences.Function) to use others.
//
// Tokens are stored exactly, as bigint: a token above 2^63-1 (the most any
// fencelock backend that issues tokens to PostgreSQL users issues) is
// refused with a *TokenRangeError before anything is written.
package pgfence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencelock/fencelock"
)

// DefaultTable is the fence table of the zero Fences and of the
// package-level functions.
const DefaultTable = "fencelock_fences"

// DefaultFunction is the fencing function of DefaultTable.
const DefaultFunction = "fencelock_fence"

// StaleSQLState is the SQLSTATE the fencing function raises when the rule
// refuses a token (a class of its own, so no standard condition is
// mistaken for it). Its message is "stale fencing token T for 'R'
// (highest accepted H)".
const StaleSQLState = "FL001"

// rollbackTimeout bounds a rollback after the caller's context ended.
const rollbackTimeout = 10 * time.Second

// ErrTokenRange is matched by every *TokenRangeError.
var ErrTokenRange = errors.New("pgfence: fencing token out of range")

// TokenRangeError reports a token that PostgreSQL's bigint cannot hold
// (above 2^63-1). Nothing was written. It matches ErrTokenRange, not
// fencelock.ErrStaleToken: the token was not judged by the rule.
type TokenRangeError struct {
	// Resource is the fenced resource.
	Resource string
	// Token is the token given.
	Token fencelock.Token
}

// Error implements error.
func (e *TokenRangeError) Error() string {
	return fmt.Sprintf("pgfence: fencing token %d for %q is above 2^63-1, the largest a PostgreSQL bigint holds: "+
		"fence resources written under this lock with a kit that stores 64-bit unsigned tokens (or keep the lock on a backend whose tokens stay below 2^63)",
		e.Token, e.Resource)
}

// Is reports whether target is ErrTokenRange.
func (e *TokenRangeError) Is(target error) bool { return target == ErrTokenRange }

// Beginner begins a pgx transaction: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// (a nested transaction, as a savepoint) all are.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Execer runs a statement: *pgxpool.Pool, *pgx.Conn and pgx.Tx all are.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SQLBeginner begins a database/sql transaction: *sql.DB and *sql.Conn
// both are.
type SQLBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Fences is a fence table. Its zero value uses DefaultTable.
type Fences struct {
	// Table is the fence table's name, optionally schema-qualified
	// ("app.fences"). Each dot-separated part is quoted as an identifier,
	// so it is case-sensitive and may not itself contain a dot. Empty
	// means DefaultTable.
	Table string
	// Function is the name of the table's fencing function, optionally
	// schema-qualified, quoted like Table. Empty means DefaultFunction for
	// DefaultTable, and otherwise Table's name followed by "_fence" (in
	// Table's schema): Fences{Table: "app.fences"} has the function
	// app.fences_fence. Each fence table needs a function of its own.
	Function string
}

// ident returns the table name, quoted.
func (f Fences) ident() string {
	name := f.Table
	if name == "" {
		name = DefaultTable
	}
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

// FunctionName returns the fencing function's name, quoted, as SQL
// calls it: "fencelock_fence" for DefaultTable (see Fences.Function).
func (f Fences) FunctionName() string {
	name := f.Function
	switch {
	case name != "":
	case f.Table == "" || f.Table == DefaultTable:
		name = DefaultFunction
	default:
		name = f.Table + "_fence"
	}
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

// Schema returns the DDL that creates the fence table if it does not
// exist, and creates or replaces its fencing function, for a DBA or a
// migration tool: two statements, separated by a semicolon.
//
// The function, fencelock_fence(resource text, token bigint, holder text)
// RETURNS void for DefaultTable, applies the rule in one statement: it
// inserts the resource's first fence, or updates its fence row (locking
// it until the transaction ends) only where the rule accepts the token.
// Refused, it raises StaleSQLState, which aborts the caller's
// transaction; NULL arguments raise SQLSTATE 22004. It resolves the table
// by the caller's search_path when Table is not schema-qualified, as Tx
// does.
func (f Fences) Schema() string {
	t := f.ident()
	return "CREATE TABLE IF NOT EXISTS " + t + " (\n" +
		"  resource text PRIMARY KEY,\n" +
		"  token bigint NOT NULL,\n" +
		"  holder text NOT NULL\n" +
		");\n" +
		"CREATE OR REPLACE FUNCTION " + f.FunctionName() + "(resource text, token bigint, holder text)\n" +
		"RETURNS void LANGUAGE plpgsql AS $fencelock$\n" +
		"#variable_conflict use_column\n" +
		"DECLARE\n" +
		"  highest bigint;\n" +
		"BEGIN\n" +
		"  IF $1 IS NULL OR $2 IS NULL OR $3 IS NULL THEN\n" +
		"    RAISE EXCEPTION 'fencing needs a resource, a token and a holder, not NULL'\n" +
		"      USING ERRCODE = 'null_value_not_allowed';\n" +
		"  END IF;\n" +
		"  -- Token 0 is never issued: $2 > 0 refuses it.\n" +
		"  INSERT INTO " + t + " AS f (resource, token, holder)\n" +
		"    SELECT $1, $2, $3 WHERE $2 > 0\n" +
		"    ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, holder = EXCLUDED.holder\n" +
		"    WHERE f.token < EXCLUDED.token OR (f.token = EXCLUDED.token AND f.holder = EXCLUDED.holder);\n" +
		"  IF FOUND THEN\n" +
		"    RETURN;\n" +
		"  END IF;\n" +
		"  SELECT f.token INTO highest FROM " + t + " AS f WHERE f.resource = $1;\n" +
		"  RAISE EXCEPTION 'stale fencing token % for % (highest accepted %)', $2, quote_literal($1), coalesce(highest, 0)\n" +
		"    USING ERRCODE = '" + StaleSQLState + "',\n" +
		"      HINT = 'a later holder of the lock has written to this resource: this holder no longer holds it, so its write must not land; do not retry with this token';\n" +
		"END\n" +
		"$fencelock$"
}

// EnsureTable creates the fence table if it does not exist, and creates
// or replaces its fencing function (the DDL of Schema). Run it once (at
// deployment or start-up), not concurrently: PostgreSQL's CREATE TABLE IF
// NOT EXISTS and CREATE OR REPLACE FUNCTION can fail when two sessions
// race on one table or function.
func (f Fences) EnsureTable(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, f.Schema()); err != nil {
		return fmt.Errorf("pgfence: creating fence table %s and function %s: %w", f.ident(), f.FunctionName(), err)
	}
	return nil
}

// checkSQL calls the fencing function: it returns, or raises
// StaleSQLState on a refusal.
func (f Fences) checkSQL() string {
	return "SELECT " + f.FunctionName() + "($1::text, $2::bigint, $3::text)"
}

// highestRE finds the highest accepted token at the end of the fencing
// function's message (a driver may add a prefix, never a suffix).
var highestRE = regexp.MustCompile(`\(highest accepted (-?\d+)\)$`)

// refusal returns the *fencelock.StaleTokenError err stands for if it is
// the fencing function's refusal (StaleSQLState, from any driver whose
// errors have a SQLState method, as pgx's and lib/pq's do), or nil.
// Highest is read from the message.
func refusal(err error, resource string, token fencelock.Token) error {
	var st interface{ SQLState() string }
	if !errors.As(err, &st) || st.SQLState() != StaleSQLState {
		return nil
	}
	msg := err.Error()
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		msg = pe.Message
	}
	var highest int64
	if m := highestRE.FindStringSubmatch(msg); m != nil {
		highest, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return stale(resource, token, highest)
}

// checkFailed wraps an error of the fencing function's call that is not a
// refusal.
func (f Fences) checkFailed(resource string, err error) error {
	return fmt.Errorf("pgfence: checking the fence of %q with %s (create it and table %s with EnsureTable or Schema): %w",
		resource, f.FunctionName(), f.ident(), err)
}

// exactToken returns token as a bigint, or a *TokenRangeError.
func exactToken(resource string, token fencelock.Token) (int64, error) {
	if uint64(token) > math.MaxInt64 {
		return 0, &TokenRangeError{Resource: resource, Token: token}
	}
	return int64(token), nil
}

func stale(resource string, token fencelock.Token, highest int64) error {
	return &fencelock.StaleTokenError{Resource: resource, Token: token, Highest: fencelock.Token(uint64(highest))}
}

// Tx runs fn in a transaction fenced for resource: it begins a
// transaction on db, checks token and holder (a lease's Token and Owner)
// against the resource's fence row by the fencing rule and records them,
// runs fn in the same transaction and commits.
//
// A refused token rolls back, without calling fn, and returns a
// *fencelock.StaleTokenError (Highest is the resource's highest accepted
// token), which matches fencelock.ErrStaleToken. If fn returns an error,
// Tx rolls back fn's statements and the fence record alike and returns
// fn's error unchanged; if fn panics, Tx rolls back and the panic goes on. A token above 2^63-1 returns a *TokenRangeError
// before the transaction begins. An error from Commit is returned as is:
// as with any commit, the outcome is then unknown.
//
// The fence row stays locked until the transaction ends, so fenced
// transactions on one resource run one after the other: keep fn short.
// fn must not commit or roll back the transaction itself.
func (f Fences) Tx(ctx context.Context, db Beginner, resource string, token fencelock.Token, holder string, fn func(pgx.Tx) error) error {
	tok, err := exactToken(resource, token)
	if err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgfence: beginning the fenced transaction for %q: %w", resource, err)
	}
	// Rolls back unless committed: on a refusal, an error, or a panic in
	// fn (after Commit it is a no-op).
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	if _, err := tx.Exec(ctx, f.checkSQL(), resource, tok, holder); err != nil {
		if se := refusal(err, resource, token); se != nil {
			return se
		}
		return f.checkFailed(resource, err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgfence: committing the fenced transaction for %q: %w", resource, err)
	}
	return nil
}

// SQLTx is Tx for database/sql: it runs fn in a transaction begun on db
// (a *sql.DB or *sql.Conn), fenced for resource, with the same outcomes
// as Tx. The driver must speak PostgreSQL ($n parameters), and its
// errors must have a SQLState method (pgx's stdlib driver and lib/pq's
// do) for a refusal to be a *fencelock.StaleTokenError; it is tested with
// pgx's stdlib driver.
func (f Fences) SQLTx(ctx context.Context, db SQLBeginner, resource string, token fencelock.Token, holder string, fn func(*sql.Tx) error) error {
	tok, err := exactToken(resource, token)
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("pgfence: beginning the fenced transaction for %q: %w", resource, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, f.checkSQL(), resource, tok, holder); err != nil {
		if se := refusal(err, resource, token); se != nil {
			return se
		}
		return f.checkFailed(resource, err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("pgfence: committing the fenced transaction for %q: %w", resource, err)
	}
	return nil
}

// Tx is Fences{}.Tx: a transaction fenced in DefaultTable.
func Tx(ctx context.Context, db Beginner, resource string, token fencelock.Token, holder string, fn func(pgx.Tx) error) error {
	return Fences{}.Tx(ctx, db, resource, token, holder, fn)
}

// SQLTx is Fences{}.SQLTx: a database/sql transaction fenced in
// DefaultTable.
func SQLTx(ctx context.Context, db SQLBeginner, resource string, token fencelock.Token, holder string, fn func(*sql.Tx) error) error {
	return Fences{}.SQLTx(ctx, db, resource, token, holder, fn)
}

// EnsureTable is Fences{}.EnsureTable: it creates DefaultTable if it does
// not exist.
func EnsureTable(ctx context.Context, db Execer) error {
	return Fences{}.EnsureTable(ctx, db)
}

// Schema is Fences{}.Schema: the DDL of DefaultTable.
func Schema() string { return Fences{}.Schema() }
