package nats

import (
	"context"
	"strconv"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/fencelock/fencelock/driver"
)

// Lock delay.
//
// A grant asked for with a lock delay writes a marker beside its record
// (delaySubj: outside keySubj, so it never disturbs the record's
// compares) naming its owner, whose TTL is the record's plus the delay,
// rounded up to whole seconds. Renew writes it again after the record;
// Release and ForceRelease remove it. So after an unreleased end (the
// record expired) the marker outlives the record by the delay, and an
// Acquire that asks for a lock delay refuses the key while a marker of
// another owner is alive. An Acquire without a lock delay does not look.

// delayCheck refuses req while another owner's lock-delay marker is
// alive: a HeldError naming the holder if its record is alive too, else
// one whose LockDelay is the marker's rest, by the server's clock.
func (b *Backend) delayCheck(ctx context.Context, req driver.AcquireRequest) error {
	m, err := b.last(ctx, b.delaySubj(req.Key))
	if err != nil {
		return err
	}
	if !m.held() || m.owner == req.Owner || m.ttl <= 0 {
		return nil
	}
	now := b.now(ctx)
	rest := m.ts.Add(m.ttl).Sub(now)
	if rest <= 0 {
		return nil
	}
	rec, err := b.last(ctx, b.lockSubj(req.Key))
	if err != nil {
		return err
	}
	if i := info(req.Key, rec, now); i.Locked() {
		return &driver.HeldError{Holder: i}
	}
	return &driver.HeldError{Holder: driver.Info{Key: req.Key}, LockDelay: rest}
}

// putDelay writes owner's lock-delay marker for a record of secs seconds.
func (b *Backend) putDelay(ctx context.Context, key, owner string, secs int64, delay time.Duration) error {
	h := natsgo.Header{}
	h.Set(hdrOwner, owner)
	h.Set(hdrTTL, strconv.FormatInt(secs+ttlSeconds(delay), 10)+"s")
	_, err := b.publish(ctx, b.delaySubj(key), h, nil)
	return err
}

// dropDelay removes owner's lock-delay marker of key, if it is there.
func (b *Backend) dropDelay(ctx context.Context, key, owner string) error {
	m, err := b.last(ctx, b.delaySubj(key))
	if err != nil || !m.held() || m.owner != owner {
		return err
	}
	h := purgeHeader()
	h.Set(hdrExpSeq, strconv.FormatUint(m.seq, 10))
	_, err = b.publish(ctx, b.delaySubj(key), h, nil)
	if conflict(err) {
		return nil // replaced meanwhile: not ours any more
	}
	return err
}
