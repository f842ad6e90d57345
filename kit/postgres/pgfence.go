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
// Create the fence table once, with EnsureTable or the DDL of Schema. The
// zero Fences, and the package-level functions, use the table
// fencelock_fences; set Fences.Table to use another.
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
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencelock/fencelock"
)

// DefaultTable is the fence table of the zero Fences and of the
// package-level functions.
const DefaultTable = "fencelock_fences"

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
}

// ident returns the table name, quoted.
func (f Fences) ident() string {
	name := f.Table
	if name == "" {
		name = DefaultTable
	}
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

// Schema returns the DDL that creates the fence table if it does not
// exist, for a DBA or a migration tool.
func (f Fences) Schema() string {
	return "CREATE TABLE IF NOT EXISTS " + f.ident() + " (\n" +
		"  resource text PRIMARY KEY,\n" +
		"  token bigint NOT NULL,\n" +
		"  holder text NOT NULL\n" +
		")"
}

// EnsureTable creates the fence table if it does not exist. Run it once
// (at deployment or start-up), not concurrently: PostgreSQL's CREATE TABLE
// IF NOT EXISTS can fail when two sessions race to create one table.
func (f Fences) EnsureTable(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, f.Schema()); err != nil {
		return fmt.Errorf("pgfence: creating fence table %s: %w", f.ident(), err)
	}
	return nil
}

// checkSQL checks the rule and records the token in one statement: it
// inserts the resource's first fence, or updates the resource's fence row
// (locking it until the transaction ends) only where the rule accepts the
// token. A row returned means accepted; none, refused. $2 > 0 refuses
// token 0, which is never issued.
func (f Fences) checkSQL() string {
	t := f.ident()
	return "INSERT INTO " + t + " AS f (resource, token, holder)\n" +
		" SELECT $1::text, $2::bigint, $3::text WHERE $2::bigint > 0\n" +
		" ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, holder = EXCLUDED.holder\n" +
		" WHERE f.token < EXCLUDED.token OR (f.token = EXCLUDED.token AND f.holder = EXCLUDED.holder)\n" +
		" RETURNING f.token"
}

// highestSQL reads the resource's highest accepted token after a refusal.
func (f Fences) highestSQL() string {
	return "SELECT token FROM " + f.ident() + " WHERE resource = $1"
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
	var got int64
	switch err := tx.QueryRow(ctx, f.checkSQL(), resource, tok, holder).Scan(&got); {
	case errors.Is(err, pgx.ErrNoRows):
		var highest int64
		if err := tx.QueryRow(ctx, f.highestSQL(), resource).Scan(&highest); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("pgfence: reading the fence of %q after a refusal: %w", resource, err)
		}
		return stale(resource, token, highest)
	case err != nil:
		return fmt.Errorf("pgfence: checking the fence of %q in %s (create it with EnsureTable): %w", resource, f.ident(), err)
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
// as Tx. The driver must speak PostgreSQL's SQL ($n parameters, INSERT
// ... ON CONFLICT); it is tested with pgx's stdlib driver.
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
	var got int64
	switch err := tx.QueryRowContext(ctx, f.checkSQL(), resource, tok, holder).Scan(&got); {
	case errors.Is(err, sql.ErrNoRows):
		var highest int64
		if err := tx.QueryRowContext(ctx, f.highestSQL(), resource).Scan(&highest); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("pgfence: reading the fence of %q after a refusal: %w", resource, err)
		}
		return stale(resource, token, highest)
	case err != nil:
		return fmt.Errorf("pgfence: checking the fence of %q in %s (create it with EnsureTable): %w", resource, f.ident(), err)
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
