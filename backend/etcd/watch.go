package etcd

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.Watcher = (*Backend)(nil)

// Watch implements driver.Watcher with one etcd watch on key's queue: it
// wakes the caller on every change of the queue (an entry put or re-put by
// a rotation or a metadata update, deleted, or expired with its lease),
// which includes every release. The engine's own waiting uses the queue
// (AcquireWait) instead; Watch serves callers that follow a key's holder,
// such as fencelock's Observe, without polling. The watch runs on one
// goroutine until ctx ends, the backend closes or etcd cancels it (then
// the channel is closed and the caller falls back to polling).
func (b *Backend) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(b.ctx, cancel) // Close ends the watch
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		stop()
		cancel()
		return nil, driver.ErrClosed
	}
	b.wg.Add(1)
	b.mu.Unlock()
	wch := b.cli.Watch(clientv3.WithRequireLeader(wctx), b.queuePrefix(key), clientv3.WithPrefix())
	ch := make(chan struct{}, 1)
	go func() {
		defer b.wg.Done()
		defer close(ch)
		defer stop()
		defer cancel()
		for resp := range wch {
			if resp.Canceled || resp.Err() != nil {
				return
			}
			if len(resp.Events) > 0 {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}()
	return ch, nil
}
