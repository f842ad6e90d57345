package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
	"github.com/fencelock/fencelock/kit/httpfence"
	pgfence "github.com/fencelock/fencelock/kit/postgres"
)

// Credit an account under a lock, fenced: the balance changes only if the
// lease's token passes the fencing rule, in the same transaction. The
// example needs a server (FENCELOCK_TEST_POSTGRES), so it has no checked
// output; TestExample runs it.
func Example() {
	dsn := os.Getenv("FENCELOCK_TEST_POSTGRES")
	if dsn == "" {
		return
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgfence.EnsureTable(ctx, pool); err != nil { // once, at start-up
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	locks, err := fencelock.New(memory.New(), nil) // any backend
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	err = locks.Do(ctx, "accounts/1", func(ctx context.Context, l *fencelock.Lease) error {
		return pgfence.Tx(ctx, pool, "accounts/1", l.Token(), l.Owner(), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO accounts VALUES (1, 100)
				ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + 100`)
			return err
		})
	})
	if errors.Is(err, fencelock.ErrStaleToken) {
		fmt.Println("refused: a later holder has written")
	} else if err != nil {
		log.Fatal(err)
	}
	var balance int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 1`).Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance", balance)
}

// A service behind httpfence.Middleware, fenced by the PostgreSQL fence
// table that every replica of it shares: the middleware refuses a stale
// token before the handler runs, and the handler, which writes to the
// same database, writes in a fenced transaction with the request's token
// and holder, so that its write is fenced across replicas too (the
// middleware's own lock serializes one process only). The example needs
// a server, so it is compiled, not run.
func ExampleChecker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgfence.EnsureTable(ctx, pool); err != nil { // once, at start-up
		log.Fatal(err)
	}

	save := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The middleware has checked these headers: they are well formed.
		token, _ := strconv.ParseUint(r.Header.Get(httpfence.HeaderToken), 10, 64)
		holder := r.Header.Get(httpfence.HeaderHolder)
		err = pgfence.Tx(r.Context(), pool, r.URL.Path, fencelock.Token(token), holder, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), `INSERT INTO reports (path, body) VALUES ($1, $2)
				ON CONFLICT (path) DO UPDATE SET body = EXCLUDED.body`, r.URL.Path, body)
			return err
		})
		switch {
		case errors.Is(err, fencelock.ErrStaleToken): // another replica admitted a newer holder meanwhile
			http.Error(w, err.Error(), http.StatusConflict)
		case err != nil:
			http.Error(w, "write failed", http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	byPath := func(r *http.Request) string {
		if r.Method == http.MethodGet {
			return ""
		}
		return r.URL.Path
	}
	http.Handle("/reports/", httpfence.Middleware(pgfence.Checker{DB: pool}, byPath, save))
	log.Fatal(http.ListenAndServe(":8080", nil))
}
