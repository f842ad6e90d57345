package redis

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/driver"
)

const (
	// confirmWait bounds how long Watch waits for the server to confirm a
	// new subscription. Past it Watch returns anyway: a release published
	// before the subscription took effect is missed, which only delays the
	// waiter until its next poll.
	confirmWait = 2 * time.Second
	// pingEvery is how long the pub/sub connection may stay silent before
	// it is pinged; a second silent period means it is dead.
	pingEvery = 5 * time.Second
)

// watchHub multiplexes every Watch of a Backend onto one pub/sub
// connection with one goroutine, started by the first Watch and ended by
// Close or by the connection failing.
//
// Each key has its own channel ({P:E}:released), subscribed while someone
// in this process waits for the key. A release or force-release publishes
// once; the hub passes each notification to ONE of the key's local
// waiters, the longest-waiting one that has no wake-up pending, so a
// release does not send every waiter of this process to the server at
// once. (Waiters in other processes are woken by their own hubs; whoever
// loses the race gets ErrNotAcquired and waits again.)
type watchHub struct {
	b *Backend

	mu      sync.Mutex
	closed  bool
	ps      *goredis.PubSub
	subs    map[string]*chanSubs
	pending map[string]int // SUBSCRIBE commands sent and not yet confirmed
	wg      sync.WaitGroup
}

type chanSubs struct {
	waiters []*waiter // in order of arrival
	ready   chan struct{}
	isReady bool
}

type waiter struct {
	ctx    context.Context // the Watch's; a waiter whose ctx ended is skipped
	ch     chan struct{}
	closed bool
}

// Watch implements driver.Watcher. The channel receives a value when key
// may have become free (released or force-released; expiry is not
// signalled, the engine waits for the Remaining of the holder instead) and
// is closed when ctx ends, when the backend is closed, or when the pub/sub
// connection fails.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	return b.w.watch(ctx, b.ks.channel(key))
}

func (h *watchHub) watch(ctx context.Context, channel string) (<-chan struct{}, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, driver.ErrClosed
	}
	if h.ps == nil {
		h.ps = h.b.c.Subscribe(context.WithoutCancel(ctx))
		h.subs = make(map[string]*chanSubs)
		h.pending = make(map[string]int)
		h.wg.Add(1)
		go h.loop(h.ps)
	}
	cs := h.subs[channel]
	if cs == nil {
		// Written under h.mu so SUBSCRIBE and UNSUBSCRIBE of a channel
		// reach the server in the order of h.subs's changes.
		if err := h.ps.Subscribe(ctx, channel); err != nil {
			h.mu.Unlock()
			return nil, err
		}
		cs = &chanSubs{ready: make(chan struct{})}
		h.subs[channel] = cs
		h.pending[channel]++
	}
	w := &waiter{ctx: ctx, ch: make(chan struct{}, 1)}
	cs.waiters = append(cs.waiters, w)
	ready := cs.ready
	h.mu.Unlock()

	context.AfterFunc(ctx, func() { h.remove(channel, cs, w) })

	t := time.NewTimer(confirmWait)
	defer t.Stop()
	select {
	case <-ready:
	case <-ctx.Done():
	case <-t.C:
	}
	return w.ch, nil
}

// remove ends one Watch, unsubscribing the channel after its last waiter.
func (h *watchHub) remove(channel string, cs *chanSubs, w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.closed {
		return // the connection failed or the backend closed meanwhile
	}
	w.closed = true
	close(w.ch)
	for i, x := range cs.waiters {
		if x == w {
			cs.waiters = append(cs.waiters[:i], cs.waiters[i+1:]...)
			break
		}
	}
	if len(cs.waiters) == 0 && h.subs[channel] == cs {
		delete(h.subs, channel)
		ctx, cancel := context.WithTimeout(context.Background(), confirmWait)
		defer cancel()
		// A failure here leaves a useless subscription until the
		// connection fails or the backend closes; harmless.
		_ = h.ps.Unsubscribe(ctx, channel)
	}
}

// loop reads the pub/sub connection until it fails or is closed.
func (h *watchHub) loop(ps *goredis.PubSub) {
	defer h.wg.Done()
	ctx := context.Background()
	silent := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, pingEvery)
		if err != nil {
			var ne net.Error
			if !silent && errors.As(err, &ne) && ne.Timeout() {
				silent = true
				pctx, cancel := context.WithTimeout(ctx, pingEvery)
				err = ps.Ping(pctx)
				cancel()
				if err == nil {
					continue
				}
			}
			h.fail(ps)
			return
		}
		silent = false
		switch m := msg.(type) {
		case *goredis.Message:
			h.dispatch(m.Channel)
		case *goredis.Subscription:
			if m.Kind == "subscribe" {
				h.confirmed(m.Channel)
			}
		}
	}
}

// dispatch wakes the longest-waiting waiter of channel that has no wake-up
// pending and still waits (its context not ended: a wake-up given to a
// waiter that is leaving would be lost).
func (h *watchHub) dispatch(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.subs[channel]
	if cs == nil {
		return
	}
	for _, w := range cs.waiters {
		if w.ctx.Err() != nil {
			continue
		}
		select {
		case w.ch <- struct{}{}:
			return
		default:
		}
	}
}

func (h *watchHub) confirmed(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pending == nil {
		return
	}
	if n := h.pending[channel] - 1; n > 0 {
		h.pending[channel] = n
		return
	}
	delete(h.pending, channel)
	if cs := h.subs[channel]; cs != nil && !cs.isReady {
		cs.isReady = true
		close(cs.ready)
	}
}

// fail drops a failed (or closed) pub/sub connection: every current Watch
// channel is closed, so the engine falls back to polling, and the next
// Watch opens a new connection.
func (h *watchHub) fail(ps *goredis.PubSub) {
	h.mu.Lock()
	if h.ps == ps {
		h.dropLocked()
	}
	h.mu.Unlock()
	_ = ps.Close()
}

func (h *watchHub) dropLocked() {
	for _, cs := range h.subs {
		for _, w := range cs.waiters {
			if !w.closed {
				w.closed = true
				close(w.ch)
			}
		}
		if !cs.isReady {
			cs.isReady = true
			close(cs.ready)
		}
	}
	h.ps, h.subs, h.pending = nil, nil, nil
}

// close ends the hub: Watch channels are closed and the goroutine exits.
func (h *watchHub) close() {
	h.mu.Lock()
	h.closed = true
	ps := h.ps
	if ps != nil {
		h.dropLocked()
	}
	h.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
	h.wg.Wait()
}
