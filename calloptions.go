package fencelock

import (
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fencelock/fencelock/driver"
)

// AcquireOption configures one Acquire, TryAcquire or Do call; the
// Client's Options are the defaults for everything an option does not
// set. Build one with WithTTL, WithMetadata, WithLabel, WithWait,
// WithMinHold or WithLockDelay. Options are checked when the call starts: one out of range
// makes the call return an *InvalidOptionError (matching ErrInvalidOption)
// before anything is sent to the store. When two options set the same
// thing, the later one wins.
type AcquireOption func(*callConfig)

// callConfig is what a call's options and the Client's defaults resolve
// to. The set* flags and raw values keep what the options said until
// resolveCall checks them.
type callConfig struct {
	ttl         time.Duration // the TTL asked of the store
	interval    time.Duration // RenewInterval scaled to ttl
	margin      time.Duration // Margin scaled to ttl
	rotateEvery time.Duration // RotateEvery scaled to ttl (0: never)
	label       string
	meta        []byte
	wait        time.Duration // 0: bounded only by ctx
	minHold     time.Duration
	lockDelay   time.Duration

	setTTL, setLabel, setWait, setMinHold, setLockDelay bool
}

// WithTTL sets the lease's TTL for this call, in place of Options.TTL; it
// must be between MinTTL and MaxTTL. The lease's renewal interval, local
// validity margin and token rotation period scale in proportion
// (RenewInterval × ttl / Options.TTL, and likewise Margin and
// RotateEvery), so every lease keeps the Client's validated ratios: with
// the defaults, a 3s lease renews every second and is judged lost locally
// 2.7s after its last successful renewal began. One backend instance
// serves leases of any mix of TTLs; batch renewals group leases by TTL.
func WithTTL(ttl time.Duration) AcquireOption {
	return func(c *callConfig) { c.ttl, c.setTTL = ttl, true }
}

// WithMetadata stores b with the lease: Inspect and List report it in
// Info.Metadata, Lease.Metadata returns it, and Lease.SetMetadata replaces
// it. At most driver.MaxMetadataLen bytes; nil and empty alike. The
// option keeps its own copy of b. A backend that does not yet store
// metadata ignores it (Info.Metadata stays nil).
func WithMetadata(b []byte) AcquireOption {
	b = append([]byte(nil), b...)
	return func(c *callConfig) { c.meta = b }
}

// WithLabel sets the lease's owner label, in place of Options.Owner: the
// holder's identity as the user gave it (a host name, a pod name, an
// address). The store records the owner string label + "/" + a per-call
// unique suffix, so owners stay unique per call; Info.Label and
// Lease.Label return the label as given, without parsing. At most 200
// bytes of printable text, not empty.
func WithLabel(label string) AcquireOption {
	return func(c *callConfig) { c.label, c.setLabel = label, true }
}

// WithWait bounds how long Acquire (and Do) waits while the key is held
// by someone else; it must be positive. When the bound passes first, the
// call returns an error matching ErrNotAcquired (and leaves nothing behind
// in the store, as when ctx ends). ctx still bounds the call too. Without
// it only ctx bounds the wait. TryAcquire, which never waits, ignores it.
func WithWait(d time.Duration) AcquireOption {
	return func(c *callConfig) { c.wait, c.setWait = d, true }
}

// WithMinHold sets the lease's minimum hold (ShedLock's lockAtLeastFor),
// in place of Options.MinHold: between 0 and MaxTTL. A Release (or Do's
// release, or Client.Close's) before the minimum hold has passed, counted
// from when the store's grant arrived, does not free the key at once: the
// release renews the record with the rest of the window as its TTL (at
// least MinTTL), and while the Client is open the engine renews it that
// way every renewal interval and removes it when the window ends. The lease reports the release at once: Done is closed, Err is nil,
// Release returns nil, and context.Cause(lease.Context()) matches both
// ErrHeldForMinimum and ErrReleased (and ErrClosed, when Client.Close
// released it). So a scheduled job that finishes fast
// still keeps the other instances out until the window ends, and no
// longer than the window plus the store's TTL bound. If the store answers
// that first renewal only after the lease's local validity has ended and
// the record has expired by then, the hold was not kept: Release returns
// an error matching ErrLocalExpiry (not ErrNotHeld: the lease was
// released while valid).
//
// On record stores (PostgreSQL, Redis, MongoDB, file, memory) the store
// expires the record at the end of the window even if the process exits
// or crashes first. Session stores (etcd, ZooKeeper) tie the record to the
// client's session rather than to the TTL of that last renewal: there the
// window lasts while the Client is open; closing the Client, or a crash,
// frees the key within the store's session TTL, which may be before the
// window ends.
func WithMinHold(d time.Duration) AcquireOption {
	return func(c *callConfig) { c.minHold, c.setMinHold = d, true }
}

// WithLockDelay sets the call's lock delay (Chubby's lock-delay, Consul's
// LockDelay), in place of Options.LockDelay: between 0 and MaxTTL. The
// store does not grant the key while its last holder's lease ended
// without a release (it expired: the holder crashed, paused or lost the
// store) less than d ago, judged by the clock that judges expiry (the
// server's for PostgreSQL, Redis and MongoDB, the store's for memory and
// file, etcd's lease expiry, ZooKeeper's mtime). A released key is free
// at once. So a resource that cannot check fencing tokens gets a quiet
// gap of d in which a paused holder's late writes land before the next
// holder starts: choose d longer than the
// longest pause a holder may wake from. A minimum hold (WithMinHold)
// whose window ends by the record's expiry (the Client was closed first)
// is an unreleased end too. Acquire waits through the delay
// (waking when it ends); TryAcquire fails with a *HeldError whose
// LockDelay says how much is left. Give every client of a key the same
// lock delay: on Redis the holder's grant carries the marker of its end,
// kept for the holder's own lock delay (on etcd likewise, and the gap may
// exceed d by about a TTL; on ZooKeeper the gap counts from the first
// acquire that finds the holder gone). A backend that cannot keep a lock
// delay fails the call with an error matching ErrUnsupported.
func WithLockDelay(d time.Duration) AcquireOption {
	return func(c *callConfig) { c.lockDelay, c.setLockDelay = d, true }
}

// resolveCall applies opts over the Client's defaults and checks them.
func (c *Client) resolveCall(opts []AcquireOption) (callConfig, error) {
	o := &c.o
	defaults := callConfig{
		ttl: o.TTL, interval: o.RenewInterval, margin: o.Margin, rotateEvery: o.RotateEvery,
		label: o.Owner, minHold: o.MinHold, lockDelay: o.LockDelay,
	}
	if len(opts) == 0 {
		// New validated the Client's options. Returning before cfg, whose
		// address the options take, keeps the common call off the heap.
		return defaults, nil
	}
	cfg := defaults
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	if cfg.setTTL {
		if cfg.ttl < MinTTL || cfg.ttl > MaxTTL {
			return cfg, badOption("TTL", cfg.ttl, "must be between %v and %v", MinTTL, MaxTTL)
		}
		if cfg.ttl != o.TTL {
			// Rounded down, so the scaled values keep the bounds the
			// Client's options were validated against.
			cfg.interval = max(1, scaleDuration(o.RenewInterval, cfg.ttl, o.TTL))
			cfg.margin = scaleDuration(o.Margin, cfg.ttl, o.TTL)
			if o.RotateEvery > 0 {
				cfg.rotateEvery = max(cfg.interval, scaleDuration(o.RotateEvery, cfg.ttl, o.TTL))
			}
		}
	}
	if cfg.setLabel {
		if err := checkLabel("Label", cfg.label); err != nil {
			return cfg, err
		}
	}
	if cfg.setWait && cfg.wait <= 0 {
		return cfg, badOption("Wait", cfg.wait, "must be positive")
	}
	if cfg.setMinHold && (cfg.minHold < 0 || cfg.minHold > MaxTTL) {
		return cfg, badOption("MinHold", cfg.minHold, "must be between 0 and %v", MaxTTL)
	}
	if cfg.setLockDelay && (cfg.lockDelay < 0 || cfg.lockDelay > MaxTTL) {
		return cfg, badOption("LockDelay", cfg.lockDelay, "must be between 0 and %v", MaxTTL)
	}
	if err := driver.ValidateMetadata(cfg.meta); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// checkLabel checks an owner label (Options.Owner, WithLabel): 1 to 200
// bytes of printable text.
func checkLabel(name, label string) error {
	if label == "" {
		return badOption(name, strconv.Quote(label), "must not be empty")
	}
	if len(label) > 200 {
		return badOption(name, strconv.Quote(label[:20]+"…"), "must be at most 200 bytes")
	}
	if !utf8.ValidString(label) {
		return badOption(name, strconv.Quote(label), "must be valid UTF-8")
	}
	for _, r := range label {
		if !unicode.IsPrint(r) {
			return badOption(name, strconv.Quote(label), "must be printable text")
		}
	}
	return nil
}

// request builds the AcquireRequest of one attempt.
func (cfg *callConfig) request(key, owner string) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Owner: owner, TTL: cfg.ttl, Metadata: cfg.meta, LockDelay: cfg.lockDelay}
}
