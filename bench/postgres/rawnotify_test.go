package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/benchkit"
	"github.com/jackc/pgx/v5"
)

// rawNotifyRelease deletes the row if it is still ours and NOTIFYs the
// table's channel with the key in the same statement.
const rawNotifyRelease = `WITH d AS (DELETE FROM %[1]s WHERE key = $1 AND owner = $2 AND token = $3 RETURNING key)
SELECT pg_notify('%[1]s', key) FROM d`

// rawNotifyRecheck bounds a raw-notify waiter's sleep, in case a
// notification was lost; it never fires in a healthy run.
const rawNotifyRecheck = time.Second

// rawNotifyLib is the notify strategy on the raw statements: the upsert to
// acquire, a delete that NOTIFYs to release; a waiter LISTENs on its own
// connection (as a separate process would, from before its first attempt,
// so no release between an attempt and the wait is missed) and retries
// when a release of its key is announced. Every waiter wakes on every
// release, as with a plain notify.
func rawNotifyLib(name string) benchkit.Lib {
	return benchkit.Lib{Name: name, Setup: func(b *testing.B) benchkit.Lockers {
		ctx := context.Background()
		p := poolOf(b, withParam(dsn(b), "pool_max_conns="+strconv.Itoa(rawConns)))
		table := "bench_rawn_" + benchkit.RandomHex()
		if _, err := p.Exec(ctx, fmt.Sprintf(rawTable, table)); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			p.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %[1]s; DROP SEQUENCE IF EXISTS %[1]s_seq`, table))
		})
		acquire, release := fmt.Sprintf(rawAcquire, table), fmt.Sprintf(rawNotifyRelease, table)
		return func(i int) (try, wait benchkit.LockFunc) {
			owner := "raw-" + strconv.Itoa(i)
			try = func(ctx context.Context, key string) (func() error, error) {
				var tok int64
				err := p.QueryRow(ctx, acquire, key, owner).Scan(&tok)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil, benchkit.ErrHeld
				}
				if err != nil {
					return nil, err
				}
				return func() error { _, err := p.Exec(context.Background(), release, key, owner, tok); return err }, nil
			}
			conn, err := pgx.Connect(ctx, dsn(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { conn.Close(context.Background()) })
			if _, err := conn.Exec(ctx, "LISTEN "+table); err != nil {
				b.Fatal(err)
			}
			wait = func(ctx context.Context, key string) (func() error, error) {
				for {
					release, err := try(ctx, key)
					if !errors.Is(err, benchkit.ErrHeld) {
						return release, err
					}
					for {
						wctx, cancel := context.WithTimeout(ctx, rawNotifyRecheck)
						n, err := conn.WaitForNotification(wctx)
						cancel()
						if err != nil {
							if ctx.Err() != nil {
								return nil, ctx.Err()
							}
							if errors.Is(err, context.DeadlineExceeded) {
								break
							}
							return nil, err
						}
						if n.Payload == key {
							break
						}
					}
				}
			}
			return try, wait
		}
	}}
}
