package redis

import (
	"context"
	"time"

	"github.com/fencelock/fencelock/driver"
	goredis "github.com/redis/go-redis/v9"
)

var (
	_ driver.BatchAcquirer = (*Backend)(nil)
	_ driver.BatchReleaser = (*Backend)(nil)
)

// AcquireBatch implements driver.BatchAcquirer: one pipeline of
// acquire.lua calls, one round trip for the batch (a Cluster client
// splits it into one pipeline per node). Each script runs on its own, in
// order, so every request gets its own answer, and a second request for
// a key finds the first's grant. A script answered NOSCRIPT did not run:
// those calls alone are sent again with EVAL (runPipelined). With
// wait_replicas, one WAIT ends the pipeline, and a grant the replicas
// did not acknowledge is removed and refused, as in Acquire.
func (b *Backend) AcquireBatch(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	out := make([]driver.AcquireResult, len(reqs))
	if _, cluster := b.c.(*goredis.ClusterClient); cluster && b.waitReplicas > 0 {
		// WAIT must follow the writes on each primary's connection:
		// one acquire (and its WAIT) at a time.
		for i, req := range reqs {
			out[i].Grant, out[i].Err = b.Acquire(ctx, req)
		}
		return out, nil
	}
	calls := make([]scriptCall, 0, len(reqs))
	idx := make([]int, 0, len(reqs))
	granted := make([]time.Duration, len(reqs))
	for i, req := range reqs {
		if out[i].Err = driver.CheckAcquire(req); out[i].Err != nil {
			continue
		}
		var ms int64
		ms, granted[i] = ttlMillis(req.TTL)
		lock, counter, _ := b.ks.names(req.Key)
		delay := int64((req.LockDelay + time.Millisecond - 1) / time.Millisecond)
		calls = append(calls, scriptCall{keys: []string{lock, counter, b.ks.marker(req.Key)}, args: []any{req.Owner, ms, metaArg(req.Metadata), delay}})
		idx = append(idx, i)
	}
	var (
		cmds  []*goredis.Cmd
		err   error
		acked int
	)
	if b.waitReplicas > 0 {
		cmds, acked, err = b.runPipelinedAcked(ctx, acquireScript, calls)
	} else {
		cmds, err = runPipelined(ctx, b.c, acquireScript, calls)
	}
	if err != nil {
		return nil, err
	}
	for j, cmd := range cmds {
		i := idx[j]
		g, err := acquireResult(reqs[i], granted[i], cmd.Val(), cmd.Err())
		if err == nil && b.waitReplicas > 0 && acked < b.waitReplicas {
			g, err = driver.Grant{}, b.refuseGrant(ctx, g, acked, b.waitFor)
		}
		out[i] = driver.AcquireResult{Grant: g, Err: err}
	}
	return out, nil
}

// ReleaseBatch implements driver.BatchReleaser: one pipeline of
// release.lua calls, each deleting its lock only if owner and token
// match (and waking its waiters).
func (b *Backend) ReleaseBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	errs := make([]error, len(grants))
	calls := make([]scriptCall, 0, len(grants))
	idx := make([]int, 0, len(grants))
	for i, g := range grants {
		if errs[i] = checkGrant(g); errs[i] != nil {
			continue
		}
		lock, _, channel := b.ks.names(g.Key)
		calls = append(calls, scriptCall{keys: []string{lock, b.ks.marker(g.Key)}, args: []any{recordHead(g), channel}})
		idx = append(idx, i)
	}
	cmds, err := runPipelined(ctx, b.c, releaseScript, calls)
	if err != nil {
		return nil, err
	}
	for j, cmd := range cmds {
		i := idx[j]
		n, err := cmd.Int64()
		switch {
		case err != nil:
			errs[i] = scriptError(grants[i].Key, err)
		case n != 1:
			errs[i] = driver.ErrNotHeld
		}
	}
	return errs, nil
}
