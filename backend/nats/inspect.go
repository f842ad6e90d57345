package nats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

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
	cons, err := b.js.CreateConsumer(ctx, b.stream, jetstream.ConsumerConfig{
		FilterSubject:     filter,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		HeadersOnly:       headersOnly,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("nats: reading the bucket: %w", err)
	}
	ci := cons.CachedInfo()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		_ = b.js.DeleteConsumer(dctx, b.stream, ci.Name)
	}()
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
	for pending > 0 {
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
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
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
