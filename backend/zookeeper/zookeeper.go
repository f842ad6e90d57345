package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/fencelock/fencelock/internal/backendkit"
	"github.com/go-zookeeper/zk"
)

// Backend is a fencelock backend on one ZooKeeper session. It implements
// driver.Backend and the optional Waiter, Watcher, BatchRenewer,
// LossNotifier, ForceReleaser, TokenFloorer and Describer. It is safe for
// concurrent use.
type Backend struct {
	conn  conn
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

	mu       sync.Mutex
	rotating map[string]int32 // node path -> version a rotation with an unknown outcome started from

	sweepWait  time.Duration // pause after a sweep that left work pending
	nextSweep  time.Time     // no sweep before (zero after addOrphan)
	cleanupErr error         // the last clean-up failure, nil after a sweep without one (pendingError)

	orphans  backendkit.Orphans[string, orphan] // pending clean-ups, by path or by nonce
	sweeping atomic.Bool                        // a sweep is running

	// Loss watches by znode path (guarded by mu). With a connection Open
	// made, go-zookeeper's event callback updates them synchronously as
	// events arrive, so RenewBatch can trust an armed, event-free watch.
	watched map[string]*nodeWatch
	evented bool // the event callback is installed (Open)

	hot backendkit.HotSet // keys recently found held: Acquire reads first

	fl floors // the token floor znode as last read (floor.go)

	delays delayed // grants that wrote a lock-delay marker (lockdelay.go)

	// counters, read by tests
	wakeups  atomic.Int64 // predecessor watch events a waiter received
	lists    atomic.Int64 // children listings made while waiting
	rechecks atomic.Int64 // safety-net queue re-reads while waiting
}

// New returns a Backend on a connection the caller owns: Close does not
// close conn. It creates Options.Prefix if missing. A nil opts means
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

func newBackend(zc *zk.Conn, o Options) *Backend {
	b := &Backend{
		conn:     conn{Conn: zc},
		root:     o.Prefix,
		acl:      o.ACL,
		log:      o.Logger,
		sess:     o.SessionTimeout,
		done:     make(chan struct{}),
		rotating: make(map[string]int32),
		hot:      backendkit.HotSet{TTL: hotFor, Max: maxHot},
		watched:  make(map[string]*nodeWatch),
	}
	return b
}

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.Waiter        = (*Backend)(nil)
	_ driver.LossNotifier  = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Describer     = (*Backend)(nil)
)

// Conn returns the backend's ZooKeeper connection.
func (b *Backend) Conn() *zk.Conn { return b.conn.Conn }

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
		d.Warnings = append(d.Warnings, "session timeout unknown (caller-owned connection without Options.SessionTimeout): grants cannot say how long they are valid, so the engine's TTL must not exceed a third of the session timeout (a follower cut off from its leader answers renewals until the leader expires the session)")
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
	ok, _, err := b.conn.Exists(ctx, p)
	if err != nil || ok {
		return err
	}
	cur := ""
	for _, seg := range strings.Split(p[1:], "/") {
		if err := ctx.Err(); err != nil {
			return err
		}
		cur += "/" + seg
		if _, err := b.conn.Create(ctx, cur, nil, zk.FlagPersistent, b.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}
