package nats

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
)

// Backend is a lock store on a NATS JetStream key-value bucket. It
// implements driver.Backend and the optional capabilities driver.Watcher
// (waiters woken by a watch on the bucket), driver.LossNotifier (loss
// pushed when the server removes an expired record), driver.BatchRenewer
// (renewals pipelined on one connection), driver.ForceReleaser,
// driver.TokenFloorer, driver.Describer and driver.Guarantor.
type Backend struct {
	js     jetstream.JetStream
	nc     *natsgo.Conn
	own    bool // Close closes nc
	bucket string
	stream string // KV_<bucket>
	subj   string // "$KV.<bucket>."
	api    string // the JetStream API prefix, ending in '.'

	cfg streamConfig // the bucket's stream as New found or made it

	closed atomic.Bool
	// crashed is set by the tests' crash hook: no clean-up runs.
	crashed atomic.Bool

	hints hints    // the keys' last known state (acquire.go)
	clock clock    // the server's clock, estimated (clock.go)
	w     dispatch // the bucket's watch (watch.go)
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.Watcher       = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.LossNotifier  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.TokenFloorer  = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
	_ driver.Guarantor     = (*Backend)(nil)
)

// minServer is the oldest NATS Server with per-message TTLs and subject
// delete markers, which the backend needs.
const minServer = "2.11.0"

// markerTTL is how long a release's marker, and the marker the server
// leaves where it removed an expired record, stay in the bucket.
const markerTTL = time.Minute

// requestTimeout bounds a request whose context has no deadline.
const requestTimeout = 5 * time.Second

// codec escapes a key into one subject token of the bytes NATS key-value
// keys allow (A-Z a-z 0-9 - _ / =), '%' as the escape.
var codec = backendkit.NewCodecFunc(func(c byte) bool {
	return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '/' || c == '=')
})

// New returns a Backend on a caller-owned JetStream context (wrap a
// *nats.Conn with jetstream.New). Close does not close its connection.
// A nil opts means defaults; invalid options return a
// *driver.InvalidOptionError. New checks the server's version (2.11 or
// later: per-key TTLs) and creates the bucket if it does not exist; an
// existing bucket must allow per-message TTLs and keep one value per key.
func New(ctx context.Context, js jetstream.JetStream, opts *Options) (*Backend, error) {
	if js == nil {
		return nil, errors.New("nats: New: nil jetstream.JetStream")
	}
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	nc := js.Conn()
	if v := nc.ConnectedServerVersion(); v != "" && !atLeast(v, minServer) {
		return nil, &driver.UnsupportedError{Backend: "nats", Feature: "NATS Server " + v,
			Instead: "the backend needs per-key TTLs and subject delete markers, in NATS Server " + minServer + " or later: upgrade the server"}
	}
	jo := js.Options()
	api := jo.APIPrefix
	if api == "" {
		api = jetstream.DefaultAPIPrefix
	}
	if jo.Domain != "" {
		api = "$JS." + jo.Domain + ".API."
	}
	if !strings.HasSuffix(api, ".") {
		api += "."
	}
	b := &Backend{
		js:     js,
		nc:     nc,
		bucket: o.Bucket,
		stream: "KV_" + o.Bucket,
		subj:   "$KV." + o.Bucket + ".",
		api:    api,
	}
	b.w.b, b.w.done = b, make(chan struct{})
	if err := b.ensureBucket(ctx, o); err != nil {
		return nil, err
	}
	return b, nil
}

// Bucket returns the key-value bucket that holds the locks.
func (b *Backend) Bucket() string { return b.bucket }

// JetStream returns the JetStream context the backend uses.
func (b *Backend) JetStream() jetstream.JetStream { return b.js }

// Close implements driver.Backend: it stops the backend's watch and, if
// Open made the connection, closes it. Locks are not released.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.w.stop()
	if b.own {
		b.nc.Close()
	}
	return nil
}

// atLeast reports whether version v (major.minor.patch[-suffix]) is at
// least min.
func atLeast(v, min string) bool {
	parse := func(s string) [3]int {
		var out [3]int
		s, _, _ = strings.Cut(strings.TrimPrefix(s, "v"), "-")
		for i, p := range strings.SplitN(s, ".", 3) {
			out[i], _ = strconv.Atoi(p)
		}
		return out
	}
	a, m := parse(v), parse(min)
	for i := range a {
		if a[i] != m[i] {
			return a[i] > m[i]
		}
	}
	return true
}

// ---------------------------------------------------------------- subjects

func (b *Backend) lockSubj(key string) string  { return b.subj + "l." + codec.Escape(key) }
func (b *Backend) floorSubj(key string) string { return b.subj + "f." + codec.Escape(key) }
func (b *Backend) delaySubj(key string) string { return b.subj + "d." + codec.Escape(key) + ".m" }

// keySubj is the filter that matches a key's lock record and its floor
// record, and nothing else: every write of a lock record compares the
// last sequence of both (acquire.go, floor.go).
func (b *Backend) keySubj(key string) string { return b.subj + "*." + codec.Escape(key) }

// keyOf returns the key of a lock record's subject.
func (b *Backend) keyOf(subject string) (string, bool) {
	e, ok := strings.CutPrefix(subject, b.subj+"l.")
	if !ok {
		return "", false
	}
	return codec.Unescape(e)
}

// ---------------------------------------------------------------- records

// Headers of a lock record. The value is the lease's metadata.
const (
	hdrOwner  = "Fencelock-Owner"
	hdrNative = "Fencelock-Native" // the native token kept by a re-put; absent: the record's own sequence
	hdrOffset = "Fencelock-Offset" // the token offset of the record; absent: 0
	hdrTTL    = "Nats-TTL"

	hdrExpSeq     = "Nats-Expected-Last-Subject-Sequence"
	hdrExpSeqSubj = "Nats-Expected-Last-Subject-Sequence-Subject"
	hdrKVOp       = "KV-Operation"
	hdrRollup     = "Nats-Rollup"
	hdrMarker     = "Nats-Marker-Reason"
)

// record is the last message of a subject, as read.
type record struct {
	seq    uint64
	ts     time.Time // the server's clock when it stored the message
	ttl    time.Duration
	owner  string // "" for a marker (released, expired, never held)
	native uint64
	off    uint64
	md     []byte
}

func (r *record) held() bool { return r != nil && r.owner != "" }

// token returns the record's fencing token.
func (r *record) token() driver.Token { return driver.Token(r.native + r.off) }

func parseRecord(seq uint64, ts time.Time, h natsgo.Header, data []byte) *record {
	r := &record{seq: seq, ts: ts, native: seq}
	if h != nil {
		if h.Get(hdrKVOp) == "" && h.Get(hdrMarker) == "" {
			r.owner = h.Get(hdrOwner)
		}
		if n, err := strconv.ParseUint(h.Get(hdrNative), 10, 64); err == nil && n > 0 {
			r.native = n
		}
		r.off, _ = strconv.ParseUint(h.Get(hdrOffset), 10, 64)
		r.ttl = parseTTL(h.Get(hdrTTL))
	}
	if len(data) > 0 {
		r.md = data
	}
	return r
}

// parseTTL reads a Nats-TTL header: a duration or whole seconds.
func parseTTL(s string) time.Duration {
	if s == "" {
		return 0
	}
	if d, err := time.ParseDuration(s); err == nil {
		return d
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 0
}

// ttlSeconds rounds d up to whole seconds (at least one): the server
// counts per-message TTLs in whole seconds, and truncates.
func ttlSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// ---------------------------------------------------------------- handles

// handle is what a grant's Handle carries: the sequence of the record as
// last written, its native token and offset, the floor's offset known to
// be in force at seq, the lock delay asked for, and the metadata (which a
// renewal re-puts).
type handle struct {
	owner                  uint64 // a hash of the owner: a grant whose owner was changed is not trusted
	seq, native, off, foff uint64
	delay                  time.Duration
	md                     []byte
}

func (h handle) String() string {
	return fmt.Sprintf("%x:%d:%d:%d:%d:%d:%s", h.owner, h.seq, h.native, h.off, h.foff, h.delay.Milliseconds(), base64.RawStdEncoding.EncodeToString(h.md))
}

// ownerHash is the owner's FNV-1a hash, which a handle carries.
func ownerHash(owner string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(owner))
	return h.Sum64()
}

// grantHandle returns g's handle if g is what it was issued for (its
// owner and token).
func grantHandle(g driver.Grant) (handle, bool) {
	h, ok := parseHandle(g.Handle)
	return h, ok && h.owner == ownerHash(g.Owner) && driver.Token(h.native+h.off) == g.Token
}

func parseHandle(s string) (handle, bool) {
	f := strings.Split(s, ":")
	if len(f) != 7 {
		return handle{}, false
	}
	var h handle
	var err error
	if h.owner, err = strconv.ParseUint(f[0], 16, 64); err != nil {
		return handle{}, false
	}
	f = f[1:]
	nums := []*uint64{&h.seq, &h.native, &h.off, &h.foff}
	for i, p := range nums {
		if *p, err = strconv.ParseUint(f[i], 10, 64); err != nil {
			return handle{}, false
		}
	}
	ms, err := strconv.ParseInt(f[4], 10, 64)
	if err != nil || ms < 0 {
		return handle{}, false
	}
	h.delay = time.Duration(ms) * time.Millisecond
	if h.md, err = base64.RawStdEncoding.DecodeString(f[5]); err != nil {
		return handle{}, false
	}
	if len(h.md) == 0 {
		h.md = nil
	}
	return h, h.seq > 0 && h.native > 0
}

// ---------------------------------------------------------------- requests

// apiError is an error JetStream answered.
type apiError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

func (e *apiError) Error() string {
	return fmt.Sprintf("nats: JetStream: %s (code %d, error code %d)", e.Description, e.Code, e.ErrCode)
}

// JetStream error codes the backend acts on.
const (
	errCodeWrongLastSeq      = 10071
	errCodeWrongLastSeqConst = 10164
	errCodeNoMessage         = 10037
	errCodeStreamNotFound    = 10059
	// A bucket's replicas the server cannot place: more than one on a
	// server outside a cluster, more than the cluster's servers.
	errCodeReplicasNotSupported = 10074
	errCodeNoPeers              = 10005
)

// conflict reports whether err is a failed compare of a last sequence.
func conflict(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && (ae.ErrCode == errCodeWrongLastSeq || ae.ErrCode == errCodeWrongLastSeqConst)
}

func isCode(err error, code int) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.ErrCode == code
}

// request sends m and waits for the reply, within ctx or requestTimeout.
func (b *Backend) request(ctx context.Context, m *natsgo.Msg) (*natsgo.Msg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, requestTimeout)
		defer cancel()
	}
	resp, err := b.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		if errors.Is(err, natsgo.ErrReconnectBufExceeded) || errors.Is(err, natsgo.ErrConnectionClosed) {
			return nil, fmt.Errorf("nats: not connected to the server (the connection was lost or closed; the client reconnects): %s: %w", m.Subject, err)
		}
		if errors.Is(err, natsgo.ErrNoResponders) {
			return nil, fmt.Errorf("nats: no JetStream server answered on %s (the bucket's stream has no leader now, or JetStream is not enabled): %w", m.Subject, err)
		}
		return nil, fmt.Errorf("nats: %s: %w", m.Subject, err)
	}
	return resp, nil
}

// api sends a JetStream API request and decodes its JSON reply into out,
// whose "error" member, if any, becomes an *apiError.
func (b *Backend) apiCall(ctx context.Context, subject string, req any, out any) error {
	var data []byte
	if req != nil {
		var err error
		if data, err = json.Marshal(req); err != nil {
			return err
		}
	}
	resp, err := b.request(ctx, &natsgo.Msg{Subject: b.api + subject, Data: data})
	if err != nil {
		return err
	}
	var e struct {
		Error *apiError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &e); err != nil {
		return fmt.Errorf("nats: JetStream answered %s with something that does not parse: %w", subject, err)
	}
	if e.Error != nil {
		return e.Error
	}
	if out != nil {
		return json.Unmarshal(resp.Data, out)
	}
	return nil
}

// publish stores a message in the bucket's stream and returns its
// sequence.
func (b *Backend) publish(ctx context.Context, subject string, h natsgo.Header, data []byte) (uint64, error) {
	resp, err := b.request(ctx, &natsgo.Msg{Subject: subject, Header: h, Data: data})
	if err != nil {
		return 0, err
	}
	var ack struct {
		Stream string    `json:"stream"`
		Seq    uint64    `json:"seq"`
		Error  *apiError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return 0, fmt.Errorf("nats: the acknowledgement of a write to %s does not parse: %w", subject, err)
	}
	if ack.Error != nil {
		return 0, ack.Error
	}
	if ack.Stream != b.stream || ack.Seq == 0 {
		return 0, fmt.Errorf("nats: a write to %s was stored by stream %q, not %q: another stream captures the bucket's subjects", subject, ack.Stream, b.stream)
	}
	return ack.Seq, nil
}

// last reads the last message of subject from the stream's leader (not
// a direct get, which a replica may answer from behind); nil if none.
func (b *Backend) last(ctx context.Context, subject string) (*record, error) {
	var resp struct {
		Message struct {
			Seq  uint64    `json:"seq"`
			Hdrs []byte    `json:"hdrs"`
			Data []byte    `json:"data"`
			Time time.Time `json:"time"`
		} `json:"message"`
	}
	err := b.apiCall(ctx, "STREAM.MSG.GET."+b.stream, map[string]string{"last_by_subj": subject}, &resp)
	if isCode(err, errCodeNoMessage) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var h natsgo.Header
	if len(resp.Message.Hdrs) > 0 {
		if h, err = natsgo.DecodeHeadersMsg(resp.Message.Hdrs); err != nil {
			return nil, fmt.Errorf("nats: the headers of %s do not parse: %w", subject, err)
		}
	}
	return parseRecord(resp.Message.Seq, resp.Message.Time, h, resp.Message.Data), nil
}

// info returns what the store says of a record read at now (the
// server's clock, estimated): free if it is a marker or expired.
func info(key string, r *record, now time.Time) driver.Info {
	if !r.held() {
		return driver.Info{Key: key}
	}
	i := driver.Info{Key: key, Owner: r.owner, Token: r.token(), Metadata: r.md}
	if r.ttl > 0 {
		i.Remaining = r.ts.Add(r.ttl).Sub(now)
		if i.Remaining <= 0 {
			return driver.Info{Key: key} // expired; the server removes it at once
		}
	}
	return i
}

// ---------------------------------------------------------------- hints

// hints remembers, per key, the last sequence of the key's subjects
// (lock and floor record) and the floor's offset then, as this backend
// last saw them: an acquire compares that sequence, so one round trip
// takes a key this backend released. A wrong hint costs a read. At most
// maxHints keys are kept.
type hints struct {
	mu sync.Mutex
	m  map[string]hint
}

type hint struct{ seq, foff uint64 }

const maxHints = 4096

func (h *hints) get(key string) hint {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m[key]
}

func (h *hints) set(key string, v hint) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil || len(h.m) >= maxHints {
		h.m = make(map[string]hint)
	}
	h.m[key] = v
}

func (h *hints) drop(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, key)
}
