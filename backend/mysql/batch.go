package mysql

import (
	"context"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
)

// maxBatch is the most grants one statement renews: a larger batch is
// sent as several statements.
const maxBatch = 500

// RenewBatch implements driver.BatchRenewer. Without Rotate, one UPDATE
// renews every grant of a chunk of up to 500 (owner-, token- and
// expiry-checked, as Renew), and one SELECT then reads which of them are
// held: a grant the UPDATE did not renew cannot match the SELECT (its
// token would have to come back to life), and one that no longer matches
// it was released or taken since, so is not held either. With Rotate each
// grant is renewed by its own call of the rotate procedure.
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	out := make([]driver.RenewResult, len(grants))
	if req.Rotate {
		for i, g := range grants {
			out[i].Grant, out[i].Err = b.Renew(ctx, g, req)
			if out[i].Err != nil && out[i].Err != driver.ErrNotHeld {
				return nil, out[i].Err
			}
		}
		return out, nil
	}
	for lo := 0; lo < len(grants); lo += maxBatch {
		hi := min(lo+maxBatch, len(grants))
		if err := b.renewChunk(ctx, grants[lo:hi], out[lo:hi], req); err != nil {
			return nil, err
		}
	}
	return out, nil
}

type grantID struct {
	key, owner string
	token      uint64
}

func (b *Backend) renewChunk(ctx context.Context, grants []driver.Grant, out []driver.RenewResult, req driver.RenewRequest) error {
	keys := make([]any, 0, 4*len(grants))
	for _, g := range grants {
		keys = append(keys, []byte(g.Key))
	}
	for _, g := range grants {
		keys = append(keys, []byte(g.Key), []byte(g.Owner), uint64(g.Token))
	}
	if _, err := b.db.ExecContext(ctx, b.q.renewBatch(b.n.table, len(grants)), append([]any{backendkit.Micros(req.TTL)}, keys...)...); err != nil {
		return err
	}
	rows, err := b.db.QueryContext(ctx, b.q.heldBatch(b.n.table, len(grants)), keys...)
	if err != nil {
		return err
	}
	defer rows.Close()
	held := make(map[grantID]bool, len(grants))
	for rows.Next() {
		var (
			key, owner []byte
			tok        uint64
		)
		if err := rows.Scan(&key, &owner, &tok); err != nil {
			return err
		}
		held[grantID{string(key), string(owner), tok}] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i, g := range grants {
		if held[grantID{g.Key, g.Owner, uint64(g.Token)}] {
			out[i].Grant = g
		} else {
			out[i].Err = driver.ErrNotHeld
		}
	}
	return nil
}
