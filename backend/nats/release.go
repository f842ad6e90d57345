package nats

import (
	"context"
	"fmt"
	"strconv"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/fencelock/fencelock/driver"
)

// purgeHeader is a marker that replaces a subject's record (a key-value
// purge, which waiters and holders watching the bucket see) and leaves
// the bucket after markerTTL.
func purgeHeader() natsgo.Header {
	h := natsgo.Header{}
	h.Set(hdrKVOp, "PURGE")
	h.Set(hdrRollup, "sub")
	h.Set(hdrTTL, strconv.FormatInt(int64(markerTTL.Seconds()), 10)+"s")
	return h
}

// writeTries bounds the writes of a Renew or Release whose compare keeps
// failing while the record is still the grant's: a floor raised
// meanwhile, or (on a cluster) a write of the key still in flight, which
// the stream's leader answers with a failed compare at once.
const writeTries = 8

// settle waits before the next try of a write whose compare failed
// because another write of the key was in flight on a cluster (error
// code 10164, which the stream's leader answers at once, before that
// write is stored): try × 2 ms. A plain failed compare does not wait.
func settle(ctx context.Context, try int, err error) error {
	if !isCode(err, errCodeWrongLastSeqConst) {
		return nil
	}
	return sleepCtx(ctx, time.Duration(try)*2*time.Millisecond)
}

// sleepCtx waits for d, or returns ctx's error if ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Release implements driver.Backend: a purge marker replaces the record
// only if the last sequence of the key's subjects is the one the grant
// last wrote; a failed compare costs a read, as in Renew.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if err := driver.ValidateKey(g.Key); err != nil {
		return err
	}
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if g.Owner == "" || g.Token == 0 {
		return driver.ErrNotHeld
	}
	hd, known := grantHandle(g)
	if !known {
		var err error
		if hd, err = b.find(ctx, g, 0); err != nil {
			return err
		}
	}
	seq, err := b.purge(ctx, g.Key, hd.seq)
	for try := 1; conflict(err); try++ {
		if try == writeTries {
			return fmt.Errorf("nats: the record of %q changed %d times while it was released; try again: %w", g.Key, try, err)
		}
		if err := settle(ctx, try, err); err != nil {
			return err
		}
		if hd, err = b.find(ctx, g, hd.delay); err != nil {
			return err
		}
		known = false
		seq, err = b.purge(ctx, g.Key, hd.seq)
	}
	if err != nil {
		return err
	}
	b.hints.set(g.Key, hint{seq: seq, foff: hd.foff})
	if hd.delay > 0 || !known {
		// A released key is free at once: remove the grant's lock-delay
		// marker, if it has one. A failure leaves it to its TTL.
		_ = b.dropDelay(ctx, g.Key, g.Owner)
	}
	return nil
}

// purge writes a purge marker on key's lock record, expecting seq as the
// last sequence of the key's subjects.
func (b *Backend) purge(ctx context.Context, key string, seq uint64) (uint64, error) {
	h := purgeHeader()
	h.Set(hdrExpSeq, strconv.FormatUint(seq, 10))
	h.Set(hdrExpSeqSubj, b.keySubj(key))
	return b.publish(ctx, b.lockSubj(key), h, nil)
}

// ForceRelease implements driver.ForceReleaser: the key's record, whoever
// holds it, is replaced by a purge marker (compared on its sequence, so
// a holder that renewed meanwhile is not removed unseen: that is a
// transient error), and its lock-delay marker is removed. The holder
// learns of it from the bucket's watch.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
	}
	rec, fl, err := b.read(ctx, key)
	if err != nil {
		return driver.Info{}, err
	}
	var removed driver.Info
	if rec.held() {
		removed = driver.Info{Key: key, Owner: rec.owner, Token: rec.token(), Metadata: rec.md}
		// Compared on the key's subjects, as every lock write is: on a
		// cluster only writes naming the same compare are held back
		// while one is in flight, so a compare of the lock record alone
		// could pass beside the holder's renewal.
		h := purgeHeader()
		h.Set(hdrExpSeq, strconv.FormatUint(max(rec.seq, seqOf(fl)), 10))
		h.Set(hdrExpSeqSubj, b.keySubj(key))
		if _, err := b.publish(ctx, b.lockSubj(key), h, nil); err != nil {
			if conflict(err) {
				return driver.Info{}, fmt.Errorf("nats: the record of %q changed while it was force-released; try again: %w", key, err)
			}
			return driver.Info{}, err
		}
	} else {
		removed = driver.Info{Key: key}
	}
	if _, err := b.publish(ctx, b.delaySubj(key), purgeHeader(), nil); err != nil {
		return driver.Info{}, err
	}
	return removed, nil
}
