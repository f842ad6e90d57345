package postgres

import (
	"context"
	"fmt"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
	"github.com/jackc/pgx/v5"
)

var (
	_ driver.BatchAcquirer = (*Backend)(nil)
	_ driver.BatchReleaser = (*Backend)(nil)
)

// AcquireBatch implements driver.BatchAcquirer: one INSERT … SELECT FROM
// unnest(…) ON CONFLICT DO UPDATE (acquireFree's upsert for every key),
// one commit and so one WAL flush for the batch. A request that
// CheckAcquire refuses gets its error and is left out; a second request
// for a key already in the statement is made on its own afterwards (an
// upsert cannot touch one row twice), as if it came next.
func (b *Backend) AcquireBatch(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	out := make([]driver.AcquireResult, len(reqs))
	var (
		in    []int // requests in the statement
		later []int // second requests for a key
		seen  = make(map[string]struct{}, len(reqs))
	)
	for i, req := range reqs {
		if out[i].Err = driver.CheckAcquire(req); out[i].Err != nil {
			continue
		}
		if _, dup := seen[req.Key]; dup {
			later = append(later, i)
			continue
		}
		seen[req.Key] = struct{}{}
		in = append(in, i)
	}
	if len(in) > 0 {
		if err := b.acquireBatchOnce(ctx, reqs, in, out); err != nil {
			return nil, err
		}
	}
	for _, i := range later {
		out[i].Grant, out[i].Err = b.Acquire(ctx, reqs[i])
	}
	return out, nil
}

// acquireBatchOnce sends acquireBatch for reqs[i], i in idx (distinct
// keys), and fills in out[i].
func (b *Backend) acquireBatchOnce(ctx context.Context, reqs []driver.AcquireRequest, idx []int, out []driver.AcquireResult) error {
	n := len(idx)
	keys, owners := make([]string, n), make([]string, n)
	ttls, delays := make([]int64, n), make([]int64, n)
	mds := make([][]byte, n)
	byKey := make(map[string]int, n)
	for j, i := range idx {
		r := reqs[i]
		keys[j], owners[j], ttls[j], mds[j], delays[j] = r.Key, r.Owner, backendkit.Micros(r.TTL), backendkit.OrNil(r.Metadata), backendkit.Micros(r.LockDelay)
		byKey[r.Key] = i
	}
	rows, err := b.pool.Query(ctx, b.q.acquireBatch, keys, owners, ttls, mds, delays)
	if err != nil {
		return err
	}
	var (
		key, owner      string
		tok, rem, delay int64
		answered        = make(map[string]bool, n)
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &owner, &tok, &rem, &delay}, func() error {
		i, ok := byKey[key]
		if !ok || answered[key] {
			return fmt.Errorf("postgres: acquire batch answered for key %q, which it was not asked for once", key)
		}
		answered[key] = true
		req := reqs[i]
		switch {
		case owner == req.Owner:
			b.held.note(key, false)
			out[i] = driver.AcquireResult{Grant: driver.Grant{Key: key, Owner: owner, Token: driver.Token(tok)}}
		case delay > 0:
			b.held.note(key, true)
			out[i].Err = &driver.HeldError{Holder: driver.Info{Key: key, Token: driver.Token(tok)}, LockDelay: backendkit.FromMicros(delay)}
		default:
			b.held.note(key, true)
			out[i].Err = &driver.HeldError{Holder: driver.Info{Key: key, Owner: owner, Token: driver.Token(tok), Remaining: backendkit.FromMicros(rem)}}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, i := range idx {
		if !answered[reqs[i].Key] {
			// Not expected of an upsert: the outcome is unknown.
			out[i].Err = fmt.Errorf("postgres: acquire batch returned no row for key %q", reqs[i].Key)
		}
	}
	return nil
}

// ReleaseBatch implements driver.BatchReleaser: one UPDATE … FROM
// unnest(…), which frees every row whose owner and token match and
// notifies the waiters of the contended ones; a grant missing from the
// result is ErrNotHeld. A grant sent twice is answered once; the other
// gets ErrNotHeld, as a second Release would.
func (b *Backend) ReleaseBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	n := len(grants)
	keys, owners, tokens := make([]string, n), make([]string, n), make([]int64, n)
	for i, g := range grants {
		cur := b.rot.current(g)
		keys[i], owners[i], tokens[i] = cur.Key, cur.Owner, int64(cur.Token)
	}
	rows, err := b.pool.Query(ctx, b.q.releaseBatch, keys, owners, tokens, b.n.channel)
	if err != nil {
		return nil, err
	}
	released := make(map[grantID]bool, n)
	var id grantID
	_, err = pgx.ForEachRow(rows, []any{&id.key, &id.owner, &id.token, nil}, func() error {
		released[id] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	errs := make([]error, n)
	for i, g := range grants {
		b.rot.forget(g)
		id := grantID{keys[i], owners[i], tokens[i]}
		if !released[id] {
			errs[i] = driver.ErrNotHeld
		}
		delete(released, id) // a second release of it is not held

	}
	return errs, nil
}
