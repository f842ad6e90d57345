package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/backend/memory"
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
