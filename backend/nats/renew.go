package nats

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/fencelock/fencelock/driver"
)

// Renew implements driver.Backend: the record is written again, with a
// new TTL, only if the last sequence of the key's subjects is the one
// the grant last wrote (so it is still the grant's record, and the
// floor's offset the grant knows is current). A failed compare costs a
// read: a record that is still the grant's (a renewal whose reply was
// lost, or a floor raised meanwhile) is written again expecting what
// was read; anything else is ErrNotHeld. Rotation writes a record whose
// token is its own sequence plus the floor's offset.
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.ValidateKey(g.Key); err != nil {
		return driver.Grant{}, err
	}
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	if g.Owner == "" || g.Token == 0 {
		return driver.Grant{}, driver.ErrNotHeld
	}
	secs := ttlSeconds(req.TTL)
	hd, ok := grantHandle(g)
	if !ok {
		var err error
		if hd, err = b.find(ctx, g, hd.delay); err != nil {
			return driver.Grant{}, err
		}
	}
	md := hd.md
	if req.SetMetadata {
		md = req.Metadata
	}
	nh, err := b.put(ctx, g.Key, g.Owner, hd, secs, req.Rotate, md)
	for try := 1; conflict(err); try++ {
		if try == writeTries {
			return driver.Grant{}, fmt.Errorf("nats: the record of %q changed %d times while it was renewed; try again: %w", g.Key, try, err)
		}
		if err := settle(ctx, try, err); err != nil {
			return driver.Grant{}, err
		}
		if hd, err = b.find(ctx, g, hd.delay); err != nil {
			return driver.Grant{}, err
		}
		if !req.SetMetadata {
			md = hd.md
		}
		nh, err = b.put(ctx, g.Key, g.Owner, hd, secs, req.Rotate, md)
	}
	if err != nil {
		return driver.Grant{}, err
	}
	return b.granted(ctx, g.Key, g.Owner, nh, secs, req.TTL)
}

// find reads the record of grant g: ErrNotHeld unless it is g's (the
// same owner and token) and alive. The handle returned expects what was
// read.
func (b *Backend) find(ctx context.Context, g driver.Grant, delay time.Duration) (handle, error) {
	rec, fl, err := b.read(ctx, g.Key)
	if err != nil {
		return handle{}, err
	}
	if !rec.held() || rec.owner != g.Owner || rec.token() != g.Token {
		return handle{}, driver.ErrNotHeld
	}
	if rec.ttl > 0 && !rec.ts.Add(rec.ttl).After(b.now(ctx)) {
		return handle{}, driver.ErrNotHeld // expired; the server removes it
	}
	return handle{owner: ownerHash(g.Owner), seq: max(rec.seq, seqOf(fl)), native: rec.native, off: rec.off, foff: floorOf(fl), delay: delay, md: rec.md}, nil
}

// put writes a key's record again for its owner, expecting hd.seq as the
// last sequence of the key's subjects, and returns the new handle. With
// rotate the record gets a new native token (its own sequence) and the
// floor's offset; else it keeps hd's.
func (b *Backend) put(ctx context.Context, key, owner string, hd handle, secs int64, rotate bool, md []byte) (handle, error) {
	hdr := natsgo.Header{}
	hdr.Set(hdrOwner, owner)
	off := hd.off
	if rotate {
		off = hd.foff
	} else {
		hdr.Set(hdrNative, strconv.FormatUint(hd.native, 10))
	}
	if off > 0 {
		hdr.Set(hdrOffset, strconv.FormatUint(off, 10))
	}
	hdr.Set(hdrTTL, strconv.FormatInt(secs, 10)+"s")
	hdr.Set(hdrExpSeq, strconv.FormatUint(hd.seq, 10))
	hdr.Set(hdrExpSeqSubj, b.keySubj(key))
	seq, err := b.publish(ctx, b.lockSubj(key), hdr, md)
	if err != nil {
		return handle{}, err
	}
	nh := handle{owner: ownerHash(owner), seq: seq, native: hd.native, off: off, foff: hd.foff, delay: hd.delay, md: md}
	if rotate {
		nh.native = seq
	}
	if len(nh.md) == 0 {
		nh.md = nil
	}
	return nh, nil
}

// RenewBatch implements driver.BatchRenewer. JetStream has no write of
// many subjects with a compare each, so the renewals are pipelined: sent
// together on the connection, their acknowledgements awaited together,
// which costs about one round trip for the batch.
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	out := make([]driver.RenewResult, len(grants))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for i, g := range grants {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ng, err := b.Renew(ctx, g, driver.RenewRequest{TTL: req.TTL, Rotate: req.Rotate})
			out[i] = driver.RenewResult{Grant: ng, Err: err}
		})
	}
	wg.Wait()
	return out, nil
}
