package mysql

import (
	"context"
	"database/sql"
	"math"
	"strconv"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.TokenFloorer = (*Backend)(nil)

// HighWater implements driver.TokenFloorer: Keys holds the token of every
// row under prefix (a row stays after release until Sweep removes it), and
// Global the counter, which is at or above every token ever issued from
// this table, swept rows included. Both are read in one read-only
// REPEATABLE READ transaction (one snapshot).
func (b *Backend) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if err := b.check(ctx); err != nil {
		return driver.HighWater{}, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return driver.HighWater{}, err
	}
	tx, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return driver.HighWater{}, err
	}
	defer tx.Rollback()
	hw := driver.HighWater{Keys: make(map[string]driver.Token)}
	var global uint64
	if err := tx.QueryRowContext(ctx, b.q.highGlobal).Scan(&global); err != nil {
		return driver.HighWater{}, err
	}
	hw.Global = driver.Token(global)
	rows, err := tx.QueryContext(ctx, b.q.highKeys, likePrefix(prefix))
	if err != nil {
		return driver.HighWater{}, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			key []byte
			tok uint64
		)
		if err := rows.Scan(&key, &tok); err != nil {
			return driver.HighWater{}, err
		}
		hw.Keys[string(key)] = driver.Token(tok)
	}
	if err := rows.Err(); err != nil {
		return driver.HighWater{}, err
	}
	return hw, tx.Commit()
}

// RaiseFloor implements driver.TokenFloorer. Tokens come from one counter
// for the whole table, so raising any key's floor raises every key's: the
// counter is moved up to floor if it is below (never down). The UPDATE
// takes the counter row's lock, which every token draw takes in its own
// transaction, so no draw can interleave with it: every token drawn after
// it returns is above floor.
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
		return &driver.InvalidOptionError{Option: "token floor", Value: strconv.FormatUint(uint64(floor), 10), Reason: "must be below 2^63-1"}
	}
	if floor == 0 {
		return nil
	}
	_, err := b.db.ExecContext(ctx, b.q.raise, uint64(floor))
	return err
}
