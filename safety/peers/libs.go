package peers

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fencelock/fencelock/safety/contender"
)

// The peer libraries, by the name a contender.Config's Peer gives them.
const (
	Redsync   = "redsync"
	Redislock = "redislock"
	EtcdMutex = "etcd-mutex"
	ZKLock    = "zk-lock"
)

// Lib describes one peer library as the report shows it.
type Lib struct {
	// Name is its row in the report and its contender.Config.Peer.
	Name string
	// Module is its Go module (and package, where it differs).
	Module string
	// Store is the store it runs on: "redis", "etcd" or "zookeeper" (the
	// fencelock row it is compared with).
	Store string
	// Tokens says it has a fencing token; Token says what it is, or how
	// the contender uses the library without one.
	Tokens bool
	Token  string
	// Use is how the contender takes, checks and gives back the lock.
	Use string
}

// Libs are the peer libraries the report measures.
var Libs = []Lib{
	{Name: Redsync, Module: "github.com/go-redsync/redsync/v4", Store: "redis",
		Token: "none: the fenced resource accepts every write (fencing off)",
		Use: redisClientUse + "; redsync.New(goredis.NewPool(client)); NewMutex(key, WithExpiry(TTL)), defaults otherwise (32 tries, 50–250 ms apart); LockContext; believes while " +
			"time.Now() is before Mutex.Until(); UnlockContext"},
	{Name: Redislock, Module: "github.com/bsm/redislock", Store: "redis",
		Token: "none: the fenced resource accepts every write (fencing off)",
		Use: redisClientUse + "; redislock.New(client); Obtain(ctx, key, TTL) with LinearBackoff(100ms) (the default is one attempt); believes until the deadline the " +
			"first Lock.TTL after Obtain gives; Release"},
	{Name: EtcdMutex, Module: "go.etcd.io/etcd/client/v3/concurrency (Mutex)", Store: "etcd", Tokens: true,
		Token: "the create revision of the Mutex's own key (Mutex.Key()), read after Lock",
		Use: "clientv3.New with the store's endpoints (all three members on etcd3); one Session per contender with the TTL as its lease's (a new one after a loss); NewMutex, Lock(ctx); believes " +
			"while Session.Done() is open; Unlock"},
	{Name: ZKLock, Module: "github.com/go-zookeeper/zk (Lock)", Store: "zookeeper", Tokens: true,
		Token: "the creation zxid (czxid) of the lock's sequence node (the lowest child, owned by the session), read after Lock",
		Use: "one Conn per contender (zk.Connect with the store's servers: all three members on zookeeper3), session timeout = TTL; NewLock(conn, path, WorldACL(PermAll)), Lock; believes while " +
			"Conn.State() is StateHasSession; lost on StateExpired; Unlock"},
}

// redisClientUse is the go-redis client the Redis peers run on.
const redisClientUse = "go-redis v9 client: redis.NewClient on the single server, redis.NewFailoverClient " +
	"(MasterName and SentinelAddrs, defaults otherwise: the Sentinel client a user of a Sentinel setup takes) on redisha"

// LibByName returns the Lib of a name.
func LibByName(name string) (Lib, bool) {
	for _, l := range Libs {
		if l.Name == name {
			return l, true
		}
	}
	return Lib{}, false
}

// ---------------------------------------------------------------- redis

// redisClient opens the go-redis client a user of the URL's topology
// would: redis.NewClient for redis://host:port[/db], and
// redis.NewFailoverClient (the Sentinel client, which follows the
// primary Sentinel names) for redis+sentinel://s1:port[,s2:port]/master[/db].
// A password in the URL is the server's.
func redisClient(cfg contender.Config) (*redis.Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, err
	}
	var user, pw string
	if p, ok := u.User.Password(); ok {
		user, pw = u.User.Username(), p
	}
	path := strings.Split(strings.Trim(u.Path, "/"), "/")
	var c *redis.Client
	switch u.Scheme {
	case "redis":
		opt := &redis.Options{Addr: u.Host, Username: user, Password: pw}
		if path[0] != "" {
			if opt.DB, err = strconv.Atoi(path[0]); err != nil {
				return nil, fmt.Errorf("database %q: %w", path[0], err)
			}
		}
		c = redis.NewClient(opt)
	case "redis+sentinel":
		if path[0] == "" {
			return nil, errors.New("a redis+sentinel:// URL names its master: redis+sentinel://host:port/master[/db]")
		}
		opt := &redis.FailoverOptions{MasterName: path[0], SentinelAddrs: strings.Split(u.Host, ","), Username: user, Password: pw}
		if len(path) > 1 {
			if opt.DB, err = strconv.Atoi(path[1]); err != nil {
				return nil, fmt.Errorf("database %q: %w", path[1], err)
			}
		}
		c = redis.NewFailoverClient(opt)
	default:
		return nil, fmt.Errorf("scheme %q: the Redis peers take redis:// and redis+sentinel:// URLs", u.Scheme)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

type redsyncLocker struct {
	c   *redis.Client
	rs  *redsync.Redsync
	ttl time.Duration
}

func openRedsync(cfg contender.Config) (locker, error) {
	c, err := redisClient(cfg)
	if err != nil {
		return nil, err
	}
	return &redsyncLocker{c: c, rs: redsync.New(redsyncgoredis.NewPool(c)), ttl: cfg.TTL}, nil
}

func (l *redsyncLocker) lock(ctx context.Context, key, _ string) (held, error) {
	m := l.rs.NewMutex(key, redsync.WithExpiry(l.ttl))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return &deadlineHeld{until: m.Until, release: func(ctx context.Context) error {
		ok, err := m.UnlockContext(ctx)
		if err == nil && !ok {
			err = errors.New("redsync: unlock returned false")
		}
		return err
	}}, nil
}

func (l *redsyncLocker) close() { l.c.Close() }

type redislockLocker struct {
	c   *redis.Client
	rl  *redislock.Client
	ttl time.Duration
}

func openRedislock(cfg contender.Config) (locker, error) {
	c, err := redisClient(cfg)
	if err != nil {
		return nil, err
	}
	return &redislockLocker{c: c, rl: redislock.New(c), ttl: cfg.TTL}, nil
}

func (l *redislockLocker) lock(ctx context.Context, key, _ string) (held, error) {
	lk, err := l.rl.Obtain(ctx, key, l.ttl, &redislock.Options{RetryStrategy: redislock.LinearBackoff(100 * time.Millisecond)})
	if err != nil {
		return nil, err
	}
	// The deadline: what the library says is left, from before it asked.
	asked := time.Now()
	rem, err := lk.TTL(ctx)
	if err != nil || rem <= 0 {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl)
		lk.Release(rctx)
		cancel()
		if err == nil {
			err = errors.New("redislock: the lock had no TTL left right after Obtain")
		}
		return nil, err
	}
	deadline := asked.Add(rem)
	return &deadlineHeld{until: func() time.Time { return deadline }, release: lk.Release}, nil
}

func (l *redislockLocker) close() { l.c.Close() }

// deadlineHeld is a lock whose holder knows only a local deadline: it
// believes until then, and knows the lock gone once it passed.
type deadlineHeld struct {
	until   func() time.Time
	release func(ctx context.Context) error
}

func (h *deadlineHeld) token() uint64 { return 0 }

func (h *deadlineHeld) check() (time.Duration, bool, string) {
	rem := time.Until(h.until())
	if rem <= 0 {
		return 0, true, "the lock's deadline passed (the library's expiry, known locally)"
	}
	return rem, false, ""
}

func (h *deadlineHeld) lost() <-chan struct{} { return nil }

func (h *deadlineHeld) unlock(ctx context.Context) error { return h.release(ctx) }

// ---------------------------------------------------------------- etcd

// hostsOf returns the host:port list of a URL (etcd://h1:p1,h2:p2,…):
// the members of a cluster, or one server.
func hostsOf(raw string) ([]string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Host == "" {
		return nil, fmt.Errorf("the URL names no host")
	}
	return strings.Split(u.Host, ","), nil
}

type etcdLocker struct {
	cli *clientv3.Client
	ttl int // seconds
	s   *concurrency.Session
}

func openEtcdMutex(cfg contender.Config) (locker, error) {
	hosts, err := hostsOf(cfg.URL)
	if err != nil {
		return nil, err
	}
	secs := int((cfg.TTL + time.Second - 1) / time.Second)
	cli, err := clientv3.New(clientv3.Config{Endpoints: hosts, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	return &etcdLocker{cli: cli, ttl: secs}, nil
}

// session returns the contender's session, a new one if the last ended.
func (l *etcdLocker) session(ctx context.Context) (*concurrency.Session, error) {
	if l.s != nil {
		select {
		case <-l.s.Done():
			l.s = nil
		default:
			return l.s, nil
		}
	}
	// The lease is granted with ctx's bound; the session keeps it alive
	// until it is closed or lost.
	g, err := l.cli.Grant(ctx, int64(l.ttl))
	if err != nil {
		return nil, err
	}
	s, err := concurrency.NewSession(l.cli, concurrency.WithLease(g.ID), concurrency.WithTTL(l.ttl))
	if err != nil {
		return nil, err
	}
	l.s = s
	return s, nil
}

func (l *etcdLocker) lock(ctx context.Context, key, _ string) (held, error) {
	s, err := l.session(ctx)
	if err != nil {
		return nil, err
	}
	m := concurrency.NewMutex(s, "/fencelock-peers/"+key)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	resp, err := l.cli.Get(ctx, m.Key())
	if err == nil && len(resp.Kvs) == 0 {
		err = errors.New("etcd: the mutex's key is gone right after Lock")
	}
	if err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(l.ttl)*time.Second)
		m.Unlock(uctx)
		cancel()
		return nil, err
	}
	return &etcdHeld{s: s, m: m, rev: uint64(resp.Kvs[0].CreateRevision)}, nil
}

func (l *etcdLocker) close() {
	if l.s != nil {
		l.s.Close()
	}
	l.cli.Close()
}

type etcdHeld struct {
	s   *concurrency.Session
	m   *concurrency.Mutex
	rev uint64
}

func (h *etcdHeld) token() uint64 { return h.rev }

func (h *etcdHeld) check() (time.Duration, bool, string) {
	select {
	case <-h.s.Done():
		return 0, true, "the session ended (its lease expired or could not be kept alive)"
	default:
		// The session gives no deadline: the holder believes now.
		return 1, false, ""
	}
}

func (h *etcdHeld) lost() <-chan struct{} { return h.s.Done() }

func (h *etcdHeld) unlock(ctx context.Context) error { return h.m.Unlock(ctx) }

// ---------------------------------------------------------------- zookeeper

type zkLocker struct {
	hosts []string
	ttl   time.Duration

	mu      sync.Mutex
	conn    *zk.Conn
	expired chan struct{} // closed when the current session expires
}

func openZKLock(cfg contender.Config) (locker, error) {
	hosts, err := hostsOf(cfg.URL)
	if err != nil {
		return nil, err
	}
	l := &zkLocker{hosts: hosts, ttl: cfg.TTL}
	if _, _, err := l.connection(); err != nil {
		return nil, err
	}
	return l, nil
}

// connection returns the contender's Conn and the channel closed when
// its session expires, connecting anew if the last was closed.
func (l *zkLocker) connection() (*zk.Conn, chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		return l.conn, l.expired, nil
	}
	expired := make(chan struct{})
	var once sync.Once
	conn, _, err := zk.Connect(l.hosts, l.ttl, zk.WithLogInfo(false), zk.WithEventCallback(func(ev zk.Event) {
		if ev.Type == zk.EventSession && ev.State == zk.StateExpired {
			once.Do(func() { close(expired) })
		}
	}))
	if err != nil {
		return nil, nil, err
	}
	l.conn, l.expired = conn, expired
	return conn, expired, nil
}

// drop closes the Conn (its session ends, and the lock nodes with it)
// and forgets it, or only forgets it when its session expired.
func (l *zkLocker) drop(conn *zk.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == conn {
		l.conn.Close()
		l.conn = nil
	}
}

func (l *zkLocker) lock(ctx context.Context, key, _ string) (held, error) {
	conn, expired, err := l.connection()
	if err != nil {
		return nil, err
	}
	select {
	case <-expired:
		// A session that expired keeps no lock: start a new one.
		l.drop(conn)
		if conn, expired, err = l.connection(); err != nil {
			return nil, err
		}
	default:
	}
	path := "/fencelock-peers/" + key
	lk := zk.NewLock(conn, path, zk.WorldACL(zk.PermAll))
	done := make(chan error, 1)
	go func() { done <- lk.Lock() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Lock takes no context: closing the Conn ends its wait (and the
		// session, with any node it made).
		l.drop(conn)
		<-done
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	czxid, err := lockNodeCzxid(conn, path)
	if err != nil {
		lk.Unlock()
		return nil, err
	}
	return &zkHeld{conn: conn, lk: lk, expired: expired, czxid: czxid}, nil
}

// lockNodeCzxid returns the creation zxid of the lowest sequence node
// under path, which zk.Lock's holder owns.
func lockNodeCzxid(conn *zk.Conn, path string) (uint64, error) {
	children, _, err := conn.Children(path)
	if err != nil {
		return 0, err
	}
	low, lowSeq := "", -1
	for _, c := range children {
		i := strings.LastIndex(c, "-")
		seq, err := strconv.Atoi(c[i+1:])
		if i < 0 || err != nil {
			continue
		}
		if lowSeq < 0 || seq < lowSeq {
			low, lowSeq = c, seq
		}
	}
	if low == "" {
		return 0, errors.New("zk: no lock node under " + path)
	}
	_, st, err := conn.Get(path + "/" + low)
	if err != nil {
		return 0, err
	}
	if st.EphemeralOwner != conn.SessionID() {
		return 0, fmt.Errorf("zk: the lowest lock node %s is owned by session %#x, not this one", low, st.EphemeralOwner)
	}
	return uint64(st.Czxid), nil
}

func (l *zkLocker) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Close()
		l.conn = nil
	}
}

type zkHeld struct {
	conn    *zk.Conn
	lk      *zk.Lock
	expired chan struct{}
	czxid   uint64
}

func (h *zkHeld) token() uint64 { return h.czxid }

func (h *zkHeld) check() (time.Duration, bool, string) {
	select {
	case <-h.expired:
		return 0, true, "the session expired"
	default:
	}
	if h.conn.State() != zk.StateHasSession {
		return 0, false, "" // disconnected: not sure, so not acting
	}
	return 1, false, ""
}

func (h *zkHeld) lost() <-chan struct{} { return h.expired }

func (h *zkHeld) unlock(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- h.lk.Unlock() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("zk: Unlock: %w", ctx.Err())
	}
}
