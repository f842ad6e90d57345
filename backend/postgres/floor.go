package postgres

import (
	"context"
	"math"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.TokenFloorer = (*Backend)(nil)

// HighWater implements driver.TokenFloorer: Keys holds the token of every
// row under prefix (a row stays after release until Sweep removes it), and
// Global the sequence's last value, which is above every token ever
// issued from this table, swept rows included.
func (b *Backend) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if err := b.check(ctx); err != nil {
		return driver.HighWater{}, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return driver.HighWater{}, err
	}
	hw := driver.HighWater{Keys: make(map[string]driver.Token)}
	err := pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var global int64
		if err := tx.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+b.n.seq).Scan(&global); err != nil {
			return err
		}
		hw.Global = driver.Token(global)
		rows, err := tx.Query(ctx, `SELECT key, token FROM `+b.n.table+` WHERE starts_with(key, $1)`, prefix)
		if err != nil {
			return err
		}
		var (
			key string
			tok int64
		)
		_, err = pgx.ForEachRow(rows, []any{&key, &tok}, func() error {
			hw.Keys[key] = driver.Token(tok)
			return nil
		})
		return err
	})
	if err != nil {
		return driver.HighWater{}, err
	}
	return hw, nil
}

// RaiseFloor implements driver.TokenFloorer. Tokens come from one
// sequence for the whole table, so raising any key's floor raises every
// key's: the sequence is moved up to floor if it is below (never down).
//
// setval is not transactional, and a concurrent nextval between reading
// the sequence and setting it could be undone, issuing a token twice. So
// the table is locked in SHARE ROW EXCLUSIVE mode first: every statement
// that draws a token writes the table and holds ROW EXCLUSIVE until it
// commits, so none is in flight while the sequence moves. Acquires wait
// for the lock for the duration of one short transaction. The role needs
// UPDATE on the table and the sequence, which the lock role has anyway.
func (b *Backend) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if key != "" {
		if err := driver.ValidateKey(key); err != nil {
			return err
		}
	}
	if floor >= math.MaxInt64 {
		return &driver.InvalidOptionError{Option: "token floor", Value: strconv.FormatUint(uint64(floor), 10), Reason: "must be below 2^63-1, the largest PostgreSQL bigint"}
	}
	if floor == 0 {
		return nil
	}
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE `+b.n.table+` IN SHARE ROW EXCLUSIVE MODE`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT setval(`+b.n.seqLit+`, $1::bigint)
  WHERE $1::bigint > (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM `+b.n.seq+`)`, int64(floor))
		return err
	})
}
