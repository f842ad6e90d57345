package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/driver"
)

// DefaultWaitTimeout is how long a grant or renewal waits for its
// replicas' acknowledgement (Options.WaitTimeout) when WaitReplicas is set
// and WaitTimeout is not.
const DefaultWaitTimeout = time.Second

// cleanupWait bounds the removal of a refused grant's record once the
// call's context has ended.
const cleanupWait = 250 * time.Millisecond

// ErrReplicasNotAcked is matched (errors.Is) by every *ReplicaAckError: a
// grant or renewal that fewer replicas than Options.WaitReplicas
// acknowledged in time.
var ErrReplicasNotAcked = errors.New("fencelock/redis: replicas did not acknowledge the write")

// ReplicaAckError reports a grant or renewal that fewer than
// Options.WaitReplicas replicas acknowledged (WAIT) within the wait
// timeout. A refused grant's record was removed again (owner- and
// token-guarded, so nothing else is touched), unless Cleanup says why
// not; the acquisition failed and the engine may try again. A refused
// renewal is not counted: the lease keeps the validity of its last
// acknowledged renewal, which the replicas have. It matches
// ErrReplicasNotAcked.
type ReplicaAckError struct {
	Op      string        // "acquire" or "renew"
	Key     string        // the lock's key
	Want    int           // Options.WaitReplicas
	Acked   int           // replicas that acknowledged in time
	Timeout time.Duration // the wait
	// Cleanup is the error of removing a refused grant's record (nil
	// when it was removed, or for a renewal); the record then expires by
	// its TTL.
	Cleanup error
}

// Error implements error.
func (e *ReplicaAckError) Error() string {
	what := "the grant was refused and its record removed"
	switch {
	case e.Op != "acquire":
		what = "the renewal is not counted (the lease keeps its last acknowledged expiry)"
	case e.Cleanup != nil:
		what = fmt.Sprintf("the grant was refused; removing its record failed (%v), so it expires by its TTL", oneLine(e.Cleanup))
	}
	return fmt.Sprintf("fencelock/redis: %s of %q: %d of %d replicas acknowledged within %v (WAIT): %s; "+
		"check that the replicas are connected and keep up (INFO replication: connected_slaves, each replica's lag), "+
		"or lower wait_replicas or raise wait_timeout", e.Op, e.Key, e.Acked, e.Want, e.Timeout, what)
}

// Is matches ErrReplicasNotAcked.
func (e *ReplicaAckError) Is(target error) bool { return target == ErrReplicasNotAcked }

// Unwrap returns Cleanup.
func (e *ReplicaAckError) Unwrap() error { return e.Cleanup }

// validateWait checks the replica options against the client: WAIT needs
// the connection that wrote, which a Ring does not expose.
func validateWait(o Options, c goredis.UniversalClient) error {
	if o.WaitReplicas == 0 {
		return nil
	}
	if _, ok := c.(*goredis.Ring); ok {
		return &driver.InvalidOptionError{Option: "WaitReplicas", Value: fmt.Sprint(o.WaitReplicas),
			Reason: "not supported on a Ring (its shards have no replicas this backend can wait for); use a Sentinel or Cluster client"}
	}
	return nil
}

// waitTimeout is the WAIT timeout of one call: Options.WaitTimeout, cut
// to what is left of ctx (never 0, which would make WAIT block forever).
func (b *Backend) waitTimeout(ctx context.Context) time.Duration {
	t := b.waitFor
	if dl, ok := ctx.Deadline(); ok {
		t = min(t, time.Until(dl))
	}
	return max(t, time.Millisecond)
}

// pipeliner returns the client whose pipeline runs on the connection to
// key's primary: the Cluster node that serves the key's slot, or the
// client itself.
func (b *Backend) pipeliner(ctx context.Context, key string) (goredis.Cmdable, error) {
	if cc, ok := b.c.(*goredis.ClusterClient); ok {
		return cc.MasterForKey(ctx, key)
	}
	return b.c, nil
}

// maxAckedRedirects bounds the MOVED and ASK redirections one
// replica-acknowledged call follows (go-redis's own default for a
// ClusterClient's commands is 3).
const maxAckedRedirects = 3

// runAcked runs one call of s on the connection to keys[0]'s primary
// followed by WAIT WaitReplicas on that connection, in one pipeline, and
// returns the script's reply and the number of replicas that
// acknowledged it (and everything the connection wrote before). NOSCRIPT
// is answered by sending the pair again with EVAL. On a Cluster the
// pipeline goes to one node's own client, which does not follow
// redirections: a MOVED (the slot has moved, or a replica took over) or
// an ASK (the slot is being migrated and the key is already on the
// target) is followed here, at most maxAckedRedirects times, the pair
// sent again to the node the reply names (after ASKING for an ASK).
// TRYAGAIN and CLUSTERDOWN (the script did not run) are returned as
// they are; the engine tries again within the call's bounds.
func (b *Backend) runAcked(ctx context.Context, s script, keys []string, args ...any) (any, int, error) {
	c, err := b.pipeliner(ctx, keys[0])
	if err != nil {
		return nil, 0, err
	}
	asking := false
	for redirects := 0; ; redirects++ {
		v, n, err := b.runAckedOn(ctx, c, asking, s, keys, args...)
		ask, addr, ok := redirection(err)
		if !ok || redirects >= maxAckedRedirects {
			return v, n, err
		}
		next, nerr := b.nodeAt(ctx, addr)
		if nerr != nil {
			return nil, 0, errors.Join(err, nerr)
		}
		c, asking = next, ask
	}
}

// runAckedOn is one attempt of runAcked on the node client c, with
// ASKING first when asking.
func (b *Backend) runAckedOn(ctx context.Context, c goredis.Cmdable, asking bool, s script, keys []string, args ...any) (any, int, error) {
	timeout := b.waitTimeout(ctx)
	for _, sha := range []bool{true, false} {
		pipe := c.Pipeline()
		if asking {
			pipe.Do(ctx, "ASKING")
		}
		var ev *goredis.Cmd
		if sha {
			ev = pipe.EvalSha(ctx, s.Hash(), keys, args...)
		} else {
			ev = pipe.Eval(ctx, s.src, keys, args...)
		}
		w := pipe.Do(ctx, "WAIT", b.waitReplicas, timeout.Milliseconds())
		if _, err := pipe.Exec(ctx); err != nil && !isRedisError(err) {
			return nil, 0, err
		}
		if sha && goredis.HasErrorPrefix(ev.Err(), "NOSCRIPT") {
			continue
		}
		v, err := ev.Result()
		if err != nil {
			return nil, 0, err
		}
		n, err := w.Int64()
		if err != nil {
			return v, 0, fmt.Errorf("redis: WAIT: %w", err)
		}
		return v, int(n), nil
	}
	panic("unreachable")
}

// redirection parses a Cluster's MOVED or ASK reply: "MOVED slot
// host:port", "ASK slot host:port".
func redirection(err error) (ask bool, addr string, ok bool) {
	if err == nil || !isRedisError(err) {
		return false, "", false
	}
	f := strings.Fields(err.Error())
	if len(f) != 3 || f[0] != "MOVED" && f[0] != "ASK" {
		return false, "", false
	}
	return f[0] == "ASK", f[2], true
}

// nodeAt returns the Cluster client's own client of the node at addr.
// ForEachShard reloads the client's view of the Cluster first, so later
// calls go to the slot's new owner at once.
func (b *Backend) nodeAt(ctx context.Context, addr string) (*goredis.Client, error) {
	cc, ok := b.c.(*goredis.ClusterClient)
	if !ok {
		return nil, fmt.Errorf("redis: redirected to %s by a server that is not a Cluster node", addr)
	}
	var mu sync.Mutex
	var found *goredis.Client
	err := cc.ForEachShard(ctx, func(_ context.Context, c *goredis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	if found == nil && err == nil {
		err = fmt.Errorf("redis: redirected to %s, a node the Cluster's topology does not list (yet)", addr)
	}
	return found, err
}

// refuseGrant removes a grant its replicas did not acknowledge (owner and
// token guarded: release.lua) and returns the *ReplicaAckError for it.
func (b *Backend) refuseGrant(ctx context.Context, g driver.Grant, acked int, timeout time.Duration) error {
	e := &ReplicaAckError{Op: "acquire", Key: g.Key, Want: b.waitReplicas, Acked: acked, Timeout: timeout}
	// Removed even when ctx has ended (the WAIT may have used all of
	// it), within a short bound of its own.
	dl := time.Now().Add(cleanupWait)
	if d, ok := ctx.Deadline(); ok && d.After(dl) {
		dl = d
	}
	cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl)
	defer cancel()
	lock, _, channel := b.ks.names(g.Key)
	n, err := releaseScript.Run(cctx, b.c, []string{lock, b.ks.marker(g.Key)}, recordHead(g), channel).Int64()
	switch {
	case err != nil:
		e.Cleanup = err
	case n != 1:
		e.Cleanup = errors.New("the record was no longer the grant's")
	}
	return e
}

// runPipelinedAcked is runPipelined followed by one WAIT on the same
// connection (a single server's or the Sentinel's primary), which covers
// every call of the pipeline; it returns the number of replicas that
// acknowledged. Calls answered NOSCRIPT are sent again with EVAL, and the
// WAIT with them.
func (b *Backend) runPipelinedAcked(ctx context.Context, s script, calls []scriptCall) ([]*goredis.Cmd, int, error) {
	if len(calls) == 0 {
		return nil, 0, nil
	}
	timeout := b.waitTimeout(ctx)
	cmds := make([]*goredis.Cmd, len(calls))
	pipe := b.c.Pipeline()
	for i, call := range calls {
		cmds[i] = pipe.EvalSha(ctx, s.Hash(), call.keys, call.args...)
	}
	w := pipe.Do(ctx, "WAIT", b.waitReplicas, timeout.Milliseconds())
	if _, err := pipe.Exec(ctx); err != nil && !isRedisError(err) {
		return nil, 0, err
	}
	acked, err := w.Int64()
	if err != nil {
		return nil, 0, fmt.Errorf("redis: WAIT: %w", err)
	}
	var retry []int
	for i, cmd := range cmds {
		if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		// Another connection, maybe: its WAIT covers its own writes,
		// the first one's those of the first pipeline.
		pipe = b.c.Pipeline()
		for _, i := range retry {
			cmds[i] = pipe.Eval(ctx, s.src, calls[i].keys, calls[i].args...)
		}
		w = pipe.Do(ctx, "WAIT", b.waitReplicas, b.waitTimeout(ctx).Milliseconds())
		if _, err := pipe.Exec(ctx); err != nil && !isRedisError(err) {
			return nil, 0, err
		}
		n, err := w.Int64()
		if err != nil {
			return nil, 0, fmt.Errorf("redis: WAIT: %w", err)
		}
		acked = min(acked, n)
	}
	return cmds, int(acked), nil
}
