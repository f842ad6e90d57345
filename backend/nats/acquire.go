package nats

import (
	"context"
	"strconv"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/fencelock/fencelock/driver"
)

// Acquire implements driver.Backend. It is one write when the backend's
// hint for the key is right (a key never used, or one it released): the
// record is stored only if the last sequence of the key's subjects (its
// lock record and its floor record, keySubj) is the one expected, with a
// per-message TTL the server enforces. The token is the write's stream
// sequence plus the key's floor offset, which the same compare proves
// current (floor.go). A failed compare costs a read of both records: a
// live record is a HeldError (or, for the same owner, the existing
// grant); a marker or nothing is a second write, expecting what was read.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	secs := ttlSeconds(req.TTL)
	if req.LockDelay > 0 {
		if err := b.delayCheck(ctx, req); err != nil {
			return driver.Grant{}, err
		}
	}
	h := b.hints.get(req.Key)
	for attempt := 0; ; attempt++ {
		hdr := natsgo.Header{}
		hdr.Set(hdrOwner, req.Owner)
		if h.foff > 0 {
			hdr.Set(hdrOffset, strconv.FormatUint(h.foff, 10))
		}
		hdr.Set(hdrTTL, strconv.FormatInt(secs, 10)+"s")
		hdr.Set(hdrExpSeq, strconv.FormatUint(h.seq, 10))
		hdr.Set(hdrExpSeqSubj, b.keySubj(req.Key))
		seq, err := b.publish(ctx, b.lockSubj(req.Key), hdr, req.Metadata)
		if err == nil {
			b.hints.drop(req.Key)
			hd := handle{owner: ownerHash(req.Owner), seq: seq, native: seq, off: h.foff, foff: h.foff, delay: req.LockDelay, md: req.Metadata}
			return b.granted(ctx, req.Key, req.Owner, hd, secs, req.TTL)
		}
		if !conflict(err) {
			return driver.Grant{}, err
		}
		if attempt > 0 {
			// Changed again between the read and the write: contended.
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
		}
		rec, fl, err := b.read(ctx, req.Key)
		if err != nil {
			return driver.Grant{}, err
		}
		if rec.held() {
			if rec.owner == req.Owner {
				return b.again(ctx, req, rec, fl, secs)
			}
			return driver.Grant{}, b.heldError(ctx, req.Key, rec)
		}
		h = hint{seq: max(seqOf(rec), seqOf(fl)), foff: floorOf(fl)}
	}
}

// granted completes a grant written as hd: the lock delay's marker, if
// asked for, then the Grant.
func (b *Backend) granted(ctx context.Context, key, owner string, hd handle, secs int64, asked time.Duration) (driver.Grant, error) {
	if hd.delay > 0 {
		// The marker follows the record; a failure leaves a grant
		// without one, which a retry of the Acquire (the same owner)
		// completes.
		if err := b.putDelay(ctx, key, owner, secs, hd.delay); err != nil {
			return driver.Grant{}, err
		}
	}
	g := driver.Grant{Key: key, Owner: owner, Token: driver.Token(hd.native + hd.off), Handle: hd.String()}
	if granted := time.Duration(secs) * time.Second; granted != asked {
		g.TTL = granted
	}
	return g, nil
}

// again answers an Acquire by the owner of the key's live record: a retry
// of an acquisition that succeeded. The grant is the record's token, with
// this request's metadata, and the record is written again (a renewal,
// compared on its sequence, which keeps the token): the engine counts the
// grant's TTL from this call, so the server's expiry must be counted from
// it too, not from the first write, which may be a lost reply's timeout
// ago.
func (b *Backend) again(ctx context.Context, req driver.AcquireRequest, rec, fl *record, secs int64) (driver.Grant, error) {
	hd := handle{owner: ownerHash(req.Owner), seq: max(rec.seq, seqOf(fl)), native: rec.native, off: rec.off, foff: floorOf(fl), delay: req.LockDelay, md: rec.md}
	nh, err := b.put(ctx, req.Key, req.Owner, hd, secs, false, req.Metadata)
	if err != nil {
		if conflict(err) {
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
		}
		return driver.Grant{}, err
	}
	return b.granted(ctx, req.Key, req.Owner, nh, secs, req.TTL)
}

// read returns a key's lock record and floor record (nil if absent).
func (b *Backend) read(ctx context.Context, key string) (rec, fl *record, err error) {
	if rec, err = b.last(ctx, b.lockSubj(key)); err != nil {
		return nil, nil, err
	}
	if fl, err = b.last(ctx, b.floorSubj(key)); err != nil {
		return nil, nil, err
	}
	return rec, fl, nil
}

func seqOf(r *record) uint64 {
	if r == nil {
		return 0
	}
	return r.seq
}

// heldError describes a key found held by rec.
func (b *Backend) heldError(ctx context.Context, key string, rec *record) error {
	i := info(key, rec, b.now(ctx))
	if !i.Locked() {
		// Expired by the server's clock, not yet removed: the server
		// removes it in a moment.
		i = driver.Info{Key: key, Owner: rec.owner, Token: rec.token(), Metadata: rec.md}
	}
	return &driver.HeldError{Holder: i}
}
