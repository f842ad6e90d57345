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

	mu       sync.Mutex
	stopped  bool
	running  bool          // the consumer runs
	starting bool          // kick's goroutine is starting it
	done     chan struct{} // closed by stop
	waiters  map[string]map[chan struct{}]struct{}
	losers   map[string]map[*loser]struct{}
	wg       sync.WaitGroup
}

type loser struct {
	owner string
	seq   uint64 // the holder's last write known at registration
	lost  func(error)
}

// kick starts the consumer in the background if it is neither running
// nor starting, delivering from sequence from (0: new messages only):
// Watch and NotifyLoss never wait for it (a call's bound must not include
// the consumer's creation). If it cannot start, the waiters' channels are
// closed (they poll) and holders learn of loss at their renewals; the
// next Watch or NotifyLoss tries again.
func (d *dispatch) kick(from uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped || d.running || d.starting {
		return
	}
	d.starting = true
	d.wg.Go(func() {
		err := d.start(from)
		d.mu.Lock()
		defer d.mu.Unlock()
		d.starting = false
		if err == nil {
			d.running = true
			d.caughtUp()
			return
		}
		for key, chs := range d.waiters {
			for ch := range chs {
				close(ch)
			}
			delete(d.waiters, key)
		}
	})
}

// caughtUp covers what the consumer, just started (d.mu held), may have
// missed: it delivers from where kick asked, which may be after a
// waiter's or a holder's registration (a Watch starts it at the
// stream's end, and Watch returns before it runs). Every waiter
// registered so far is woken (it tries the key again; a spurious wake
// costs one attempt), and every holder registered so far has its record
// read, and its loss reported if the record is no longer its own.
func (d *dispatch) caughtUp() {
	for _, chs := range d.waiters {
		for ch := range chs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	for key, ls := range d.losers {
		for l := range ls {
			d.wg.Go(func() { d.check(key, l) })
		}
	}
}

// check reads key's record and reports l's loss if a newer record than
// l's last write is not of l's owner. A failed read reports nothing: the
// holder learns at its renewal.
func (d *dispatch) check(key string, l *loser) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	go func() {
		select {
		case <-d.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	rec, err := d.b.last(ctx, d.b.lockSubj(key))
	if err != nil || rec == nil || rec.seq <= l.seq || (rec.held() && rec.owner == l.owner) {
		return
	}
	d.mu.Lock()
	_, ok := d.losers[key][l]
	if ok {
		delete(d.losers[key], l)
		if len(d.losers[key]) == 0 {
			delete(d.losers, key)
		}
	}
	d.mu.Unlock()
	if ok {
		l.lost(lossCause(key))
	}
}

// start creates the ordered consumer and starts consuming.
func (d *dispatch) start(from uint64) error {
	d.startMu.Lock()
	defer d.startMu.Unlock()
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
	go func() {
		select {
		case <-d.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	cons, err := d.b.js.OrderedConsumer(ctx, d.b.stream, cfg)
	if err != nil {
		return err
	}
	d.mu.Lock()
	stopped := d.stopped
	d.mu.Unlock()
	if stopped {
		return driver.ErrClosed
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
		cause := lossCause(key)
		d.wg.Go(func() { l.lost(cause) })
	}
	d.mu.Unlock()
}

// stop ends the consumer and every Watch, and waits for loss callbacks
// under way.
func (d *dispatch) stop() {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return
	}
	d.stopped = true
	close(d.done)
	for _, chs := range d.waiters {
		for ch := range chs {
			close(ch)
		}
	}
	d.waiters, d.losers = nil, nil
	d.mu.Unlock()
	d.wg.Wait() // a start under way ends (done is closed)
	d.startMu.Lock()
	if d.cc != nil {
		d.cc.Stop()
	}
	d.startMu.Unlock()
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
	d.kick(0)
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
	d := &b.w
	d.kick(hd.seq + 1)
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

// lossCause is the error a holder's loss is reported with.
func lossCause(key string) error {
	return fmt.Errorf("nats: %w: the record of %q was replaced (it expired and the server removed it, or it was released by force)", driver.ErrNotHeld, key)
}
