package etcdbench

import (
	"context"
	"strconv"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/internal/benchkit"
)

// rawQueue is the queue + watch strategy on the raw operations, without a
// library: a waiter puts its own entry under the key's queue prefix (on a
// lease granted once and kept alive), holds the lock when no entry has a
// lower create revision, and otherwise watches its predecessor's entry
// until it is deleted; release deletes the entry. Each release wakes only
// the next waiter. It has no one-attempt form.
var rawQueue = benchkit.Lib{Name: "raw-queue", Setup: func(b *testing.B) benchkit.Lockers {
	cli := client(b)
	ctx := context.Background()
	lease, err := cli.Grant(ctx, int64(ttl.Seconds()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Revoke(context.Background(), lease.ID) })
	kctx, cancel := context.WithCancel(ctx)
	b.Cleanup(cancel)
	if _, err := cli.KeepAlive(kctx, lease.ID); err != nil {
		b.Fatal(err)
	}
	prefix := "/rawq-" + benchkit.RandomHex() + "/"
	return func(i int) (try, wait benchkit.LockFunc) {
		var n int
		wait = func(ctx context.Context, key string) (func() error, error) {
			n++
			q := prefix + key + "/"
			me := q + strconv.Itoa(i) + "-" + strconv.Itoa(n)
			put, err := cli.Put(ctx, me, "", clientv3.WithLease(lease.ID))
			if err != nil {
				return nil, err
			}
			rev := put.Header.Revision // my entry's create revision
			release := func() error { _, err := cli.Delete(context.Background(), me); return err }
			for {
				// The entry just ahead of mine, if any.
				opts := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1), clientv3.WithLimit(1))
				g, err := cli.Get(ctx, q, opts...)
				if err != nil {
					_ = release()
					return nil, err
				}
				if len(g.Kvs) == 0 {
					return release, nil
				}
				pred := string(g.Kvs[0].Key)
				wctx, wcancel := context.WithCancel(ctx)
				for resp := range cli.Watch(wctx, pred, clientv3.WithRev(g.Header.Revision+1)) {
					if err := resp.Err(); err != nil {
						break
					}
					deleted := false
					for _, ev := range resp.Events {
						deleted = deleted || ev.Type == clientv3.EventTypeDelete
					}
					if deleted {
						break
					}
				}
				wcancel()
				if err := ctx.Err(); err != nil {
					_ = release()
					return nil, err
				}
			}
		}
		return nil, wait
	}
}}
