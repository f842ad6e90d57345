package zookeeper

import (
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/driver"
	"github.com/go-zookeeper/zk"
)

func init() {
	fencelock.Register("zk", func(ctx context.Context, u *url.URL) (fencelock.Backend, error) {
		return OpenURL(ctx, u)
	})
}

// Defaults of Options and of the URL parameters.
const (
	DefaultRoot           = "/fencelock"
	DefaultSessionTimeout = 15 * time.Second
	DefaultConnectTimeout = 10 * time.Second
)

// lossWatchDelay is how long after a grant NotifyLoss arms its watch on the
// holder's znode. Most short leases end before it and never cost the
// server a watch; a loss that happens earlier is found when the watch is
// armed (the znode is already gone), so detection is late by at most this.
const lossWatchDelay = 50 * time.Millisecond

// Options configures a Backend. A nil *Options means every default.
type Options struct {
	// Root is the znode under which every lock lives, as
	// ROOT/<escaped key>/<contender znodes>. It must be an absolute
	// ZooKeeper path; missing components are created as persistent znodes.
	// Default "/fencelock".
	Root string

	// SessionTimeout is the session timeout the server negotiated for the
	// connection given to New. Grants report it as their TTL, so the
	// engine never trusts a lease for longer than the server keeps the
	// session (and with it the lock) alive after the holder goes silent.
	// Zero (the default) means unknown: the engine's TTL must then be at
	// most the session timeout. Open ignores this field and uses the
	// timeout the server actually granted.
	SessionTimeout time.Duration

	// ACL is the access control list of the znodes the backend creates.
	// Default zk.WorldACL(zk.PermAll).
	ACL []zk.ACL

	// Logger receives the backend's and go-zookeeper's diagnostics
	// (connection changes at Debug, clean-up failures at Warn). Default:
	// silent.
	Logger *slog.Logger
}

// Validate reports the first field out of range as a
// *driver.InvalidOptionError.
func (o *Options) Validate() error {
	_, err := o.resolve()
	return err
}

func (o *Options) resolve() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Root == "" {
		r.Root = DefaultRoot
	}
	if err := validRoot(r.Root); err != nil {
		return r, err
	}
	if r.SessionTimeout < 0 {
		return r, &driver.InvalidOptionError{Option: "SessionTimeout", Value: r.SessionTimeout.String(), Reason: "must not be negative"}
	}
	if r.ACL == nil {
		r.ACL = zk.WorldACL(zk.PermAll)
	}
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

func validRoot(root string) error {
	bad := func(reason string) error {
		return &driver.InvalidOptionError{Option: "Root", Value: strconv.Quote(root), Reason: reason}
	}
	if !strings.HasPrefix(root, "/") {
		return bad("must be an absolute znode path starting with /")
	}
	if root == "/" {
		return nil
	}
	if strings.HasSuffix(root, "/") {
		return bad("must not end with /")
	}
	if root == "/zookeeper" || strings.HasPrefix(root, "/zookeeper/") {
		return bad("is inside ZooKeeper's reserved /zookeeper tree")
	}
	for _, seg := range strings.Split(root[1:], "/") {
		switch {
		case seg == "":
			return bad("has an empty path segment")
		case seg == "." || seg == "..":
			return bad("has a . or .. segment")
		}
		for _, r := range seg {
			if r < 0x20 || r >= 0x7f && r <= 0x9f || r >= 0xd800 && r <= 0xf8ff || r >= 0xfff0 {
				return bad("has a character ZooKeeper does not allow in paths")
			}
		}
	}
	return nil
}

// Backend is a fencelock backend on one ZooKeeper session. It implements
// driver.Backend and the optional Waiter, LossNotifier, ForceReleaser and
// Describer. It is safe for concurrent use.
type Backend struct {
	conn  *zk.Conn
	owned bool    // Open dialled conn; Close closes it
	d     *dialer // owned connections only
	root  string
	acl   []zk.ACL
	log   *slog.Logger
	sess  time.Duration // Options.SessionTimeout (caller-owned conn)
	reqTO time.Duration // requested session timeout (owned conn)

	closed atomic.Bool
	done   chan struct{}
	wg     sync.WaitGroup

	mu        sync.Mutex
	orphans   map[string]orphan // pending clean-ups, by path or by nonce
	rotating  map[string]int32  // node path -> version a rotation with an unknown outcome started from
	janitorCh chan struct{}

	// Loss watches by znode path (guarded by mu). With a connection Open
	// made, go-zookeeper's event callback updates them synchronously as
	// events arrive, so RenewBatch can trust an armed, event-free watch.
	watched map[string]*nodeWatch
	evented bool // the event callback is installed (Open)

	hotMu sync.Mutex
	hot   map[string]time.Time // keys recently found held: Acquire reads first

	// counters, read by tests
	wakeups  atomic.Int64 // predecessor watch events a waiter received
	lists    atomic.Int64 // children listings made while waiting
	rechecks atomic.Int64 // safety-net queue re-reads while waiting
}

// orphan is a contender znode that may exist although nobody will use it:
// a create whose reply was lost (nonce set, path unknown) or a delete that
// failed (path set).
type orphan struct {
	parent string
	nonce  string
	path   string
	// until: a create whose reply was lost may still be executed a little
	// later (the server can read the request from the dead connection
	// after the client has reconnected), so a nonce is searched for until
	// a session timeout has passed.
	until time.Time
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.Waiter        = (*Backend)(nil)
	_ driver.LossNotifier  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// New returns a Backend on a connection the caller owns: Close does not
// close conn. It creates Options.Root if missing. A nil opts means
// defaults. Set Options.SessionTimeout to conn's session timeout so grants
// carry it (see Options).
func New(ctx context.Context, conn *zk.Conn, opts *Options) (*Backend, error) {
	if conn == nil {
		return nil, errors.New("zookeeper: New: nil *zk.Conn")
	}
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	b := newBackend(conn, o)
	if err := b.ensurePath(ctx, b.root); err != nil {
		b.Close()
		return nil, fmt.Errorf("zookeeper: creating root %s: %w", b.root, err)
	}
	return b, nil
}

func newBackend(conn *zk.Conn, o Options) *Backend {
	b := &Backend{
		conn:      conn,
		root:      o.Root,
		acl:       o.ACL,
		log:       o.Logger,
		sess:      o.SessionTimeout,
		done:      make(chan struct{}),
		orphans:   make(map[string]orphan),
		rotating:  make(map[string]int32),
		hot:       make(map[string]time.Time),
		watched:   make(map[string]*nodeWatch),
		janitorCh: make(chan struct{}, 1),
	}
	b.wg.Add(1)
	go b.janitor()
	return b
}

// Open connects to the ZooKeeper ensemble named by a URL
//
//	zk://host:2181,host2:2181/chroot?session_timeout=15s&prefix=fencelock&connect_timeout=10s
//
// and returns a Backend that owns the connection. Locks live under
// /chroot/prefix (the path is optional). Parameters: session_timeout
// (default 15s), prefix (default "fencelock"), connect_timeout: how long
// Open waits for the first session (default 10s). Unknown parameters are
// rejected.
func Open(ctx context.Context, rawURL string) (*Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, driver.InvalidURL(rawURL, "cannot be parsed")
	}
	return OpenURL(ctx, u)
}

// OpenURL is Open for a parsed URL (scheme "zk").
func OpenURL(ctx context.Context, u *url.URL) (*Backend, error) {
	raw := u.String()
	if !strings.EqualFold(u.Scheme, "zk") {
		return nil, driver.InvalidURL(raw, "scheme must be zk")
	}
	if err := driver.CheckPorts(u); err != nil {
		return nil, err
	}
	p := driver.NewParams(u)
	sessTO := p.Duration("session_timeout", DefaultSessionTimeout)
	prefix := p.String("prefix", "fencelock")
	connTO := p.Duration("connect_timeout", DefaultConnectTimeout)
	if err := p.Err(); err != nil {
		return nil, err
	}
	if u.User != nil {
		return nil, driver.InvalidURL(raw, "credentials in zk URLs are not supported; pass an authenticated *zk.Conn to New")
	}
	if sessTO < 10*time.Millisecond || sessTO > 24*time.Hour {
		return nil, &driver.InvalidOptionError{Option: "URL parameter \"session_timeout\"", Value: sessTO.String(), Reason: "must be between 10ms and 24h (the server clamps it to 2..20 × tickTime by default)"}
	}
	if connTO <= 0 {
		return nil, &driver.InvalidOptionError{Option: "URL parameter \"connect_timeout\"", Value: connTO.String(), Reason: "must be positive"}
	}
	if u.Host == "" {
		return nil, driver.InvalidURL(raw, "no servers: want zk://host:port[,host:port...]/chroot")
	}
	var servers []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			return nil, driver.InvalidURL(raw, "empty server in host list")
		}
		servers = append(servers, h)
	}
	root := path.Join("/", u.Path, prefix)
	if u.Path != "" && u.Path != "/" && path.Clean(u.Path) != strings.TrimSuffix(u.Path, "/") {
		return nil, &driver.InvalidOptionError{Option: "URL path", Value: strconv.Quote(u.Path), Reason: "must be a clean znode path"}
	}
	o, err := (&Options{Root: root}).resolve()
	if err != nil {
		return nil, err
	}
	b, err := dial(ctx, servers, sessTO, connTO, o)
	if err != nil {
		return nil, driver.RedactError(err, raw)
	}
	return b, nil
}

func dial(ctx context.Context, servers []string, sessTO, connTO time.Duration, o Options) (*Backend, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d := newDialer()
	ready := make(chan struct{})
	var readyOnce sync.Once
	var b *Backend
	var bmu sync.Mutex
	cb := func(ev zk.Event) {
		if ev.Type != zk.EventSession {
			bmu.Lock()
			bb := b
			bmu.Unlock()
			if bb != nil && ev.Path != "" {
				bb.nodeEvent(ev.Path)
			}
			return
		}
		switch ev.State {
		case zk.StateHasSession:
			readyOnce.Do(func() { close(ready) })
			bmu.Lock()
			bb := b
			bmu.Unlock()
			if bb != nil {
				bb.wakeJanitor() // retry clean-ups that failed while disconnected
			}
		}
		o.Logger.Debug("zookeeper: session state", "state", ev.State.String(), "server", ev.Server)
	}
	conn, _, err := zk.Connect(servers, sessTO, zk.WithDialer(d.dial), zk.WithLogger(zkLogger{o.Logger}), zk.WithLogInfo(false), zk.WithEventCallback(cb))
	if err != nil {
		return nil, fmt.Errorf("zookeeper: connect: %w", err)
	}
	t := time.NewTimer(connTO)
	defer t.Stop()
	select {
	case <-ready:
	case <-ctx.Done():
		conn.Close()
		return nil, ctx.Err()
	case <-t.C:
		conn.Close()
		return nil, fmt.Errorf("zookeeper: no session with %s within connect_timeout %v", strings.Join(servers, ","), connTO)
	}
	bb := newBackend(conn, o)
	bb.owned, bb.d, bb.reqTO, bb.evented = true, d, sessTO, true
	bmu.Lock()
	b = bb
	bmu.Unlock()
	if err := bb.ensurePath(ctx, bb.root); err != nil {
		bb.Close()
		return nil, fmt.Errorf("zookeeper: creating root %s: %w", bb.root, err)
	}
	return bb, nil
}

type zkLogger struct{ l *slog.Logger }

func (z zkLogger) Printf(format string, args ...any) {
	z.l.Debug("zookeeper: go-zookeeper: " + fmt.Sprintf(format, args...))
}

// Conn returns the backend's ZooKeeper connection.
func (b *Backend) Conn() *zk.Conn { return b.conn }

// SessionTimeout returns the session timeout grants report as their TTL:
// the one the server negotiated for a connection Open made, else
// Options.SessionTimeout (zero if unknown).
func (b *Backend) SessionTimeout() time.Duration {
	if b.d != nil {
		if ms := b.d.timeout.Load(); ms > 0 {
			return time.Duration(ms) * time.Millisecond
		}
	}
	return b.sess
}

// Describe implements driver.Describer.
func (b *Backend) Describe() driver.Description {
	d := driver.Description{
		Name:          "zookeeper",
		Fencing:       "zxid of the holder's znode (czxid, or mzxid after a rotation): a cluster-wide transaction id that strictly increases, survives deletion of the key's container znode and server restarts (the transaction log is fsynced before a write is acknowledged)",
		Clock:         "server (session expiry by the ZooKeeper leader)",
		Liveness:      "session timeout (ephemeral sequential znodes)",
		Scope:         driver.ScopeStore,
		FailoverSafe:  true,
		Failover:      "Zab: a write is acknowledged once a quorum has logged it, so a new leader has every znode and zxid",
		LossDetection: "pushed on session expiry or deletion of the holder's znode, else " + driver.LossByRenewal,
	}
	st := b.SessionTimeout()
	switch {
	case st == 0:
		d.Warnings = append(d.Warnings, "session timeout unknown (caller-owned connection without Options.SessionTimeout): the engine's TTL must not exceed the session timeout")
	case b.owned && b.reqTO > 0 && st != b.reqTO:
		d.Warnings = append(d.Warnings, fmt.Sprintf("server negotiated a session timeout of %v instead of the requested %v (bounded by 2×..20×tickTime); grants report %v", st, b.reqTO, st))
	}
	return d
}

// Close stops the backend's goroutines and, if Open made the connection,
// closes it (which ends the session and deletes its znodes). It does not
// release locks (the engine does that first) and never closes a connection
// passed to New.
func (b *Backend) Close() error {
	b.mu.Lock() // orders Close after any NotifyLoss that saw it open
	if b.closed.Load() {
		b.mu.Unlock()
		return nil
	}
	b.closed.Store(true)
	b.mu.Unlock()
	close(b.done)
	if b.owned {
		b.conn.Close()
	}
	b.wg.Wait()
	return nil
}

func (b *Backend) check(ctx context.Context) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return ctx.Err()
}

func (b *Backend) parent(key string) string {
	if b.root == "/" {
		return "/" + escapeKey(key)
	}
	return b.root + "/" + escapeKey(key)
}

// ensurePath creates p and its missing ancestors as persistent znodes.
func (b *Backend) ensurePath(ctx context.Context, p string) error {
	if p == "/" {
		return nil
	}
	ok, _, err := b.conn.Exists(p)
	if err != nil || ok {
		return err
	}
	cur := ""
	for _, seg := range strings.Split(p[1:], "/") {
		if err := ctx.Err(); err != nil {
			return err
		}
		cur += "/" + seg
		if _, err := b.conn.Create(cur, nil, zk.FlagPersistent, b.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// ---- contender znodes

const (
	nodePrefix = "_c_" // protected-mode style: _c_<nonce>-lock-<seq>
	seqMarker  = "-lock-"
)

func newNonce() string {
	var n [12]byte
	_, _ = crand.Read(n[:])
	return hex.EncodeToString(n[:])
}

type child struct {
	name string
	seq  int32
}

// sortChildren returns the contender znodes among names, in queue order.
// Sequence numbers are compared with wrap-around arithmetic, so the queue
// stays ordered when a parent's counter passes 2^31.
func sortChildren(names []string) []child {
	cs := make([]child, 0, len(names))
	for _, n := range names {
		if !strings.HasPrefix(n, nodePrefix) {
			continue
		}
		i := strings.LastIndex(n, seqMarker)
		if i < 0 {
			continue
		}
		s, err := strconv.ParseInt(n[i+len(seqMarker):], 10, 64)
		if err != nil {
			continue
		}
		cs = append(cs, child{n, int32(s)})
	}
	slices.SortFunc(cs, func(a, b child) int {
		d := a.seq - b.seq
		switch {
		case d < 0:
			return -1
		case d > 0:
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	return cs
}

// entry is a contender znode just created by enqueue.
type entry struct {
	node     string
	czxid    int64 // the znode's czxid: the zxid of the creating transaction
	n        int32 // the parent's number of children right after
	aversion int32 // the parent's ACL version then (see markedSet)
}

// enqueue creates this contender's EPHEMERAL|SEQUENTIAL znode under the
// key's parent in one transaction with a no-op write to the parent, whose
// returned Stat says how many contenders there are (numChildren 1: we hold
// the lock) and carries the transaction's zxid, which is our znode's czxid.
// It creates the parent (a container znode) when missing.
func (b *Backend) enqueue(ctx context.Context, parent, owner string) (entry, error) {
	nonce := newNonce()
	prefix := parent + "/" + nodePrefix + nonce + seqMarker
	for attempt := 0; ; attempt++ {
		res, err := b.conn.Multi(
			&zk.CreateRequest{Path: prefix, Data: []byte(owner), Acl: b.acl, Flags: zk.FlagEphemeralSequential},
			&zk.SetDataRequest{Path: parent, Data: nil, Version: -1},
		)
		switch {
		case err == nil && len(res) == 2 && res[1].Stat != nil:
			st := res[1].Stat
			return entry{node: res[0].String, czxid: st.Mzxid, n: st.NumChildren, aversion: st.Aversion}, nil
		case err == nil:
			return entry{}, errors.New("zookeeper: malformed multi response")
		case errors.Is(err, zk.ErrNoNode) && attempt < 3:
			if err := ctx.Err(); err != nil {
				return entry{}, err
			}
			if err := b.ensureParent(ctx, parent); err != nil {
				return entry{}, err
			}
			continue
		case definiteZK(err):
			return entry{}, err
		default:
			// The reply was lost: the znode may exist. Find it by its
			// nonce and delete it, now or (if the server is unreachable)
			// later, so it never blocks the queue.
			b.addOrphan(orphan{parent: parent, nonce: nonce, until: time.Now().Add(max(b.SessionTimeout(), 10*time.Second))})
			return entry{}, err
		}
	}
}

// definiteZK reports whether err is an answer of the server (the request
// was executed or rejected as a whole), as opposed to a transport failure
// with an unknown outcome.
func definiteZK(err error) bool {
	for _, e := range []error{zk.ErrNoNode, zk.ErrNodeExists, zk.ErrBadVersion, zk.ErrNoAuth, zk.ErrInvalidACL,
		zk.ErrNoChildrenForEphemerals, zk.ErrNotEmpty, zk.ErrBadArguments, zk.ErrInvalidPath, zk.ErrNoServer} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (b *Backend) ensureParent(ctx context.Context, parent string) error {
	_, err := b.conn.CreateContainer(parent, nil, zk.FlagContainer, b.acl)
	if err == nil || errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	if !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	if err := b.ensurePath(ctx, b.root); err != nil {
		return err
	}
	_, err = b.conn.CreateContainer(parent, nil, zk.FlagContainer, b.acl)
	if errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	return err
}

// deleteOwn removes one of our contender znodes whatever the caller's
// context says; if the server cannot be reached the janitor retries.
func (b *Backend) deleteOwn(node string) {
	b.clearRotating(node)
	err := b.conn.Delete(node, -1)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		b.addOrphan(orphan{path: node})
	}
}

func (b *Backend) addOrphan(o orphan) {
	k := o.path
	if k == "" {
		k = "nonce:" + o.nonce
	}
	b.mu.Lock()
	b.orphans[k] = o
	b.mu.Unlock()
	b.wakeJanitor()
}

func (b *Backend) wakeJanitor() {
	select {
	case b.janitorCh <- struct{}{}:
	default:
	}
}

// janitor deletes orphaned contender znodes. It is the backend's one
// long-lived goroutine and ends on Close.
func (b *Backend) janitor() {
	defer b.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-b.done:
			t.Stop()
			return
		case <-b.janitorCh:
		case <-t.C:
		}
		if b.sweep() {
			t.Reset(backoff)
			backoff = min(2*backoff, 2*time.Second)
		} else {
			backoff = 50 * time.Millisecond
		}
	}
}

// sweep tries every pending clean-up once; it reports whether some remain.
func (b *Backend) sweep() bool {
	b.mu.Lock()
	todo := make(map[string]orphan, len(b.orphans))
	for k, o := range b.orphans {
		todo[k] = o
	}
	b.mu.Unlock()
	left := false
	for k, o := range todo {
		if b.closed.Load() {
			return false
		}
		var err error
		if o.path != "" {
			err = b.conn.Delete(o.path, -1)
			if errors.Is(err, zk.ErrNoNode) {
				err = nil
			}
		} else {
			var names []string
			names, _, err = b.conn.Children(o.parent)
			if errors.Is(err, zk.ErrNoNode) {
				err = nil
			}
			for _, n := range names {
				if strings.HasPrefix(n, nodePrefix+o.nonce+seqMarker) {
					if e := b.conn.Delete(o.parent+"/"+n, -1); e != nil && !errors.Is(e, zk.ErrNoNode) {
						err = e
					}
				}
			}
		}
		if err != nil {
			left = true
			b.log.Warn("zookeeper: could not delete an orphaned contender znode yet; retrying", "znode", o.path, "parent", o.parent, "err", err)
			continue
		}
		if o.nonce != "" && time.Now().Before(o.until) {
			left = true // look again later
			continue
		}
		b.mu.Lock()
		delete(b.orphans, k)
		b.mu.Unlock()
	}
	return left
}

// ---- grants and handles

// A grant's Handle is "VERSION:TOKEN:OWNERTAG:PATH": the holder znode's data
// version and zxid token when the grant was issued, a hash of the owner,
// and the znode path. Renew and Release check Owner and Token against it
// locally and the version on the server, so each is one round trip.
// VERSION "uA" marks a grant of AcquireWait that the engine's Renew has yet
// to confirm; A is the parent's ACL version when the znode was created
// (see markedSet).
type handle struct {
	version     int32
	token       int64
	tag         string
	path        string
	unconfirmed bool
	aversion    int32
}

func ownerTag(owner string) string {
	s := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(s[:8])
}

func (h handle) String() string {
	if h.unconfirmed {
		return fmt.Sprintf("u%d:%d:%s:%s", h.aversion, h.token, h.tag, h.path)
	}
	return fmt.Sprintf("%d:%d:%s:%s", h.version, h.token, h.tag, h.path)
}

func parseHandle(s string) (handle, bool) {
	parts := strings.SplitN(s, ":", 4)
	if len(parts) != 4 || !strings.HasPrefix(parts[3], "/") {
		return handle{}, false
	}
	h := handle{tag: parts[2], path: parts[3]}
	var err1, err2 error
	if a, ok := strings.CutPrefix(parts[0], "u"); ok {
		h.unconfirmed = true
		var v int64
		v, err1 = strconv.ParseInt(a, 10, 32)
		h.aversion = int32(v)
	} else {
		var v int64
		v, err1 = strconv.ParseInt(parts[0], 10, 32)
		h.version = int32(v)
	}
	h.token, err2 = strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return handle{}, false
	}
	return h, true
}

func (b *Backend) grant(key, owner, node string, version int32, token int64) driver.Grant {
	return driver.Grant{
		Key:    key,
		Owner:  owner,
		Token:  driver.Token(token),
		TTL:    b.SessionTimeout(),
		Handle: handle{version: version, token: token, tag: ownerTag(owner), path: node}.String(),
	}
}

// ownHandle returns g's handle if it is consistent with g's Owner and
// Token; a forged or mixed-up grant gets ok false. A grant without a
// handle (the engine's clean-up after an ambiguous acquire builds one from
// Inspect) is looked up on the server.
func (b *Backend) ownHandle(g driver.Grant) (handle, bool, error) {
	if g.Handle == "" {
		return b.lookup(g)
	}
	h, ok := parseHandle(g.Handle)
	if !ok || h.tag != ownerTag(g.Owner) || h.token != int64(g.Token) || g.Token == 0 {
		return handle{}, false, nil
	}
	if !strings.HasPrefix(h.path, b.parent(g.Key)+"/") {
		return handle{}, false, nil
	}
	return h, true, nil
}

// lookup finds the holder znode of g.Key and checks it is g's.
func (b *Backend) lookup(g driver.Grant) (handle, bool, error) {
	if driver.ValidateKey(g.Key) != nil {
		return handle{}, false, nil
	}
	node, data, st, err := b.holder(b.parent(g.Key))
	if err != nil || node == "" {
		return handle{}, false, err
	}
	if string(data) != g.Owner || st.Mzxid != int64(g.Token) {
		return handle{}, false, nil
	}
	return handle{version: st.Version, token: st.Mzxid, tag: ownerTag(g.Owner), path: node}, true, nil
}

// holder returns the lowest contender znode under parent, with its data
// and Stat; node is "" if there is none.
func (b *Backend) holder(parent string) (node string, data []byte, st *zk.Stat, err error) {
	for range 5 {
		names, _, err := b.conn.Children(parent)
		if errors.Is(err, zk.ErrNoNode) {
			return "", nil, nil, nil
		}
		if err != nil {
			return "", nil, nil, err
		}
		cs := sortChildren(names)
		if len(cs) == 0 {
			return "", nil, nil, nil
		}
		node = parent + "/" + cs[0].name
		data, st, err = b.conn.Get(node)
		if errors.Is(err, zk.ErrNoNode) {
			continue // it just went: look again
		}
		if err != nil {
			return "", nil, nil, err
		}
		return node, data, st, nil
	}
	return "", nil, nil, errors.New("zookeeper: the lock's queue kept changing while being read")
}

// ---- driver.Backend

// Acquire implements driver.Backend: one attempt. It joins the key's queue
// and, unless it is first, leaves it again and reports the holder.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.validate(ctx, req); err != nil {
		return driver.Grant{}, err
	}
	parent := b.parent(req.Key)
	if b.isHot(req.Key) {
		// Contended lately: look before writing, so a contender that
		// will wait anyway costs the server two reads instead of two
		// writes.
		node, data, st, err := b.holder(parent)
		if err != nil {
			return driver.Grant{}, err
		}
		if node != "" && (string(data) != req.Owner || st.EphemeralOwner != b.conn.SessionID()) {
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Owner: string(data), Token: driver.Token(st.Mzxid)}}
		}
	}
	e, err := b.enqueue(ctx, parent, req.Owner)
	if err != nil {
		return driver.Grant{}, err
	}
	node := e.node
	if e.n == 1 {
		// Alone: every earlier holder's znode was deleted before ours was
		// created, so our czxid is above all their tokens.
		return b.grant(req.Key, req.Owner, node, 0, e.czxid), nil
	}
	b.setHot(req.Key)
	for range 5 {
		names, pst, err := b.conn.Children(parent)
		if err != nil {
			b.deleteOwn(node)
			return driver.Grant{}, err
		}
		cs := sortChildren(names)
		own := path.Base(node)
		if len(cs) == 0 || !slices.ContainsFunc(cs, func(c child) bool { return c.name == own }) {
			return driver.Grant{}, errors.New("zookeeper: our contender znode vanished (session expired?)")
		}
		if cs[0].name == own {
			// The holder left meanwhile.
			if pst.Aversion == e.aversion {
				return b.grant(req.Key, req.Owner, node, 0, e.czxid), nil
			}
			return b.bump(req, node, 0)
		}
		lowest := parent + "/" + cs[0].name
		data, st, err := b.conn.Get(lowest)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			b.deleteOwn(node)
			return driver.Grant{}, err
		}
		b.deleteOwn(node)
		if string(data) == req.Owner && st.EphemeralOwner == b.conn.SessionID() {
			// A retry of an acquire whose reply was lost: the lock is
			// already ours.
			return b.bump(req, lowest, st.Version)
		}
		return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key, Owner: string(data), Token: driver.Token(st.Mzxid)}}
	}
	b.deleteOwn(node)
	return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
}

// hotFor is how long after finding a key held Acquire reads before writing.
const hotFor = 2 * time.Second

func (b *Backend) isHot(key string) bool {
	b.hotMu.Lock()
	defer b.hotMu.Unlock()
	t, ok := b.hot[key]
	if ok && time.Since(t) > hotFor {
		delete(b.hot, key)
		return false
	}
	return ok
}

func (b *Backend) setHot(key string) {
	b.hotMu.Lock()
	defer b.hotMu.Unlock()
	if len(b.hot) >= 4096 {
		clear(b.hot)
	}
	b.hot[key] = time.Now()
}

// bump rewrites the holder znode's data (version-checked) so that its mzxid,
// the grant's token, is a fresh zxid: higher than every token issued for
// the key before, including rotated ones.
func (b *Backend) bump(req driver.AcquireRequest, node string, version int32) (driver.Grant, error) {
	st, err := b.markedSet(node, req.Owner, version)
	if err != nil {
		if !definiteZK(err) {
			b.deleteOwn(node)
		}
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return driver.Grant{}, &driver.HeldError{Holder: driver.Info{Key: req.Key}}
		}
		return driver.Grant{}, err
	}
	return b.grant(req.Key, req.Owner, node, st.Version, st.Mzxid), nil
}

// markedSet rewrites a holder znode (version-checked) to give it a fresh
// mzxid: a rotated token, or a hand-off token above a rotated one. Then it
// rewrites the parent's ACL (unchanged) to bump the parent's ACL version,
// the key's "a token above some czxid was issued" mark: a contender whose
// predecessors all left compares the parent's ACL version with the one at
// its own creation, and only if it changed does it need a fresh zxid of
// its own (see confirm). The token counts as issued only once both writes
// succeeded, so a crash in between issues nothing.
//
// While the outcome is unknown (no reply, or the mark not yet set), the
// node stays in b.rotating, so that a later Renew or Release of the grant
// (which still names the old version) can finish the job instead of taking
// the lock for lost while its znode lives on.
func (b *Backend) markedSet(node, owner string, version int32) (*zk.Stat, error) {
	b.setRotating(node, version)
	st, err := b.conn.Set(node, []byte(owner), version)
	if err != nil {
		if definiteZK(err) {
			b.clearRotating(node)
		}
		return nil, err
	}
	if err := b.mark(node); err != nil {
		return nil, err
	}
	b.clearRotating(node)
	return st, nil
}

func (b *Backend) setRotating(node string, version int32) {
	b.mu.Lock()
	b.rotating[node] = version
	b.mu.Unlock()
}

func (b *Backend) clearRotating(node string) {
	b.mu.Lock()
	delete(b.rotating, node)
	b.mu.Unlock()
}

func (b *Backend) mark(node string) error {
	_, err := b.conn.SetACL(path.Dir(node), b.acl, -1)
	return err
}

func (b *Backend) validate(ctx context.Context, req driver.AcquireRequest) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if err := driver.ValidateKey(req.Key); err != nil {
		return err
	}
	if err := driver.ValidateTTL(req.TTL); err != nil {
		return err
	}
	if req.Owner == "" {
		return &driver.InvalidOptionError{Option: "Owner", Value: `""`, Reason: "must not be empty"}
	}
	return nil
}

// Renew implements driver.Backend. The lock lives as long as the session,
// so a renewal proves two things in one round trip: the session is alive
// (the server answered on it) and the znode is still ours (same version and
// zxid, owned by this session). With Rotate it rewrites the znode's data,
// version-checked, and the new mzxid is the new token.
func (b *Backend) Renew(ctx context.Context, g driver.Grant, req driver.RenewRequest) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	if err := driver.ValidateTTL(req.TTL); err != nil {
		return driver.Grant{}, err
	}
	h, ok, err := b.ownHandle(g)
	if err != nil {
		return driver.Grant{}, err
	}
	if !ok {
		return driver.Grant{}, driver.ErrNotHeld
	}
	if h.unconfirmed {
		return b.confirm(g, h)
	}
	exists, st, err := b.conn.Exists(h.path)
	if err != nil {
		return driver.Grant{}, err
	}
	sid := b.conn.SessionID()
	if !exists || st.EphemeralOwner != sid {
		return driver.Grant{}, driver.ErrNotHeld
	}
	if st.Version != h.version || st.Mzxid != h.token {
		// A rotation of ours whose reply was lost may have gone through.
		b.mu.Lock()
		from, amb := b.rotating[h.path]
		b.mu.Unlock()
		if !amb || from != h.version || st.Version != h.version+1 {
			return driver.Grant{}, driver.ErrNotHeld
		}
		if err := b.mark(h.path); err != nil {
			return driver.Grant{}, err
		}
		h.version, h.token = st.Version, st.Mzxid
	}
	b.clearRotating(h.path)
	if !req.Rotate {
		return b.grant(g.Key, g.Owner, h.path, h.version, h.token), nil
	}
	st, err = b.markedSet(h.path, g.Owner, h.version)
	if err != nil {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return driver.Grant{}, driver.ErrNotHeld
		}
		return driver.Grant{}, err
	}
	return b.grant(g.Key, g.Owner, h.path, st.Version, st.Mzxid), nil
}

// Release implements driver.Backend: it deletes the grant's own znode,
// version-checked, and nothing else.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	h, ok, err := b.ownHandle(g)
	if err != nil {
		return err
	}
	if !ok {
		return driver.ErrNotHeld
	}
	if h.unconfirmed {
		h.version = -1 // the path is this grant's alone
	}
	b.mu.Lock()
	from, amb := b.rotating[h.path]
	b.mu.Unlock()
	err = b.conn.Delete(h.path, h.version)
	if errors.Is(err, zk.ErrBadVersion) && amb && from == h.version {
		err = b.conn.Delete(h.path, h.version+1) // our rotation did go through
	}
	switch {
	case err == nil:
		if amb {
			b.mu.Lock()
			delete(b.rotating, h.path)
			b.mu.Unlock()
		}
		return nil
	case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
		return driver.ErrNotHeld
	}
	return err
}

// Inspect implements driver.Backend. Remaining is always zero: the lock
// lives as long as its holder's session.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	return b.inspect(key)
}

func (b *Backend) inspect(key string) (driver.Info, error) {
	node, data, st, err := b.holder(b.parent(key))
	if err != nil || node == "" {
		return driver.Info{Key: key}, err
	}
	return driver.Info{Key: key, Owner: string(data), Token: driver.Token(st.Mzxid)}, nil
}

// List implements driver.Backend. It reads the key znodes under the root
// and the holder of each (up to 16 at a time, pipelined on the session).
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if err := driver.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	names, _, err := b.conn.Children(b.root)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, n := range names {
		if k, ok := unescapeKey(n); ok && strings.HasPrefix(k, prefix) && driver.ValidateKey(k) == nil {
			keys = append(keys, k)
		}
	}
	infos := make([]driver.Info, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			infos[i], errs[i] = b.inspect(k)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := infos[:0]
	for i, in := range infos {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if in.Locked() {
			out = append(out, in)
		}
	}
	return out, nil
}

// ForceRelease implements driver.ForceReleaser: it deletes the key's
// current holder znode. The holder's NotifyLoss watch fires at once; the
// next contender in the queue becomes the holder with a higher token.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	if err := driver.ValidateKey(key); err != nil {
		return driver.Info{}, err
	}
	for range 5 {
		node, data, st, err := b.holder(b.parent(key))
		if err != nil || node == "" {
			return driver.Info{Key: key}, err
		}
		err = b.conn.Delete(node, st.Version)
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			continue
		}
		if err != nil {
			return driver.Info{}, err
		}
		return driver.Info{Key: key, Owner: string(data), Token: driver.Token(st.Mzxid)}, nil
	}
	return driver.Info{}, errors.New("zookeeper: the lock's holder kept changing during ForceRelease")
}
