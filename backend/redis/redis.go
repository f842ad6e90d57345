package redis

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/driver"
)

var (
	//go:embed lua/acquire.lua
	acquireSrc string
	//go:embed lua/renew.lua
	renewSrc string
	//go:embed lua/release.lua
	releaseSrc string
	//go:embed lua/inspect.lua
	inspectSrc string
	//go:embed lua/force.lua
	forceSrc string
	//go:embed lua/floor.lua
	floorSrc string

	acquireScript = newScript(acquireSrc)
	renewScript   = newScript(renewSrc)
	releaseScript = newScript(releaseSrc)
	inspectScript = newScript(inspectSrc)
	forceScript   = newScript(forceSrc)
	floorScript   = newScript(floorSrc)
)

// script is a Lua script run with EVALSHA, falling back to EVAL (which
// loads it) when the server answers NOSCRIPT.
type script struct {
	*goredis.Script
	src string
}

func newScript(src string) script { return script{goredis.NewScript(src), src} }

// Options configures a Backend. The zero value (or nil) means defaults.
type Options struct {
	// Prefix namespaces every Redis key and channel the backend uses, so
	// several applications (or test runs) can share one server. 1 to 128
	// bytes of letters, digits and "_-.:/". Default "fencelock"
	// (DefaultPrefix). Backends must agree on it to see each other's locks.
	Prefix string

	// Logger receives the warnings found by the start-up check of the
	// server's settings (see Describe). Default: none (a discarding
	// logger), like the engine's; the warnings are in Describe either way.
	Logger *slog.Logger

	// SkipChecks turns off the start-up check of the server's settings
	// (CONFIG GET maxmemory-policy, appendonly, appendfsync, save; INFO
	// replication). Describe then carries a warning that nothing was
	// checked. Default false: check.
	SkipChecks bool

	// WaitReplicas, if positive, makes a grant count only once that
	// many replicas have acknowledged it: every acquisition and renewal
	// is followed by WAIT WaitReplicas WaitTimeout on the same
	// connection. A grant acknowledged by fewer in time is refused and
	// its record removed (owner- and token-guarded), a renewal is not
	// counted; both fail with a *ReplicaAckError. Releases do not wait
	// (a release a promoted replica lacks only keeps the lock until its
	// TTL). With every replica of the primary counted, a replica the
	// Sentinel promotes has every grant and renewal a holder was told
	// of (see Guarantees). Default 0: no waiting (replication is
	// asynchronous). Not supported on a Ring.
	WaitReplicas int

	// WaitTimeout bounds each WAIT (cut to what is left of the call's
	// context). Default DefaultWaitTimeout. Keep it below the client's
	// read timeout.
	WaitTimeout time.Duration
}

// Validate reports the first option out of range as a
// *driver.InvalidOptionError.
func (o *Options) Validate() error {
	if o == nil {
		return nil
	}
	if o.WaitReplicas < 0 {
		return &driver.InvalidOptionError{Option: "WaitReplicas", Value: strconv.Itoa(o.WaitReplicas), Reason: "must be 0 (do not wait) or the number of replicas that must acknowledge each grant"}
	}
	if o.WaitTimeout < 0 {
		return &driver.InvalidOptionError{Option: "WaitTimeout", Value: o.WaitTimeout.String(), Reason: "must not be negative"}
	}
	if o.Prefix != "" {
		return validatePrefix(o.Prefix)
	}
	return nil
}

// Backend is a fencelock backend on one Redis deployment (a single server,
// a Sentinel-managed primary, or a Cluster). It implements driver.Backend,
// driver.Watcher, driver.BatchRenewer, driver.ForceReleaser and
// driver.Describer. It is safe for concurrent use.
type Backend struct {
	c      goredis.UniversalClient
	owned  bool // Close closes c
	ks     keyspace
	log    *slog.Logger
	desc   driver.Description
	closed atomic.Bool

	waitReplicas int           // Options.WaitReplicas
	waitFor      time.Duration // Options.WaitTimeout or its default

	w watchHub
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.Watcher       = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// New returns a Backend on client, which the caller keeps owning: Close
// does not close it. Any go-redis client fits: *redis.Client (single
// server or Sentinel failover), *redis.ClusterClient and *redis.Ring (a
// lock's names share a hash tag, so they land on one shard). New pings the
// server and, unless opts.SkipChecks, reads its settings and logs what
// weakens exclusion or fencing (see Describe). A nil opts means defaults.
func New(ctx context.Context, client goredis.UniversalClient, opts *Options) (*Backend, error) {
	return newBackend(ctx, client, false, opts)
}

func newBackend(ctx context.Context, client goredis.UniversalClient, owned bool, opts *Options) (*Backend, error) {
	if client == nil {
		return nil, errors.New("redis: New: nil client")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := validateWait(o, client); err != nil {
		return nil, err
	}
	if err := client.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis: ping: %w", err)
	}
	b := &Backend{
		c:            client,
		owned:        owned,
		ks:           keyspace{prefix: o.Prefix},
		log:          o.Logger,
		waitReplicas: o.WaitReplicas,
		waitFor:      cmp.Or(o.WaitTimeout, DefaultWaitTimeout),
	}
	b.w.b = b
	b.describe(ctx, o)
	return b, nil
}

// Client returns the go-redis client the backend uses.
func (b *Backend) Client() goredis.UniversalClient { return b.c }

// Prefix returns the namespace of the backend's keys.
func (b *Backend) Prefix() string { return b.ks.prefix }

func (b *Backend) check(ctx context.Context) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return ctx.Err()
}

// ttlMillis converts a TTL to whole milliseconds, rounding up; granted is
// the TTL actually set when it differs from ttl.
func ttlMillis(ttl time.Duration) (ms int64, granted time.Duration) {
	ms = int64((ttl + time.Millisecond - 1) / time.Millisecond)
	if g := time.Duration(ms) * time.Millisecond; g != ttl {
		granted = g
	}
	return ms, granted
}

func quote(s string) string { return strconv.Quote(s) }

// Acquire implements driver.Backend: one EVALSHA of acquire.lua.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckAcquire(req); err != nil {
		return driver.Grant{}, err
	}
	ms, granted := ttlMillis(req.TTL)
	lock, counter, _ := b.ks.names(req.Key)
	// Whole milliseconds, rounded up: never a shorter gap than asked.
	delay := int64((req.LockDelay + time.Millisecond - 1) / time.Millisecond)
	keys, args := []string{lock, counter, b.ks.marker(req.Key)}, []any{req.Owner, ms, metaArg(req.Metadata), delay}
	var v any
	var err error
	acked := 0
	if b.waitReplicas > 0 {
		v, acked, err = b.runAcked(ctx, acquireScript, keys, args...)
	} else {
		v, err = acquireScript.Run(ctx, b.c, keys, args...).Result()
	}
	if _, ok := v.(string); ok && err != nil {
		// Granted, but the WAIT failed: nobody knows whether the
		// replicas have it.
		g := driver.Grant{Key: req.Key, Owner: req.Owner}
		if tok, perr := parseToken(req.Key, v.(string)); perr == nil {
			g.Token = tok
			return driver.Grant{}, errors.Join(err, b.refuseGrant(ctx, g, 0, b.waitTimeout(ctx)))
		}
	}
	g, err := acquireResult(req, granted, v, err)
	if err == nil && b.waitReplicas > 0 && acked < b.waitReplicas {
		return driver.Grant{}, b.refuseGrant(ctx, g, acked, b.waitFor)
	}
	return g, err
}

// acquireResult reads acquire.lua's reply to req (v, err): a grant, or
// the refusal naming the holder or the rest of a lock delay.
func acquireResult(req driver.AcquireRequest, granted time.Duration, v any, err error) (driver.Grant, error) {
	if err != nil {
		return driver.Grant{}, scriptError(req.Key, err)
	}
	switch v := v.(type) {
	case string:
		tok, err := parseToken(req.Key, v)
		if err != nil {
			return driver.Grant{}, err
		}
		return driver.Grant{Key: req.Key, Owner: req.Owner, Token: tok, TTL: granted}, nil
	case []any:
		if len(v) == 2 && v[0] == "DELAY" {
			left, ok := v[1].(int64)
			if !ok || left <= 0 {
				return driver.Grant{}, fmt.Errorf("redis: acquire script returned a lock delay of %v (%T)", v[1], v[1])
			}
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}, LockDelay: time.Duration(left) * time.Millisecond}
		}
		info, err := parseHolder(req.Key, v)
		if err != nil {
			return driver.Grant{}, err
		}
		return driver.Grant{}, &driver.HeldError{Holder: info}
	default:
		return driver.Grant{}, fmt.Errorf("redis: acquire script returned %T", v)
	}
}

// metaArg is a metadata payload as a script argument: its bytes, or an
// empty string for none (Redis passes both as a bulk string, binary-safe).
func metaArg(md []byte) any {
	if len(md) == 0 {
		return ""
	}
	return md
}

// parseHolder reads {owner, token, pttl[, meta]} as returned by the
// scripts (meta: inspect.lua's, a nil reply when the record has none).
func parseHolder(key string, v []any) (driver.Info, error) {
	if len(v) == 0 {
		return driver.Info{Key: key}, nil
	}
	if len(v) != 3 && len(v) != 4 {
		return driver.Info{}, fmt.Errorf("redis: script returned %d values, want 3 or 4", len(v))
	}
	owner, ok1 := v[0].(string)
	tokS, ok2 := v[1].(string)
	pttl, ok3 := v[2].(int64)
	if !ok1 || !ok2 || !ok3 {
		return driver.Info{}, fmt.Errorf("redis: script returned %T, %T, %T", v[0], v[1], v[2])
	}
	tok, err := parseToken(key, tokS)
	if err != nil {
		return driver.Info{}, err
	}
	info := driver.Info{Key: key, Owner: owner, Token: tok}
	if pttl > 0 {
		info.Remaining = time.Duration(pttl) * time.Millisecond
	}
	if len(v) == 4 && v[3] != nil {
		md, ok := v[3].(string)
		if !ok {
			return driver.Info{}, fmt.Errorf("redis: script returned metadata as %T", v[3])
		}
		if md != "" {
			info.Metadata = []byte(md)
		}
	}
	return info, nil
}

// checkGrant checks a grant given to Renew, RenewBatch or Release: its key
// (an *InvalidKeyError if invalid); an owner that Acquire would refuse (a
// control character, which could reach into the record's metadata past
// the newline that ends the owner) or a zero token is no current grant,
// so ErrNotHeld, with nothing sent.
func checkGrant(g driver.Grant) error {
	if err := driver.ValidateKey(g.Key); err != nil {
		return err
	}
	if g.Token == 0 || driver.ValidateOwner(g.Owner) != nil {
		return driver.ErrNotHeld
	}
	return nil
}

// recordHead is the start of the lock record a grant wrote:
// "<token>\n<owner>\n" (the record is that and the metadata).
func recordHead(g driver.Grant) string {
	buf := make([]byte, 0, 22+len(g.Owner))
	buf = strconv.AppendUint(buf, uint64(g.Token), 10)
	buf = append(buf, '\n')
	buf = append(buf, g.Owner...)
	buf = append(buf, '\n')
	return string(buf)
}

// renewArgs are renew.lua's arguments; setMeta and md are
// RenewRequest.SetMetadata and Metadata.
func renewArgs(g driver.Grant, ms int64, rotate, setMeta bool, md []byte) []any {
	return []any{g.Owner, strconv.FormatUint(uint64(g.Token), 10), ms, flag(rotate), flag(setMeta), metaArg(md)}
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func renewResult(g driver.Grant, granted time.Duration, v any, err error) (driver.Grant, error) {
	if err != nil {
		return driver.Grant{}, scriptError(g.Key, err)
	}
	switch v := v.(type) {
	case int64:
		if v == 0 {
			return driver.Grant{}, driver.ErrNotHeld
		}
		return driver.Grant{}, fmt.Errorf("redis: renew script returned %d", v)
	case string:
		tok, err := parseToken(g.Key, v)
		if err != nil {
			return driver.Grant{}, err
		}
		g.Token = tok
		g.TTL = granted
		return g, nil
	default:
		return driver.Grant{}, fmt.Errorf("redis: renew script returned %T", v)
	}
}

// parseToken reads a token the scripts return as a decimal string (never
// as an integer reply: that would have passed through a Lua number, exact
// only up to 2^53).
func parseToken(key, s string) (driver.Token, error) {
	tok, err := strconv.ParseUint(s, 10, 64)
	if err != nil || tok == 0 {
		return 0, fmt.Errorf("redis: lock of %q has a malformed token %q", key, s)
	}
	return driver.Token(tok), nil
}

// ErrTokenOverflow reports that a key's token counter is at 2^63-1, the
// largest integer Redis holds, so no higher token can be issued: Acquire
// and rotating renewals of the key are refused and change nothing (a
// rotation refused leaves the grant's token and TTL as they were). Errors
// matching it also match driver.ErrUnsupported, so the engine takes them
// as an answer and does not retry. Counters that start at 1 never get
// there; only a floor raised near 2^63-1 (a migration) could.
var ErrTokenOverflow = errors.New("fencelock/redis: token counter at 2^63-1")

// overflowError is the error for key's counter at 2^63-1.
type overflowError struct{ key string }

func (e *overflowError) Error() string {
	return fmt.Sprintf("fencelock/redis: the token counter of %q is at 2^63-1, the largest integer Redis holds: no higher token can be issued", e.key)
}

// Is matches ErrTokenOverflow and driver.ErrUnsupported.
func (e *overflowError) Is(target error) bool {
	return target == ErrTokenOverflow || target == driver.ErrUnsupported
}

// ErrForeignRecord reports a lock record this backend did not write: a
// hash {owner, token[, meta]}, the layout of earlier development versions
// (records are strings "<token>\n<owner>\n<meta>" since; no version with
// the hash was released), or a string that does not start with a token
// (1 to 19 digits, no leading zero) and two newlines: another program's
// value under the backend's prefix. The scripts refuse to read
// it and change nothing, so a fleet that mixes the two versions never
// grants a key both think they hold: each refuses the other's records
// until they expire or are released.
var ErrForeignRecord = errors.New("fencelock/redis: lock record not written by this version of the backend")

// foreignError is the error for key's record that this backend did not
// write; hash tells which kind.
type foreignError struct {
	key  string
	hash bool
}

func (e *foreignError) Error() string {
	if e.hash {
		return fmt.Sprintf("fencelock/redis: the lock record of %q is a hash, the layout of an earlier development version; this version reads only string records (nothing was changed: wait for it to expire or be released)", e.key)
	}
	return fmt.Sprintf("fencelock/redis: the lock record of %q is not \"<token>\\n<owner>\\n<meta>\": another program wrote it (nothing was changed)", e.key)
}

// Is matches ErrForeignRecord.
func (e *foreignError) Is(target error) bool { return target == ErrForeignRecord }

// scriptError turns the scripts' FENCELOCK_TOKEN_OVERFLOW reply into an
// error matching ErrTokenOverflow, and Redis's WRONGTYPE (a record in the
// old hash layout) and the scripts' FENCELOCK_BAD_RECORD (a string that
// does not start with a token and two newlines) into one matching
// ErrForeignRecord; other errors pass through.
func scriptError(key string, err error) error {
	switch {
	case goredis.HasErrorPrefix(err, "FENCELOCK_TOKEN_OVERFLOW"):
		return &overflowError{key: key}
	case goredis.HasErrorPrefix(err, "WRONGTYPE"):
		return &foreignError{key: key, hash: true}
	case goredis.HasErrorPrefix(err, "FENCELOCK_BAD_RECORD"):
		return &foreignError{key: key}
	}
	return err
}

// Renew implements driver.Backend: one EVALSHA of renew.lua, which checks
// owner and token, never creates a record, with Rotate takes a new token
// from the key's counter, and with SetMetadata replaces the record's meta
// field (in the same script, after the check).
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return driver.Grant{}, err
	}
	if err := checkGrant(g); err != nil {
		return driver.Grant{}, err
	}
	ms, granted := ttlMillis(req.TTL)
	lock, counter, _ := b.ks.names(g.Key)
	keys, args := []string{lock, counter, b.ks.marker(g.Key)}, renewArgs(g, ms, req.Rotate, req.SetMetadata, req.Metadata)
	if b.waitReplicas > 0 {
		v, acked, err := b.runAcked(ctx, renewScript, keys, args...)
		ng, err := renewResult(g, granted, v, err)
		if err == nil && acked < b.waitReplicas {
			return driver.Grant{}, &ReplicaAckError{Op: "renew", Key: g.Key, Want: b.waitReplicas, Acked: acked, Timeout: b.waitFor}
		}
		return ng, err
	}
	v, err := renewScript.Run(ctx, b.c, keys, args...).Result()
	return renewResult(g, granted, v, err)
}

// RenewBatch implements driver.BatchRenewer: one pipeline of renew.lua
// calls, one round trip for any number of grants (a Cluster client splits
// it into one pipeline per node). It keeps every record's metadata
// (req.SetMetadata is ignored).
func (b *Backend) RenewBatch(ctx context.Context, grants []driver.Grant, req driver.RenewRequest) ([]driver.RenewResult, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.CheckRenew(req); err != nil {
		return nil, err
	}
	if _, cluster := b.c.(*goredis.ClusterClient); cluster && b.waitReplicas > 0 {
		// WAIT must follow the writes on each primary's connection:
		// one renewal (and its WAIT) at a time.
		out := make([]driver.RenewResult, len(grants))
		for i, g := range grants {
			out[i].Grant, out[i].Err = b.Renew(ctx, g, driver.RenewRequest{TTL: req.TTL, Rotate: req.Rotate})
		}
		return out, nil
	}
	ms, granted := ttlMillis(req.TTL)
	out := make([]driver.RenewResult, len(grants))
	calls := make([]scriptCall, 0, len(grants))
	idx := make([]int, 0, len(grants))
	for i, g := range grants {
		if err := checkGrant(g); err != nil {
			out[i].Err = err
			continue
		}
		lock, counter, _ := b.ks.names(g.Key)
		calls = append(calls, scriptCall{keys: []string{lock, counter, b.ks.marker(g.Key)}, args: renewArgs(g, ms, req.Rotate, false, nil)})
		idx = append(idx, i)
	}
	var cmds []*goredis.Cmd
	var err error
	acked := 0
	if b.waitReplicas > 0 {
		cmds, acked, err = b.runPipelinedAcked(ctx, renewScript, calls)
	} else {
		cmds, err = runPipelined(ctx, b.c, renewScript, calls)
	}
	if err != nil {
		return nil, err
	}
	for j, cmd := range cmds {
		i := idx[j]
		out[i].Grant, out[i].Err = renewResult(grants[i], granted, cmd.Val(), cmd.Err())
		if out[i].Err == nil && b.waitReplicas > 0 && acked < b.waitReplicas {
			out[i] = driver.RenewResult{Err: &ReplicaAckError{Op: "renew", Key: grants[i].Key, Want: b.waitReplicas, Acked: acked, Timeout: b.waitFor}}
		}
	}
	return out, nil
}

// Release implements driver.Backend: one EVALSHA of release.lua, which
// deletes the lock only if owner and token match and publishes on the
// key's release channel to wake waiters. The counter stays.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if err := checkGrant(g); err != nil {
		return err
	}
	lock, _, channel := b.ks.names(g.Key)
	n, err := releaseScript.Run(ctx, b.c, []string{lock, b.ks.marker(g.Key)}, recordHead(g), channel).Int64()
	if err != nil {
		return scriptError(g.Key, err)
	}
	if n != 1 {
		return driver.ErrNotHeld
	}
	return nil
}

// ForceRelease implements driver.ForceReleaser: it deletes key's lock
// whoever holds it and wakes waiters. The counter stays, so the next
// grant's token is still higher. The holder finds out at its next renewal.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	lock, _, channel := b.ks.names(key)
	v, err := forceScript.Run(ctx, b.c, []string{lock, b.ks.marker(key)}, channel).Slice()
	if err != nil {
		return driver.Info{}, scriptError(key, err)
	}
	return parseHolder(key, v)
}

// Inspect implements driver.Backend.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	v, err := inspectScript.Run(ctx, b.c, []string{b.ks.lockName(key)}).Slice()
	if err != nil {
		return driver.Info{}, scriptError(key, err)
	}
	return parseHolder(key, v)
}

// scanCount is the COUNT hint of List's SCAN calls.
const scanCount = 1000

// List implements driver.Backend with SCAN MATCH over the lock records (on
// a Cluster, over every primary), then one pipeline of inspect.lua calls
// per SCAN page. Keys come back sorted. SCAN is not a snapshot: a lock
// taken or released during the scan may or may not be listed.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	pattern := b.ks.pattern(prefix)
	var (
		mu  sync.Mutex
		out []driver.Info
	)
	scan := func(ctx context.Context, c goredis.Cmdable) error {
		var cursor uint64
		for {
			names, next, err := c.Scan(ctx, cursor, pattern, scanCount).Result()
			if err != nil {
				return err
			}
			var calls []scriptCall
			var keys []string
			for _, name := range names {
				if k, ok := b.ks.keyOf(name); ok {
					calls = append(calls, scriptCall{keys: []string{name}})
					keys = append(keys, k)
				}
			}
			if len(calls) > 0 {
				cmds, err := runPipelined(ctx, c, inspectScript, calls)
				if err != nil {
					return err
				}
				for i, cmd := range cmds {
					v, err := cmd.Slice()
					if err != nil {
						return scriptError(keys[i], err)
					}
					info, err := parseHolder(keys[i], v)
					if err != nil {
						return err
					}
					if info.Locked() {
						mu.Lock()
						out = append(out, info)
						mu.Unlock()
					}
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	err := forEachPrimary(ctx, b.c, func(ctx context.Context, c goredis.Cmdable) error { return scan(ctx, c) })
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	// A Cluster failover mid-scan can show a key twice.
	dedup := out[:0]
	for i, in := range out {
		if i == 0 || in.Key != out[i-1].Key {
			dedup = append(dedup, in)
		}
	}
	return dedup, nil
}

// Close implements driver.Backend: it ends the backend's pub/sub
// connection and its goroutine, and closes the go-redis client only if the
// backend opened it (Open); a client passed to New stays open. Locks are
// not released (the engine does that first).
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.w.close()
	if b.owned {
		return b.c.Close()
	}
	return nil
}

// forEachPrimary calls fn for every primary of a Cluster or shard of a
// Ring (concurrently), or once for any other client.
func forEachPrimary(ctx context.Context, c goredis.UniversalClient, fn func(context.Context, goredis.Cmdable) error) error {
	switch c := c.(type) {
	case *goredis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error { return fn(ctx, node) })
	case *goredis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, node *goredis.Client) error { return fn(ctx, node) })
	default:
		return fn(ctx, c)
	}
}

// scriptCall is one script invocation of a pipeline.
type scriptCall struct {
	keys []string
	args []any
}

// runPipelined runs the calls of one script in one pipeline of EVALSHAs;
// calls answered NOSCRIPT (the script cache was flushed, or a Cluster node
// has not seen the script yet) are sent again with EVAL, which also loads
// the script. The error is for the pipeline as a whole; each Cmd carries
// its own result or error.
func runPipelined(ctx context.Context, c goredis.Cmdable, s script, calls []scriptCall) ([]*goredis.Cmd, error) {
	if len(calls) == 0 {
		return nil, nil
	}
	cmds := make([]*goredis.Cmd, len(calls))
	pipe := c.Pipeline()
	for i, call := range calls {
		cmds[i] = pipe.EvalSha(ctx, s.Hash(), call.keys, call.args...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !isRedisError(err) {
		return nil, err
	}
	var retry []int
	for i, cmd := range cmds {
		if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return cmds, nil
	}
	pipe = c.Pipeline()
	for _, i := range retry {
		cmds[i] = pipe.Eval(ctx, s.src, calls[i].keys, calls[i].args...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !isRedisError(err) {
		return nil, err
	}
	return cmds, nil
}

// isRedisError reports whether err is an error reply of the server (which
// belongs to one command of a pipeline) rather than a failure of the
// connection.
func isRedisError(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}
