package nats

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencelock/fencelock/driver"
)

// The bucket's watch.
//
// A backend that waits or holds keeps one ordered consumer (headers
// only) on the bucket's lock records, started by the first Watch or
// NotifyLoss, and dispatches what it delivers by key: a marker (a
// release, a force release, or the marker the server writes where it
// removed an expired record) wakes the key's waiters; anything newer
// than a holder's last write that is not a record of its owner (a
// marker, or another owner's record) is that holder's loss.

type dispatch struct {
	b *Backend

	startMu sync.Mutex // serialises starting
	cc      jetstream.ConsumeContext

	mu      sync.Mutex
	stopped bool
	done    chan struct{} // closed by stop
	waiters map[string]map[chan struct{}]struct{}
	losers  map[string]map[*loser]struct{}
	wg      sync.WaitGroup
}

type loser struct {
	owner string
	seq   uint64 // the holder's last write known at registration
	lost  func(error)
}

// start starts the consumer if it is not running, delivering from
// sequence from (0: new messages only).
func (d *dispatch) start(from uint64) error {
	d.startMu.Lock()
	defer d.startMu.Unlock()
	if d.cc != nil {
		return nil
	}
	d.mu.Lock()
	stopped := d.stopped
	d.mu.Unlock()
	if stopped {
		return driver.ErrClosed
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{d.b.subj + "l.>"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
		HeadersOnly:    true,
	}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	cons, err := d.b.js.OrderedConsumer(ctx, d.b.stream, cfg)
	if err != nil {
		return err
	}
	cc, err := cons.Consume(d.deliver, jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) {}))
	if err != nil {
		return err
	}
	d.cc = cc
	return nil
}

// deliver dispatches one message of the consumer.
func (d *dispatch) deliver(m jetstream.Msg) {
	key, ok := d.b.keyOf(m.Subject())
	if !ok {
		return
	}
	md, err := m.Metadata()
	if err != nil {
		return
	}
	r := parseRecord(md.Sequence.Stream, md.Timestamp, m.Headers(), nil)
	var fire []*loser
	d.mu.Lock()
	if !r.held() {
		for ch := range d.waiters[key] {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	for l := range d.losers[key] {
		if r.seq > l.seq && r.owner != l.owner {
			delete(d.losers[key], l)
			fire = append(fire, l)
		}
	}
	if len(d.losers[key]) == 0 {
		delete(d.losers, key)
	}
	for _, l := range fire {
		cause := fmt.Errorf("nats: %w: the record of %q was replaced (it expired and the server removed it, or it was released by force)", driver.ErrNotHeld, key)
		d.wg.Go(func() { l.lost(cause) })
	}
	d.mu.Unlock()
}

// stop ends the consumer and every Watch, and waits for loss callbacks
// under way.
func (d *dispatch) stop() {
	d.startMu.Lock()
	d.mu.Lock()
	d.stopped = true
	close(d.done)
	for _, chs := range d.waiters {
		for ch := range chs {
			close(ch)
		}
	}
	d.waiters, d.losers = nil, nil
	d.mu.Unlock()
	if d.cc != nil {
		d.cc.Stop()
	}
	d.startMu.Unlock()
	d.wg.Wait()
}

// Watch implements driver.Watcher: the channel receives a value when a
// marker replaces the key's record (a release, a force release, an
// expiry), until ctx ends or the backend closes.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if err := b.w.start(0); err != nil {
		return nil, err
	}
	d := &b.w
	ch := make(chan struct{}, 1)
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return nil, driver.ErrClosed
	}
	if d.waiters == nil {
		d.waiters = map[string]map[chan struct{}]struct{}{}
	}
	if d.waiters[key] == nil {
		d.waiters[key] = map[chan struct{}]struct{}{}
	}
	d.waiters[key][ch] = struct{}{}
	d.mu.Unlock()
	d.wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-d.done:
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if _, ok := d.waiters[key][ch]; ok {
			delete(d.waiters[key], ch)
			if len(d.waiters[key]) == 0 {
				delete(d.waiters, key)
			}
			close(ch)
		}
	})
	return ch, nil
}

// NotifyLoss implements driver.LossNotifier (see the bucket's watch).
// If the watch cannot be started, loss is learnt at the next renewal.
func (b *Backend) NotifyLoss(g driver.Grant, lost func(cause error)) (stop func()) {
	hd, ok := grantHandle(g)
	if !ok || b.closed.Load() {
		return func() {}
	}
	if err := b.w.start(hd.seq + 1); err != nil {
		return func() {}
	}
	d := &b.w
	l := &loser{owner: g.Owner, seq: hd.seq, lost: lost}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return func() {}
	}
	if d.losers == nil {
		d.losers = map[string]map[*loser]struct{}{}
	}
	if d.losers[g.Key] == nil {
		d.losers[g.Key] = map[*loser]struct{}{}
	}
	d.losers[g.Key][l] = struct{}{}
	return func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		delete(d.losers[g.Key], l)
		if len(d.losers[g.Key]) == 0 {
			delete(d.losers, g.Key)
		}
	}
}
