package nats

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/tokenfloor"
)

// Token floors.
//
// A token is a record's native token (the stream sequence of the write
// that acquired or rotated it) plus the offset of the key's floor in
// force then: a stream sequence cannot be set, so a floor is an offset.
// Each key has a floor record (floorSubj, its value the offset in
// decimal; absent: 0), which RaiseFloor alone writes and only ever
// raises. Every write of a lock record compares the last sequence of the
// key's lock and floor records together (keySubj, one wildcard filter
// that matches both: NATS Server's
// Nats-Expected-Last-Subject-Sequence-Subject), so the offset a write
// uses is the one in force when it is stored: a raise stored in between
// makes the compare fail, and the writer reads the new offset. A record
// carries the offset of its token in a header, so Renew, Release and
// Inspect never recompute it.
//
// Tokens of a key stay strictly increasing: a later grant has a larger
// native token and an offset at least as large. RaiseFloor(key, F), with
// the key's current offset o and the stream's last sequence L when it
// reads them, writes nothing if F <= L + o (every later grant has a
// native token above L and an offset at least o), else writes the offset
// F - L, compared on the floor record's own sequence: every later grant
// then has a token of at least L + 1 + F - L > F. A held lock keeps its
// token (its record's offset); the next grant is above the floor.
//
// The floors are per key: RaiseFloor("") is unsupported, and callers
// raise keys one by one. HighWater's Global is the stream's last sequence
// plus the largest offset of any key: above every token ever issued.

// floorOf returns the offset a floor record holds (0 if absent).
func floorOf(fl *record) uint64 {
	if fl == nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(fl.md)), 10, 64)
	return n
}

// HighWater implements driver.TokenFloorer: the token of every key whose
// record is alive, and Global, above every token issued.
func (b *Backend) HighWater(ctx context.Context, prefix string) (driver.HighWater, error) {
	if err := driver.ValidatePrefix(prefix); err != nil {
		return driver.HighWater{}, err
	}
	if b.closed.Load() {
		return driver.HighWater{}, driver.ErrClosed
	}
	si, err := b.streamInfo(ctx)
	if err != nil {
		return driver.HighWater{}, err
	}
	hw := driver.HighWater{Keys: map[string]driver.Token{}}
	err = b.scan(ctx, b.subj+"l.>", true, func(subject string, r *record) {
		if key, ok := b.keyOf(subject); ok && strings.HasPrefix(key, prefix) && r.held() {
			hw.Keys[key] = max(hw.Keys[key], r.token())
		}
	})
	if err != nil {
		return driver.HighWater{}, err
	}
	var maxOff uint64
	err = b.scan(ctx, b.subj+"f.>", false, func(_ string, r *record) { maxOff = max(maxOff, floorOf(r)) })
	if err != nil {
		return driver.HighWater{}, err
	}
	hw.Global = driver.Token(si.State.LastSeq + maxOff)
	return hw, nil
}

// RaiseFloor implements driver.TokenFloorer (see above).
func (b *Backend) RaiseFloor(ctx context.Context, key string, floor driver.Token) error {
	if key == "" {
		return &driver.UnsupportedError{Backend: "nats", Feature: "RaiseFloor of every key (\"\")",
			Instead: "the NATS backend keeps a floor per key: raise each key (HighWater lists them, and its Global bounds every token)"}
	}
	if err := driver.ValidateKey(key); err != nil {
		return err
	}
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if uint64(floor) > tokenfloor.MaxOffset {
		return &driver.InvalidOptionError{Option: "floor", Value: strconv.FormatUint(uint64(floor), 10), Reason: fmt.Sprintf("must be at most %d", uint64(tokenfloor.MaxOffset))}
	}
	// The floor record is written compared on the last sequence of the
	// key's subjects (lock and floor records, keySubj), as every write of
	// the lock record is: on a cluster the stream's leader holds back a
	// write while another one naming the same compare is in flight, but
	// not one that names another subject, so a raise compared on the
	// floor record alone could pass beside a lock write that expected the
	// floor before it (a release, whose marker the next Acquire expects),
	// and that Acquire would use the old offset. Concurrent raises and
	// lock writes conflict: each raise reads again, after a jittered,
	// growing pause, until it is stored, found below the floor already
	// there, or the call's deadline (ctx's, else 4*requestTimeout) ends.
	// A raise is an administrative call (a migration's cut-over): giving
	// up after a fixed count of conflicts let it fail while contenders
	// merely took the key in turn.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 4*requestTimeout)
		defer cancel()
	}
	for attempt := 0; ; attempt++ {
		// The stream's last sequence first: any L read before the write
		// bounds every later grant's native token from below, while a
		// lock write stored after the key's read fails the compare, so
		// the round trips between that read and the write (each a chance
		// for a holder writing the key back to back to win it) are two,
		// not three.
		si, err := b.streamInfo(ctx)
		if err != nil {
			return err
		}
		rec, fl, err := b.read(ctx, key)
		if err != nil {
			return err
		}
		cur, last := floorOf(fl), si.State.LastSeq
		if uint64(floor) <= last+cur {
			return nil
		}
		h := natsgo.Header{}
		h.Set(hdrExpSeq, strconv.FormatUint(max(seqOf(rec), seqOf(fl)), 10))
		h.Set(hdrExpSeqSubj, b.keySubj(key))
		_, err = b.publish(ctx, b.floorSubj(key), h, []byte(strconv.FormatUint(uint64(floor)-last, 10)))
		if err == nil {
			break
		}
		if !conflict(err) {
			return err
		}
		if werr := pauseAfterConflict(ctx, attempt); werr != nil {
			return fmt.Errorf("nats: the floor of %q was raised, or its lock written, concurrently at every one of %d attempts until the call ended; raise it again: %w",
				key, attempt+1, errors.Join(werr, err))
		}
	}
	b.hints.drop(key)
	return nil
}

// pauseAfterConflict waits before attempt+1 of a write that lost a
// compare to a concurrent one: up to 1ms<<attempt, capped at 64ms,
// drawn at random so that writers that collided do not collide again
// in step. It returns ctx's error if ctx ends first.
func pauseAfterConflict(ctx context.Context, attempt int) error {
	d := time.Millisecond << min(attempt, 6)
	return sleepCtx(ctx, d/2+rand.N(d/2+1))
}
