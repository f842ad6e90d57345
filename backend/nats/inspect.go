package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencelock/fencelock/driver"
)

// Inspect implements driver.Backend: the key's lock record, read from the
// stream's leader, with its remaining time by the server's clock
// (estimated, see clock).
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
	}
	rec, err := b.last(ctx, b.lockSubj(key))
	if err != nil {
		return driver.Info{}, err
	}
	if !rec.held() {
		return driver.Info{Key: key}, nil
	}
	return info(key, rec, b.now(ctx)), nil
}

// List implements driver.Backend: the last record of every key, read
// with a consumer of the bucket's lock subjects.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	now := b.now(ctx)
	var out []driver.Info
	err := b.scan(ctx, b.subj+"l.>", false, func(subject string, r *record) {
		key, ok := b.keyOf(subject)
		if !ok || !strings.HasPrefix(key, prefix) {
			return
		}
		if i := info(key, r, now); i.Locked() {
			out = append(out, i)
		}
	})
	return out, err
}

// scan calls fn with the last message of every subject matching filter,
// through an ephemeral consumer that it deletes again.
func (b *Backend) scan(ctx context.Context, filter string, headersOnly bool, fn func(subject string, r *record)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 4*requestTimeout)
		defer cancel()
	}
	cons, err := b.scanConsumer(ctx, filter, headersOnly)
	if err != nil {
		return fmt.Errorf("nats: reading the bucket: %w", err)
	}
	ci := cons.CachedInfo()
	defer b.dropConsumer(ctx, ci.Name)
	// The consumer delivers the last message of each subject first
	// (NumPending of them at its creation), then whatever is written
	// later, which is not read: the scan is of the bucket as it was.
	pending := ci.NumPending
	last := map[string]*record{}
	defer func() {
		for subject, r := range last {
			fn(subject, r)
		}
	}()
	for noResp := 0; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 512)), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return fmt.Errorf("nats: reading the bucket: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			if r := last[m.Subject()]; r == nil || r.seq < md.Sequence.Stream {
				last[m.Subject()] = parseRecord(md.Sequence.Stream, md.Timestamp, m.Headers(), m.Data())
			}
			pending--
		}
		err = batch.Error()
		if n == 0 && errors.Is(err, natsgo.ErrNoResponders) && noResp < 50 {
			// In a cluster the consumer's server may not yet have told
			// the client's server that it serves the consumer's pull
			// requests: ask again in a moment.
			noResp++
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(noResp) * 5 * time.Millisecond):
			}
			continue
		}
		if err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("nats: reading the bucket: %w", err)
		}
		if n == 0 {
			break // the rest expired meanwhile
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// scanPlacements bounds how many consumers scan creates to get one on the
// stream's leader: each lands on one of the replicas at random.
const scanPlacements = 40

// scanConsumer creates scan's ephemeral consumer of the last message of
// each subject matching filter. The consumer delivers from the copy of
// the stream on the server that hosts it, so on a replicated stream it
// must be hosted by the stream's leader: a follower's copy can lag behind
// writes the leader has acknowledged, and a scan from it would miss a
// grant or a floor raise that completed before the scan began (List
// without a held key, HighWater below a token already issued). The
// server places a one-replica consumer on any replica of the stream, so
// one placed elsewhere is deleted and another created; the leader is
// read again once one is placed, so that a leader change meanwhile is
// not missed.
func (b *Backend) scanConsumer(ctx context.Context, filter string, headersOnly bool) (jetstream.Consumer, error) {
	cfg := jetstream.ConsumerConfig{
		FilterSubject:     filter,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		HeadersOnly:       headersOnly,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: time.Minute,
	}
	leader, err := b.streamLeader(ctx)
	if err != nil {
		return nil, err
	}
	for range scanPlacements {
		cons, err := b.js.CreateConsumer(ctx, b.stream, cfg)
		if err != nil {
			return nil, err
		}
		ci := cons.CachedInfo()
		if leader == "" {
			return cons, nil // one server: its copy is the stream
		}
		if ci.Cluster != nil && ci.Cluster.Leader == leader {
			now, err := b.streamLeader(ctx)
			if err == nil && now == leader {
				return cons, nil
			}
			if err != nil {
				b.dropConsumer(ctx, ci.Name)
				return nil, err
			}
			leader = now
		}
		b.dropConsumer(ctx, ci.Name)
	}
	return nil, fmt.Errorf("no consumer of stream %s was placed on its leader %q in %d tries (the server places it on a replica at random); try again", b.stream, leader, scanPlacements)
}

// streamLeader returns the server that leads the bucket's stream, "" for
// a stream of one replica.
func (b *Backend) streamLeader(ctx context.Context) (string, error) {
	si, err := b.streamInfo(ctx)
	if err != nil {
		return "", err
	}
	if si.Config.Replicas <= 1 || si.Cluster == nil {
		return "", nil
	}
	if si.Cluster.Leader == "" {
		return "", fmt.Errorf("stream %s has no leader now (an election is under way); try again", b.stream)
	}
	return si.Cluster.Leader, nil
}

// dropConsumer deletes one of scan's consumers; a failure leaves it to
// its inactivity threshold.
func (b *Backend) dropConsumer(ctx context.Context, name string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
	defer cancel()
	_ = b.js.DeleteConsumer(dctx, b.stream, name)
}
