package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/fencelock/fencelock/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// listenPingEvery is how long the LISTEN connection may stay silent before
// it is pinged (a ping unanswered for as long again ends the session): a
// server that stopped answering, or a connection a network silently
// dropped, is noticed within twice this, the subscribers' channels are
// closed and the engine polls; otherwise the session would wait for a
// notification for as long as the kernel keeps the socket.
var listenPingEvery = 5 * time.Second

// listener owns one dedicated connection (never a pool's: LISTEN is
// session state) that LISTENs on the backend's channel and hands each
// notification's payload, a key, to the subscribers of that key. It
// connects on the first Watch. If the connection fails, every subscriber's
// channel is closed (the engine falls back to polling) and the next Watch
// connects again.
type listener struct {
	cfg *pgx.ConnConfig
	n   names

	// connecting holds a token while a connect runs: connects are
	// serialised, and one waiting for another gives up when its own
	// context ends (a mutex would hold it until the other's ended).
	connecting chan struct{}

	base     context.Context // cancelled by close: ends connects and the session
	stopBase context.CancelFunc

	mu      sync.Mutex
	closed  bool
	running bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when the running session's goroutine exits
	subs    map[string]map[*sub]struct{}
}

type sub struct {
	ch     chan struct{}
	closed bool // guarded by listener.mu
}

func newListener(cfg *pgx.ConnConfig, n names) *listener {
	// Closing or giving up on the session may simply drop the socket.
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	l := &listener{cfg: cfg, n: n, subs: make(map[string]map[*sub]struct{}), connecting: make(chan struct{}, 1)}
	l.base, l.stopBase = context.WithCancel(context.Background())
	return l
}

// Watch implements driver.Watcher: the channel receives a value whenever a
// release or force-release of key is committed, by any process using the
// same table and channel. It is closed when ctx ends or the LISTEN
// connection is lost.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	if b.lis == nil {
		return nil, driver.ErrUnsupported
	}
	return b.lis.watch(ctx, key)
}

func (l *listener) watch(ctx context.Context, key string) (<-chan struct{}, error) {
	s := &sub{ch: make(chan struct{}, 1)}
	if !l.register(key, s) {
		if err := l.connect(ctx); err != nil {
			return nil, err
		}
		if !l.register(key, s) {
			return nil, driver.ErrClosed // closed, or lost again at once
		}
	}
	context.AfterFunc(ctx, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.dropLocked(key, s)
	})
	return s.ch, nil
}

// register adds s if the session is up.
func (l *listener) register(key string, s *sub) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.running || l.closed {
		return false
	}
	m := l.subs[key]
	if m == nil {
		m = make(map[*sub]struct{})
		l.subs[key] = m
	}
	m[s] = struct{}{}
	return true
}

func (l *listener) dropLocked(key string, s *sub) {
	if s.closed {
		return
	}
	s.closed = true
	close(s.ch)
	delete(l.subs[key], s)
	if len(l.subs[key]) == 0 {
		delete(l.subs, key)
	}
}

// connect starts a session unless one is running.
func (l *listener) connect(ctx context.Context) error {
	select {
	case l.connecting <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-l.base.Done():
		return driver.ErrClosed
	}
	defer func() { <-l.connecting }()
	l.mu.Lock()
	up, closed := l.running, l.closed
	l.mu.Unlock()
	if closed {
		return driver.ErrClosed
	}
	if up {
		return nil
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(l.base, stop)()
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		if l.base.Err() != nil {
			return driver.ErrClosed
		}
		return err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+l.n.lchannel); err != nil {
		conn.Close(context.Background())
		return err
	}
	sctx, cancel := context.WithCancel(l.base)
	done := make(chan struct{})
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		cancel()
		conn.Close(context.Background())
		return driver.ErrClosed
	}
	l.running, l.cancel, l.done = true, cancel, done
	l.mu.Unlock()
	go l.run(sctx, conn, done)
	return nil
}

// run dispatches notifications until the connection fails or close.
func (l *listener) run(ctx context.Context, conn *pgx.Conn, done chan struct{}) {
	defer close(done)
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPingEvery)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
				break
			}
			// Silent for listenPingEvery: is the server still there?
			pctx, cancel := context.WithTimeout(ctx, listenPingEvery)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				break
			}
			continue
		}
		l.mu.Lock()
		for s := range l.subs[n.Payload] {
			select {
			case s.ch <- struct{}{}:
			default:
			}
		}
		l.mu.Unlock()
	}
	l.mu.Lock()
	l.running = false
	for key, m := range l.subs {
		for s := range m {
			l.dropLocked(key, s)
		}
	}
	l.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	conn.Close(cctx)
	cancel()
}

// close ends the session and waits for its goroutine.
func (l *listener) close() {
	l.stopBase()
	l.connecting <- struct{}{} // no connect in progress (stopBase ends one)
	l.mu.Lock()
	l.closed = true
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	<-l.connecting
	if cancel != nil {
		cancel()
		<-done
	}
}
