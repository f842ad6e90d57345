package zookeeper

import (
	"context"
	"errors"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fencelock/fencelock/driver"
)

var _ driver.Watcher = (*Backend)(nil)

// Watch implements driver.Watcher: it wakes its caller on every change of
// key's queue (a child of the key's znode created or deleted) and of its
// head's data (a rotation or a metadata update rewrites it), with a
// children watch on the key's znode and a data watch on the head, re-armed
// after each event. If the key's znode does not exist, an exists watch
// waits for it. The engine's own waiting uses the queue (AcquireWait);
// Watch serves callers that follow a key's holder, such as fencelock's
// Observe, without polling. One goroutine runs until ctx ends or the
// backend closes; then the channel is closed. While the connection is
// down it re-arms with backoff (up to 1s) and wakes the caller once it
// could, since a change may have been missed.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return nil, driver.ErrClosed
	}
	b.wg.Add(1)
	b.mu.Unlock()
	ch := make(chan struct{}, 1)
	wake := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	parent := b.parent(key)
	go func() {
		defer b.wg.Done()
		defer close(ch)
		backoff := 50 * time.Millisecond
		missed := false // an arm failed: a change may have gone unseen
		for ctx.Err() == nil && !b.closed.Load() {
			evs, err := b.armWatches(ctx, parent)
			if err != nil {
				missed = true
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-ctx.Done():
				case <-b.done:
				}
				t.Stop()
				backoff = min(2*backoff, time.Second)
				continue
			}
			backoff = 50 * time.Millisecond
			if missed {
				missed = false
				wake()
			}
			select {
			case <-evs:
				wake()
			case <-ctx.Done():
			case <-b.done:
			}
		}
	}()
	return ch, nil
}

// armWatches sets the watches of one round of Watch on the key znode
// parent and returns a channel that receives the first event of any.
func (b *Backend) armWatches(ctx context.Context, parent string) (<-chan zk.Event, error) {
	names, _, cw, err := b.conn.ChildrenW(ctx, parent)
	if errors.Is(err, zk.ErrNoNode) {
		ok, _, ew, err := b.conn.ExistsW(ctx, parent)
		if err != nil {
			return nil, err
		}
		if ok {
			return nil, errors.New("zookeeper: key znode created while arming a watch") // arm again
		}
		return ew, nil
	}
	if err != nil {
		return nil, err
	}
	cs := sortChildren(names)
	if len(cs) == 0 {
		return cw, nil
	}
	_, _, dw, err := b.conn.GetW(ctx, parent+"/"+cs[0].name)
	if errors.Is(err, zk.ErrNoNode) {
		return cw, nil // the head just went: the children watch fires
	}
	if err != nil {
		return nil, err
	}
	out := make(chan zk.Event, 2)
	go func() { out <- <-cw }()
	go func() { out <- <-dw }()
	return out, nil
}
